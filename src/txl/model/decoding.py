"""Incremental-decoding state: the memory's keys and values in ring buffers.

In relative attention (paper §3.3, and Shaw et al.) a key does not depend on its position: position
enters only through the score term ``(q + v)·W_kR R_{i-j}``. So the keys and values of the memory can
be projected once, kept, and reused at every later step, and a rotating (ring) buffer is exact: when
the memory is full, the newest token's key overwrites the oldest one's slot, and the position scores
are read with the rotation that gives each slot its distance to the query. With rotary positions
("rope") a key is rotated once, at its position in the text (:attr:`DecodingState.seen` counts them),
before it is kept; its score with a later query depends on the two positions' difference only, so
the kept key stays right whatever slot it sits in (:class:`~txl.model.positions.Rotary`). A decoding step then
costs O(mem_len) attention work per layer and O(1) copies, whatever the length of the text.

One protocol serves both kinds of call: the model calls :meth:`DecodingState.begin` (a one-token
step after a memory, or a segment), then each layer hands its new keys and values to
:meth:`LayerCache.update` and attends to what it returns, then the model calls
:meth:`DecodingState.commit`. The one-token step keeps its own attention arithmetic (two small
products per head, faster than the fused kernel for one query); a layer-level test holds each
sub-layer's step equal to its forward.

The state is owned by the caller and passed to :meth:`txl.model.TransformerXLLM.forward` as
``caches``; while it is in use it *is* the memory (``forward`` returns ``mems=None``; read the
hidden-state memory with :meth:`DecodingState.mems`). Nothing is kept inside the model.

With a compressive span (``span.cmem_len > 0``, Rae et al. 2019) the state holds the memory as
tensors instead (:attr:`DecodingState.held`, the layout of :mod:`txl.model.compressive`) and the model
takes its general path for every call: compressed slots change every c tokens, so the ring buffers'
exactness argument does not cover them, and correctness comes first. The results are those of the
same calls without a state.

Shapes: B = batch, H = heads, D = d_head, S = ``capacity`` slots.
"""

from __future__ import annotations

import weakref

import torch

from txl.errors import TxlError
from txl.model.inputs import padding_mask
from txl.model.segment_room import SegmentPlan, place_segment, plan_segment
from txl.runtime import available_memory_bytes, format_bytes, reads_values
from txl.model.span import AttentionSpan


class LayerCache:
    """One layer's buffers inside a :class:`DecodingState` (allocated on the first write).

    Attributes:
        state: the :class:`DecodingState` this layer belongs to (it holds the shared slot counters).
        keys, values: float [B, H, R, D] (R = ``state.room``), keys and values of the remembered
            tokens: slot s at index ``state.start + s``. R grows with the text while the memory
            fills (never far beyond what it holds), and is at least S once it is full.
        hidden: float [B, R, d_model], the layer's inputs for the same tokens (what the paper's memory
            holds, §3.2), kept so that :meth:`DecodingState.mems` can hand it back; None with
            ``keep_mems=False``.
        pos_keys: float [H, D, 2 * S] projected relative encodings (``W_kR R`` for "rel", the Shaw
            table's rows for "shaw") for distances S-1 ... 0, stored twice in a row so that the
            rotated order of any step is one contiguous slice (see :meth:`DecodingState.pos_offset`);
            while the memory fills, [H, D, P] for distances P-1 ... 0 (P = ``state.pos_period`` < S).
        query_biases: float [2, H, D], u and v ("rel") times the score scale, computed with
            ``pos_keys`` on the first step (like them, read from the parameters once per state).
        segment_pos_keys: float [H, D, K + 1] ``W_kR R`` of the last multi-token call (with the
            leading column of :func:`~txl.model.attention.padded_position_keys`), reused while the
            key length K stays the same (``DecodingState.segment_klen``), as it does segment after
            segment once the memory is full.
    """

    own = None  # (a ring's layer hands the token's own key and value here; this cache writes them first)
    columns = None  # (a ring's layer reads its table at these columns; this cache slices its doubled one)

    def __init__(self, state: "DecodingState") -> None:
        self.state = state
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None
        self.pos_keys: torch.Tensor | None = None
        self.query_biases: torch.Tensor | None = None
        self.segment_pos_keys: torch.Tensor | None = None  # [H, D, K + 1] of the last multi-token call ("rel")

    def update(self, keys: torch.Tensor, values: torch.Tensor,
               hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the keys and values of the tokens this call adds; return what the call attends to.

        The one per-layer call of the protocol, between :meth:`DecodingState.begin` and
        :meth:`DecodingState.commit`, for both kinds of call:

        - a one-token step after the memory: the token's key and value [B, H, 1, D] (and input
          [B, 1, d]) go to slot ``next_slot``; returned are the filled slots [B, H, min(length + 1, S), D]
          in slot order, views of the buffers (no copy; the step reads its position table rotated to
          match, :meth:`DecodingState.pos_offset`);
        - a multi-token call: keys and values [B, H, T, D] of its tokens (for a state's first call,
          those of [starting memory + call]); returned are [memory + call] [B, H, M + T, D] in time
          order, views of the buffers where the plan allows (CPU, room after the memory), else
          concatenated; either way the last S are kept.

        Args:
            keys, values: float [B, H, n, D] in the state's dtype.
            hidden: float [B, n, d_model], the layer's inputs for the same tokens (kept for
                :meth:`DecodingState.mems`), or None.

        Returns:
            ``(keys, values)`` [B, H, K, D] each: what the call's queries attend to.
        """
        state = self.state
        if state._plan is _STEP:
            state._write(self, keys, values, hidden)
            n = min(state.length + 1, state.capacity)
            return self.keys.narrow(2, state.start, n), self.values.narrow(2, state.start, n)
        if state.length == 0:  # the first call: its keys already cover a starting memory
            state._store(self, keys, values, hidden)
            return keys, values
        viewed = state._segment_keys(self, keys, values, hidden)  # [memory + call] as views of the buffers
        if viewed is not None:
            return viewed
        m = state.memory_length
        keys = torch.cat([state.ordered(self.keys, m, 2), keys], dim=2)
        values = torch.cat([state.ordered(self.values, m, 2), values], dim=2)
        if self.hidden is not None:
            hidden = torch.cat([state.ordered(self.hidden, m, 1), hidden], dim=1)
        state._store(self, keys, values, hidden if self.hidden is not None else None)
        return keys, values


class DecodingState:
    """Caller-owned decoding state of a Transformer-XL model: the memory as ring buffers of keys/values.

    ``capacity`` S is the number of keys a one-token step attends to once the memory is full:
    ``mem_len + 1`` (the memory and the token itself), or ``mem_len`` with ``same_length`` (each query
    then sees exactly the last ``mem_len`` keys including itself). A slot holds one token's key, value
    and layer input; ``next_slot`` is the slot the next token is written to, ``length`` the number of
    filled slots. While ``length < S`` the slots are in time order from slot 0; once full they rotate.
    Slot s is buffer position ``start + s``.

    Multi-token calls after a memory on a CPU (evaluation, prompts) read the memory and the new keys
    as one view of the buffer, without concatenating them: the buffers keep spare room after the
    slots, and the slots move forward instead of being copied (:mod:`txl.model.segment_room`).

    Buffers and position tables are sized by the text, not by ``mem_len``: while the memory fills
    (the slots then start at buffer position 0) they are reallocated at twice the size a call needs
    when it needs more than they hold (:meth:`grown`: O(log n) reallocations for n tokens). A
    ``mem_len`` far beyond the text (say 1,000,000 on a page) costs what the text needs; only a
    memory that has filled takes ``mem_len`` slots. Growth that the available memory cannot hold
    is refused before anything changes (the state still serves later calls).

    A state serves one model, one batch size and one dtype (the keys' dtype: the parameters', or
    the autocast dtype), those of its first call that passes its checks; a call that fails inside
    the layers leaves it unusable (:attr:`failed`), since some layers may have moved their buffers
    and others not. Buffers that the available memory cannot hold are refused before they are made.

    Args:
        n_layer: the model's number of layers.
        span: the :class:`~txl.model.AttentionSpan` every call with this state must use (its
            ``mem_len``, ``clamp_len`` and ``same_length``).
        keep_mems: keep each layer's inputs too, for :meth:`mems` (one [B, d_model] write per layer
            and token). False saves that memory when the caller never reads the memory back.
        stacked: every layer's keys and values in one tensor :attr:`stack` [2, L, B, H, S, D] of the
            full capacity from the first call on, slot 0 at position 0 (no growth, no spare room): the
            layout a compiled step reads whole (:class:`~txl.model.ring.RingDecoder`). Needs
            ``keep_mems=False``.

    Raises:
        TxlError: ``span`` is not an AttentionSpan, ``n_layer < 1``, or ``stacked`` with ``keep_mems``.

    Source: paper §3.2 (memory), §3.3 (relative scores: keys independent of position).
    """

    def __init__(self, n_layer: int, span: AttentionSpan, keep_mems: bool = True, stacked: bool = False) -> None:
        if not isinstance(span, AttentionSpan):
            raise TxlError(f"span must be an AttentionSpan, got {type(span).__name__}")
        if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer < 1:
            raise TxlError(f"n_layer must be an integer >= 1, got {n_layer!r}")
        if stacked and keep_mems:
            raise TxlError("a stacked decoding state keeps no hidden-state memory: pass keep_mems=False")
        self.span = span
        self.keep_mems = keep_mems
        self.stacked = stacked
        self.stack: torch.Tensor | None = None  # stacked: keys and values of every layer [2, L, B, H, S, D]
        self.capacity = span.mem_len + (0 if span.same_length and span.mem_len > 0 else 1)
        self.length = 0
        self.seen = 0  # keys taken in since the start: the text position of the next new key ("rope")
        self.next_slot = 0
        self.start = 0  # buffer position of slot 0
        self.room = 0  # buffer positions per layer (grows with the text; see grown and _begin_segment)
        self.pos_period = 0  # distances the one-token steps' position tables cover (S once doubled)
        self._plan: SegmentPlan | object | None = None  # the call in progress (begin): a segment's plan, or _STEP
        self.batch_size: int | None = None
        self.pos_emb: torch.Tensor | None = None  # the scheme's step table: "rel" R [P, d_model]; "rope" θ [D/2]
        self.segment_klen = -1  # key length whose projected positions the layers hold (multi-token calls)
        self.dtype: torch.dtype | None = None  # the keys' dtype, bound by the first call
        self.failed = False  # a call failed inside the layers: the buffers may be half updated
        self.owner: weakref.ref | None = None  # the model whose keys the buffers hold (its first call's)
        self.layers = [LayerCache(self) for _ in range(n_layer)]
        self.held: list[torch.Tensor] | None = None  # compressive spans: the memory itself (see the module)
        self.device: torch.device | None = None  # the buffers' device (set by begin); None: the host's memory

    @property
    def compressive(self) -> bool:
        """Whether the span has a compressed memory (the state then holds the memory in :attr:`held`)."""
        return self.span.cmem_len > 0

    def hold(self, mems: list[torch.Tensor], qlen: int) -> None:
        """Compressive spans: keep ``mems`` (``3 * n_layer`` tensors) as the memory after ``qlen`` more tokens."""
        self.held = mems
        self.length = min(self.length + qlen, self.capacity)
        self.next_slot = self.length % self.capacity

    def bind_batch(self, batch_size: int) -> None:
        """Check the batch size, then record it (compressive spans; see :meth:`check_call`).

        Raises:
            TxlError: a batch of another size than the one the state holds.
        """
        self.check_call(batch_size, self.dtype)
        self.batch_size = batch_size

    def check_call(self, batch_size: int, dtype: torch.dtype | None) -> None:
        """Refuse a call whose batch size or key dtype differs from the ones this state holds (a state
        is bound by its first call that runs, see :meth:`bind`).

        Raises:
            TxlError: another batch size, or another dtype (e.g. with autocast after a call without it).
        """
        if self.batch_size not in (None, batch_size):
            raise TxlError(f"the decoding state holds {self.batch_size} rows but input_ids has {batch_size}; "
                           "make a new DecodingState for another batch")
        if self.dtype not in (None, dtype):
            raise TxlError(f"the decoding state holds {self.dtype} keys but this call computes in {dtype}; use the "
                           "same dtype (autocast or not) for every call with one state, or make a new DecodingState")

    def bind(self, batch_size: int, dtype: torch.dtype) -> None:
        """Record the batch size and the keys' dtype, once the call has passed every check."""
        self.batch_size, self.dtype = batch_size, dtype

    def check_usable(self) -> None:
        """Raises TxlError when an earlier call failed inside the layers (see :attr:`failed`)."""
        if self.failed:
            raise TxlError("this decoding state was left half updated by a call that failed; make a new "
                           "DecodingState (and read the text again)")

    @property
    def memory_length(self) -> int:
        """Tokens of memory a segment fed now attends to: ``min(length, mem_len)``."""
        return min(self.length, self.span.mem_len)

    def pos_offset(self, klen: int) -> int:
        """First column of ``pos_keys`` for a one-token step over ``klen`` slots (slots 0 .. klen-1).

        The query is written to slot ``w = next_slot``; slot ``s`` then holds distance
        ``(w - s) mod S``. The tables hold distances P-1 ... 0 (P = ``pos_period``; twice in a row
        once P = S), so that distance's column is ``s + P - 1 - w`` (while the memory fills,
        ``w = length`` and the columns of this step end at P).
        """
        return self.pos_period - 1 - self.next_slot

    def grown(self, n: int, bytes_per_position: int = 0, what: str = "its keys and values") -> int:
        """Positions to make room for when ``n`` are needed while the memory fills: twice as many (at
        least 16, at most the capacity S: O(log n) reallocations for n tokens), or as many as the
        available memory holds when that is less, if at least ``n``. A stacked state takes the capacity
        S at once, or nothing.

        Raises:
            TxlError: not even ``n`` positions of ``bytes_per_position`` bytes fit.
        """
        want = self.capacity if self.stacked else min(self.capacity, max(16, 2 * n))
        have = available_memory_bytes(self.device) if bytes_per_position else 0
        if bytes_per_position and want * bytes_per_position > have:
            self.check_fits((want if self.stacked else n) * bytes_per_position, what)  # (stacked: all or nothing)
            return max(n, have // bytes_per_position)  # (less than want here)
        return want

    def begin(self, qlen: int, klen: int, device: torch.device, bytes_per_position: int,
              table_bytes_per_position: int = 0) -> int | None:
        """Start a call of ``qlen`` tokens over ``klen`` keys (memory included), once nothing but the
        memory it needs can reject it, just before the layers run; then each layer's
        :meth:`LayerCache.update`, then :meth:`commit`.

        A one-token call after a memory is a ring-buffer step (:meth:`_prepare_step`); any other
        call is a segment (:meth:`_begin_segment`).

        Args:
            bytes_per_position: bytes of one buffer position over all layers (keys, values, inputs).
            table_bytes_per_position: bytes of one distance of a step's position tables, all layers.

        Returns:
            For a step whose position tables must grow, their new period P (the caller builds
            ``pos_emb`` for it); else None.

        Raises:
            TxlError: buffers or tables that do not fit in the available memory (nothing changed then).
        """
        self.device = device  # where the buffers live: their room is that device's free memory
        if qlen == 1 and self.length > 0:
            period = self._prepare_step(bytes_per_position, table_bytes_per_position)
            self._plan = _STEP
            return period
        self._begin_segment(qlen, klen, device, bytes_per_position)
        return None

    def commit(self, klen: int) -> None:
        """End the call :meth:`begin` started, after every layer's :meth:`LayerCache.update` (layers
        read the old contents first, so the counters move only now). ``klen``: its key length."""
        if self._plan is _STEP:
            self._plan = None
            self.seen += 1
            self._advance()
        else:
            self.seen += klen - self.memory_length  # (a first call's keys include its starting memory)
            self._advance_to(klen)

    def _prepare_step(self, bytes_per_position: int, table_bytes_per_position: int) -> int | None:
        """Before a one-token step: make the buffers and position tables cover it, or refuse it with
        nothing changed.

        While the memory fills the next slot may lie past the buffers' end: every layer's buffers
        are then reallocated (:meth:`grown`, slots copied to position 0), and the position tables
        must cover one more distance than they may hold: their period P grows likewise (doubled
        once P = S, as the ring may rotate from then on), and every layer's ``pos_keys`` is dropped
        to be projected again.

        Args:
            bytes_per_position: bytes of one buffer position over all layers (keys, values, inputs).
            table_bytes_per_position: bytes of one distance of the position tables over all layers.

        Returns:
            The new period P (the caller builds ``pos_emb`` for it), or None when the tables cover
            the step already.

        Raises:
            TxlError: buffers or tables that do not fit in the available memory (nothing changed).
        """
        klen = min(self.length + 1, self.capacity)
        room = self.room
        if self.length < self.capacity and self.start + self.length >= self.room:
            room = self.grown(self.length + 1, bytes_per_position)
        period = None
        if self.pos_period < klen:
            period = self.grown(klen, table_bytes_per_position, "the position tables of one-token steps")
            copies = 2 if period == self.capacity else 1
            new_buffers = room * bytes_per_position if room > self.room else 0  # (existing ones are not new)
            self.check_fits(new_buffers + period * copies * table_bytes_per_position,
                            "its keys, values and position tables" if new_buffers else "its position tables")
            self.pos_period, self.pos_emb = period, None
            for cache in self.layers:
                cache.pos_keys = None
        if room > self.room:
            self._reallocate(room, self.length)
        return period

    def _reallocate(self, room: int, n: int) -> None:
        """Every layer's buffers at ``room`` positions, with slots 0 .. n-1 copied to positions 0 .. n-1."""
        try:
            for cache in self.layers:
                for name in ("keys", "values", "hidden"):
                    buffer, dim = getattr(cache, name), 1 if name == "hidden" else 2
                    if buffer is not None:
                        shape = list(buffer.shape)
                        shape[dim] = room
                        grown = buffer.new_empty(shape)
                        grown.narrow(dim, 0, n).copy_(buffer.narrow(dim, self.start, n))
                        setattr(cache, name, grown)
        except BaseException:
            self.failed = True  # some layers were reallocated, others not
            raise
        self.room, self.start = room, 0

    def ordered(self, buffer: torch.Tensor, n: int, dim: int) -> torch.Tensor:
        """The last ``n`` filled slots of ``buffer`` along ``dim``, oldest first (a copy when rotated)."""
        if self.length < self.capacity or self.next_slot == 0:  # time order from slot 0
            return buffer.narrow(dim, self.start + self.length - n, n)
        slots = buffer.narrow(dim, self.start, self.capacity)
        index = torch.arange(self.next_slot - n, self.next_slot, device=buffer.device) % self.capacity
        return slots.index_select(dim, index)

    def _store(self, cache: LayerCache, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Keep the last ``S`` of a segment's keys/values [B, H, K, D] and inputs [B, K, d] in slots
        0 ... in time order (a call with no memory yet, or one too long for the spare room).

        The counters move in :meth:`commit` once every layer has stored (layers read the old
        contents first).
        """
        n = min(keys.size(2), self.capacity)
        if cache.keys is None or cache.keys.size(2) < self._plan.room:  # old contents were read already
            self._allocate(cache, keys, hidden, self._plan.room)
        at = self._plan.start_after  # where slot 0 is after this call
        cache.keys[:, :, at:at + n].copy_(keys[:, :, -n:])
        cache.values[:, :, at:at + n].copy_(values[:, :, -n:])
        if cache.hidden is not None and hidden is not None:
            cache.hidden[:, at:at + n].copy_(hidden[:, -n:])

    def _begin_segment(self, qlen: int, klen: int, device: torch.device, bytes_per_position: int) -> None:
        """Plan a multi-token call of ``qlen`` tokens over ``klen`` keys (:func:`~txl.model.segment_room.plan_segment`).

        Raises:
            TxlError: buffers that do not fit in the available memory (nothing changed then).
        """
        self._plan = plan_segment(self, qlen, klen, device, bytes_per_position, lambda: available_memory_bytes(device))

    def _segment_keys(self, cache: LayerCache, keys: torch.Tensor, values: torch.Tensor,
                      hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """[memory + this call] as views of ``cache``'s buffers, or None to concatenate
        (:func:`~txl.model.segment_room.place_segment`)."""
        return place_segment(self, self._plan, cache, keys, values, hidden)

    def _write(self, cache: LayerCache, key: torch.Tensor, value: torch.Tensor, hidden: torch.Tensor) -> None:
        """Write one token's key/value [B, H, 1, D] and input [B, 1, d] into slot ``next_slot``."""
        w = self.start + self.next_slot
        cache.keys[:, :, w:w + 1].copy_(key)
        cache.values[:, :, w:w + 1].copy_(value)
        if cache.hidden is not None:
            cache.hidden[:, w:w + 1].copy_(hidden)

    def _advance_to(self, filled: int) -> None:
        """After a multi-token segment: ``filled`` slots hold the newest tokens in time order."""
        if self._plan is not None:
            self.room, self.start = self._plan.room, self._plan.start_after
            self._plan = None
        self.length = min(filled, self.capacity)
        self.next_slot = self.length % self.capacity

    def _advance(self) -> None:
        """After a one-token step: the token written to ``next_slot`` is now the newest."""
        self.length = min(self.length + 1, self.capacity)
        self.next_slot = (self.next_slot + 1) % self.capacity

    def mems(self) -> list[torch.Tensor] | None:
        """The hidden-state memory (paper §3.2): ``n_layer`` tensors [B, min(length, mem_len), d_model],
        oldest first, as :meth:`~txl.model.TransformerXLLM.forward` would have returned it (copies:
        later calls do not change them); None for an empty state. A compressive state returns its
        :attr:`held` memory (``3 * n_layer`` tensors), whatever ``keep_mems`` says.

        Raises:
            TxlError: the state was made with ``keep_mems=False``.
        """
        if self.compressive:
            return self.held
        if not self.keep_mems:
            raise TxlError("this decoding state was made with keep_mems=False: it holds no hidden-state memory")
        if self.length == 0:
            return None
        n = self.memory_length
        return [self.ordered(c.hidden, n, 1).clone(memory_format=torch.contiguous_format) for c in self.layers]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows: row ``b`` of the new state is row ``index[b]`` of the old (beam search).

        Args:
            index: int64 [B'] row indices (may repeat rows; B' may differ from B).

        Raises:
            TxlError: ``index`` that is not a 1-D integer tensor of row numbers in ``[0, B)``.
        """
        rows = self.batch_size
        if (not isinstance(index, torch.Tensor) or index.dim() != 1 or index.is_floating_point()
                or index.dtype == torch.bool or index.numel() == 0):
            raise TxlError("reorder needs a non-empty 1-D integer tensor of row numbers")
        if rows is not None and reads_values(index) and (int(index.min()) < 0 or int(index.max()) >= rows):
            raise TxlError(f"reorder row numbers must be in [0, {rows}), got {index.tolist()}")
        if rows is not None and index.numel() > rows:  # more rows than now (beams from one prompt): checked
            tensors = [b for c in self.layers for b in (c.keys, c.values, c.hidden) if b is not None] + (self.held or [])
            self.check_fits(sum(t[:1].numel() * t.element_size() for t in tensors) * index.numel(),
                            f"the {index.numel():,} rows it is reordered into")
        if self.stack is not None:
            self.stack = self.stack.index_select(2, index.to(self.stack.device))
            self._view_stack()
        for cache in self.layers:
            for name in ("keys", "values", "hidden"):
                buffer = getattr(cache, name)
                if buffer is not None and self.stack is None:
                    setattr(cache, name, buffer.index_select(0, index.to(buffer.device)).contiguous())
        if self.held is not None:
            self.held = [m.index_select(0, index.to(m.device)).contiguous() for m in self.held]
        if self.batch_size is not None:
            self.batch_size = int(index.numel())

    def _allocate(self, cache: LayerCache, like: torch.Tensor, hidden: torch.Tensor | None, room: int) -> None:
        bsz, heads, _, d_head = like.shape
        if self.stacked:  # (a stacked state allocates once, the capacity, on its first layer's first store)
            if self.stack is None:
                self.stack = like.new_zeros(2, len(self.layers), bsz, heads, room, d_head)
                self._view_stack()
            return
        cache.keys = like.new_zeros(bsz, heads, room, d_head)
        cache.values = like.new_zeros(bsz, heads, room, d_head)
        if self.keep_mems and hidden is not None:
            cache.hidden = hidden.new_zeros(bsz, room, hidden.size(-1))

    def _view_stack(self) -> None:
        """Point every layer's keys and values at its part of :attr:`stack`."""
        for i, cache in enumerate(self.layers):
            cache.keys, cache.values = self.stack[0, i], self.stack[1, i]

    def check_fits(self, need: int, what: str) -> None:
        """Refuse buffers of ``need`` bytes that the available memory of the buffers' device cannot hold (a
        GPU's free memory, or the host's; a clear error instead of an allocator traceback or the process
        being killed).

        Raises:
            TxlError: ``need`` above the available memory.
        """
        have = available_memory_bytes(self.device)
        if need > have:
            raise TxlError(f"a decoding state with mem_len {self.span.mem_len:,} needs {format_bytes(need)} for {what}, more "
                           f"than the {format_bytes(have)} of memory available: use a smaller mem_len (or a shorter text, "
                           "a smaller batch, fewer beams)")


def slot_padding_mask(state: DecodingState, mem_padding: torch.Tensor, batch: int) -> torch.Tensor:
    """bool [B, 1, 1, K] over the ring-buffer slots a one-token step attends to: True where a slot
    holds one of the first ``mem_padding[b]`` (oldest) tokens of row b's memory.

    Before the step the state remembers L tokens, M = ``memory_length`` of them form the memory,
    and the new token goes to slot ``w = next_slot``. While the buffer is not full the slots are in
    time order (slot s is memory position s); once full, slot s holds the token (s - w) mod S from
    the oldest, the oldest L - M of which are overwritten or beyond the memory.
    """
    S, L, w = state.capacity, state.length, state.next_slot
    mlen = state.memory_length
    padding_mask(mem_padding, batch, mlen, mlen)  # the checks
    klen = min(L + 1, S)
    slots = torch.arange(klen, device=mem_padding.device)
    rank = slots if L < S else (slots - w) % S - (L - mlen)  # memory position of each slot
    masked = (rank[None, :] < mem_padding[:, None]) & (slots != w)[None, :]
    return masked[:, None, None, :]


_STEP = object()  # DecodingState._plan during a one-token step (see DecodingState.begin)
