"""Where a multi-token call after the memory puts its keys: the spare room after a decoding state's slots.

On a CPU, a segment read after the memory (evaluation, prompts) attends to [memory + segment] as one
view of each layer's buffers instead of a concatenation: once the memory is full the buffers hold
``room`` - S spare positions after the S slots, the segment's keys are written right after the
memory, and the slots move forward (``start`` grows) instead of being copied. Only when the spare
room is used up is the memory moved back to position 0: one copy every ``(room - S) / T`` calls of
T tokens or so. :func:`plan_segment` decides where a call goes (before the layers run), and
:func:`place_segment` puts one layer's keys there. The state that owns the buffers is a
:class:`~txl.model.decoding.DecodingState`; its counters move only when the call commits.

Shapes: B = batch, H = heads, D = d_head, T = the call's tokens, M = the memory's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class SegmentPlan:
    """Where a multi-token call after the memory keeps its keys (see :func:`plan_segment`).

    in_place: the memory and new keys are one view of the buffers (else concatenated, then stored).
    room: buffer positions per layer during and after the call.
    relocate: each layer first moves its memory, in time order, to position 0 (growing its buffers
        to ``room`` if needed): the ring had rotated, the buffers grow, or the spare room is used up.
    rotated: the ring had rotated (one-token steps): the memory is gathered in time order first.
    first: buffer position of the memory's oldest token during the call.
    start_after: buffer position of slot 0 after the call.
    """

    in_place: bool
    room: int
    relocate: bool
    rotated: bool
    first: int
    start_after: int


def plan_segment(state, qlen: int, klen: int, device: torch.device, bytes_per_position: int,
                 available: Callable[[], int]) -> SegmentPlan:
    """The plan of a call of ``qlen`` tokens over ``klen`` keys (memory included) with ``state``.

    On a CPU, after a memory, when the memory and the new tokens fit in ``room`` (grown, when a
    call needs it, to ``S + min(S, max(S // 8, 2 * qlen))`` positions once the memory is full, at
    most 2S, where that leaves half the ``available()`` bytes; while it fills, to twice what the
    call needs when it needs more than the buffers hold), the call is in place: each layer's keys
    go after its memory and [memory + call] is one view. Otherwise (the first call, and on other
    devices, whose attention kernels are not relied on with such views) the layers concatenate and
    store the last S.

    Args:
        state: the :class:`~txl.model.decoding.DecodingState` (read only; its ``grown`` checks growth).
        bytes_per_position: bytes of one buffer position over all layers (keys, values, inputs).
        available: the available memory in bytes, asked only when spare room would be added.

    Raises:
        TxlError: buffers that do not fit in the available memory (from ``state.grown``).
    """
    S, m = state.capacity, state.memory_length
    need = m + qlen  # positions of [memory, this call]
    room = state.room
    in_place = device.type == "cpu" and not state.stacked  # (a stacked state keeps no spare room)
    if state.length > 0 and in_place:
        full = S + min(S, max(S // 8, 2 * qlen))
        if need >= S and room < full:  # full after this call: spare room for the calls to come
            # spare room only where it leaves half the available memory
            room = full if (full - room) * bytes_per_position <= available() // 2 else room
        elif room < need < S:  # while the memory fills
            room = state.grown(need, bytes_per_position)
    if state.length == 0 or need > room or not in_place:
        n = min(klen, S)
        room = state.room if n <= state.room else state.grown(n, bytes_per_position)
        return SegmentPlan(in_place=False, room=room, relocate=False, rotated=False, first=0, start_after=0)
    rotated = state.length == S and state.next_slot != 0
    end = state.start + state.length  # buffer position after the newest token, in time order
    relocate = rotated or room != state.room or end + qlen > room
    first = 0 if relocate else end - m  # buffer position of the memory's oldest token during the call
    filled = min(m + qlen, S)
    return SegmentPlan(in_place=True, room=room, relocate=relocate, rotated=rotated, first=first,
                       start_after=first + m + qlen - filled if filled == S else first)


def place_segment(state, plan: SegmentPlan | None, cache, keys: torch.Tensor, values: torch.Tensor,
                  hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Keys and values [B, H, M + T, D] of [memory + this call] as views of ``cache``'s buffers, with
    this call's keys/values [B, H, T, D] (and inputs [B, T, d]) written after the memory (moved
    first, when the plan says so); None when ``plan`` says to concatenate instead.

    Args:
        state: the :class:`~txl.model.decoding.DecodingState` (its counters still those before the call).
        plan: from :func:`plan_segment`. cache: the layer's :class:`~txl.model.decoding.LayerCache`.
    """
    m, qlen = state.memory_length, keys.size(2)
    if plan is None or not plan.in_place:
        return None
    names = ("keys", "values") + (("hidden",) if cache.hidden is not None else ())
    for name, new in zip(names, (keys, values, hidden)):
        dim = 1 if name == "hidden" else 2
        buffer = getattr(cache, name)
        if plan.relocate:
            memory = state.ordered(buffer, m, dim)  # a copy when rotated, else a view of the buffer
            if buffer.size(dim) != plan.room:
                shape = list(buffer.shape)
                shape[dim] = plan.room
                buffer = buffer.new_empty(shape)
                setattr(cache, name, buffer)
                buffer.narrow(dim, 0, m).copy_(memory)
            elif plan.rotated:
                buffer.narrow(dim, 0, m).copy_(memory)
            else:
                move_to_front(buffer, dim, state.start + state.length - m, m)
        buffer.narrow(dim, plan.first + m, qlen).copy_(new)
    span = m + qlen
    return cache.keys.narrow(2, plan.first, span), cache.values.narrow(2, plan.first, span)


def move_to_front(buffer: torch.Tensor, dim: int, source: int, n: int) -> None:
    """Copy ``n`` entries of ``buffer`` along ``dim`` from ``source`` to 0. Overlapping ranges move in
    chunks of ``source`` entries, front to back, so that no chunk's source and destination overlap
    (a clone of the whole range when that would take more than 16 chunks)."""
    if source == 0:
        return
    if source >= n:
        buffer.narrow(dim, 0, n).copy_(buffer.narrow(dim, source, n))
    elif source * 16 < n:
        buffer.narrow(dim, 0, n).copy_(buffer.narrow(dim, source, n).clone())
    else:
        for at in range(0, n, source):
            width = min(source, n - at)
            buffer.narrow(dim, at, width).copy_(buffer.narrow(dim, source + at, width))
