"""The decoding cache: the memory's keys and values in one ring of fixed capacity (paper §3.2, §3.3).

A relative-attention key carries no position (§3.3: positions enter the score only through
``W_kR R_{i-j}``), so the memory's keys and values are projected once and kept. A ring of S slots is
then exact: the newest token overwrites the oldest slot, and the step reads its table of distances
rotated to each slot's distance. A rotary key ("rope") is rotated once, at its position in the text
(:attr:`DecodingState.seen`), before it is kept: its score with a query depends on the difference of
their positions only, so no key is rotated again, whatever slot order the ring has reached. A step
costs O(mem_len) attention work per layer.

One protocol for every call: :meth:`DecodingState.begin`, each layer's :meth:`LayerCache.update`,
:meth:`DecodingState.commit`. The state is the caller's and, while in use, *is* the memory
(``forward`` returns ``mems=None``; :meth:`DecodingState.mems` reads it back). Its buffers, the
spare room of segment views on a CPU, and a compressed memory held as tensors: docs/model.md, "The
decoding cache".

Shapes: L = layers, B = batch, H = heads, D = d_head, S = ``capacity`` slots, R = buffer positions.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from txl.errors import TxlError
from txl.model.checks import padding_mask
from txl.config import AttentionSpan, check_count
from txl.runtime import format_bytes, out_of_memory, reads_values


class LayerCache:
    """One layer's part of a :class:`DecodingState` (views of its buffers, set on the first call).

    Attributes:
        state: the :class:`DecodingState` this layer belongs to (it holds the shared slot counters).
        keys, values: float [B, H, R, D], views of ``state.stack``: slot s at buffer position
            ``state.start + s``.
        hidden: float [B, R, d_model], the layer's inputs for the same tokens (what the paper's memory
            holds, §3.2), for :meth:`DecodingState.mems`, in the inputs' dtype (allocated on the first
            write); None with ``keep_mems=False``.
        pos_keys: float [H, D, 2S] projected relative encodings (``W_kR R`` for "rel", the Shaw table's
            rows for "shaw") for distances S-1 ... 0 twice in a row (:meth:`DecodingState.pos_offset`);
            made on the first step.
        query_biases: float [2, H, D], u and v ("rel") times the score scale, made with ``pos_keys``.
        segment_pos_keys: float [H, D, K + 1] ``W_kR R`` of the last multi-token call, with a zero
            column for distance K in front (:func:`~txl.model.attention.biased_attention`'s layout),
            reused while the key length K stays the same (``DecodingState.segment_klen``), as it does
            segment after segment once the memory is full.
    """

    own = None  # (a graph's view: the token's own key and value, scored beside the slots; else written first)
    columns = None  # (a graph's view reads its table at these columns; a state's layer slices its doubled one)

    def __init__(self, state: "DecodingState | None") -> None:
        self.state = state
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None
        self.pos_keys: torch.Tensor | None = None
        self.query_biases: torch.Tensor | None = None
        self.segment_pos_keys: torch.Tensor | None = None

    @classmethod
    def graph_view(cls, keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
                   columns: torch.Tensor) -> "LayerCache":
        """A layer's ring as a graph of fixed shape reads it (:class:`~txl.model.graphs.RingStep`): the slots
        ``keys``, ``values`` [B, H, S, D], which the step only reads (:meth:`update` keeps the new token's key
        and value as ``own``, scored beside them; the caller writes them to their slot), and each slot's
        position key read from ``table`` [H, D, S] of distances S-1 ... 0 at ``columns`` (int64 [S + 1]: the
        slots', then the own key's). No state: u and v are scaled in the graph at every step."""
        cache = cls(None)
        cache.keys, cache.values, cache.pos_keys, cache.columns = keys, values, table, columns
        return cache

    def update(self, keys: torch.Tensor, values: torch.Tensor,
               hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the keys and values of the tokens this call adds; return what the call attends to.

        - a one-token step after the memory: the token's key and value [B, H, 1, D] (and input
          [B, 1, d]) go to slot ``next_slot``; returned are the filled slots [B, H, min(length + 1, S), D]
          in slot order, views of the buffers (the step reads its position table rotated to match,
          :meth:`DecodingState.pos_offset`);
        - a multi-token call: keys and values [B, H, T, D] of its tokens (for a state's first call,
          those of [starting memory + call]); returned are [memory + call] [B, H, M + T, D] in time
          order, views of the buffers where the plan allows, else concatenated; the last S are kept;
        - a graph's view (:meth:`graph_view`): the token's key and value are kept as ``own``; returned
          are the slots, unchanged.

        Args:
            keys, values: float [B, H, n, D] in the state's dtype.
            hidden: float [B, n, d_model], the layer's inputs for the same tokens, or None.

        Returns:
            ``(keys, values)`` [B, H, K, D] each: what the call's queries attend to.
        """
        if self.columns is not None:  # a graph's view: nothing is written here
            self.own = keys, values
            return self.keys, self.values
        state, plan = self.state, self.state._plan
        if state.keep_mems and self.hidden is None and hidden is not None:  # the inputs' own dtype (autocast's)
            self.hidden = hidden.new_empty(hidden.size(0), self.keys.size(2), hidden.size(-1))
        if plan is _STEP:
            at = state.start + state.next_slot
            for buffer, new, dim in ((self.keys, keys, 2), (self.values, values, 2), (self.hidden, hidden, 1)):
                if buffer is not None:
                    buffer.narrow(dim, at, 1).copy_(new)
            n = min(state.length + 1, state.capacity)
            return self.keys.narrow(2, state.start, n), self.values.narrow(2, state.start, n)
        m = state.memory_length
        if plan.in_place:
            self._place(plan, keys, values, hidden)
            return self.keys.narrow(2, plan.first, m + keys.size(2)), self.values.narrow(2, plan.first, m + keys.size(2))
        attended = []
        for buffer, new, dim in ((self.keys, keys, 2), (self.values, values, 2), (self.hidden, hidden, 1)):
            if buffer is not None:
                if state.length > 0:  # [memory + call], then the last S are kept
                    new = torch.cat([state.ordered(buffer, m, dim), new], dim=dim)
                n = min(new.size(dim), state.capacity)
                buffer.narrow(dim, 0, n).copy_(new.narrow(dim, new.size(dim) - n, n))
            attended.append(new)
        return attended[0], attended[1]

    def _place(self, plan: "SegmentPlan", keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor) -> None:
        """Write a call's keys/values [B, H, T, D] (and inputs [B, T, d]) right after the memory, moving
        the memory to position 0 first when the plan says so."""
        state, m, qlen = self.state, self.state.memory_length, keys.size(2)
        for buffer, new, dim in ((self.keys, keys, 2), (self.values, values, 2), (self.hidden, hidden, 1)):
            if buffer is None:
                continue
            if plan.rotated:
                buffer.narrow(dim, 0, m).copy_(state.ordered(buffer, m, dim))  # (a gathered copy)
            elif plan.relocate:
                move_to_front(buffer, dim, state.start + state.length - m, m)
            buffer.narrow(dim, plan.first + m, qlen).copy_(new)


@dataclass(frozen=True)
class SegmentPlan:
    """Where a multi-token call keeps its keys (:meth:`DecodingState.begin`).

    in_place: [memory + call] is one view of the buffers (else concatenated, the last S stored from 0).
    relocate: the memory first moves, in time order, to position 0 (the spare room is used up).
    rotated: the ring had rotated (one-token steps): the memory is gathered in time order first.
    first: buffer position of the memory's oldest token during the call.
    start_after: buffer position of slot 0 after the call.
    """

    in_place: bool
    relocate: bool = False
    rotated: bool = False
    first: int = 0
    start_after: int = 0


class DecodingState:
    """Caller-owned decoding cache of a Transformer-XL model: the memory as a ring of keys and values.

    ``capacity`` S is the number of keys a one-token step attends to once the memory is full:
    ``mem_len + 1`` (the memory and the token itself), or ``mem_len`` with ``same_length`` (each query
    then sees exactly the last ``mem_len`` keys including itself); at most ``max_tokens``. A slot holds
    one token's key, value and layer input; ``next_slot`` is the slot the next token is written to,
    ``length`` the number of filled slots. While ``length < S`` the slots are in time order from slot
    0; once full they rotate. Slot s is buffer position ``start + s``.

    A state serves one model, one batch size and one dtype (the keys' dtype: the parameters', or the
    autocast dtype), those of its first call that passes its checks; its buffers are allocated then,
    once, at their full size (:meth:`nbytes`). A call that fails inside the layers leaves it unusable
    (:attr:`failed`), since some layers may have written their buffers and others not.

    Args:
        n_layer: the model's number of layers.
        span: the :class:`~txl.model.AttentionSpan` every call with this state must use.
        keep_mems: keep each layer's inputs too, for :meth:`mems`. False saves that memory when the
            caller never reads the memory back.
        max_tokens: the most tokens the state will take in (a starting memory's included), or None
            (no bound: S slots). A state with fewer slots than S refuses a call past them.
        spare_room: on a CPU, keep spare positions after the slots for segment views (:meth:`room`); False:
            exactly S positions, slot 0 at position 0 (the layout :class:`~txl.generation.compiled.RingDecoder` reads).

    Raises:
        TxlError: ``span`` is not an AttentionSpan, ``n_layer < 1`` or ``max_tokens < 1``.

    Source: paper §3.2 (memory), §3.3 (relative scores: keys independent of position).
    """

    def __init__(self, n_layer: int, span: AttentionSpan, keep_mems: bool = True, max_tokens: int | None = None,
                 spare_room: bool = True) -> None:
        if not isinstance(span, AttentionSpan):
            raise TxlError(f"span must be an AttentionSpan, got {type(span).__name__}")
        check_count(n_layer, "n_layer", 1)
        check_count(1 if max_tokens is None else max_tokens, "max_tokens", 1)
        max_tokens = None if max_tokens is None else int(max_tokens)
        self.span, self.keep_mems, self.max_tokens, self.spare_room = span, keep_mems, max_tokens, spare_room
        self.slots = ring_capacity(span)  # S of an unbounded text
        self.capacity = self.slots if max_tokens is None else min(self.slots, max_tokens)
        self.stack: torch.Tensor | None = None  # keys and values of every layer [2, L, B, H, R, D]
        self.length = 0
        self.seen = 0  # keys taken in since the start: the text position of the next new key ("rope")
        self.next_slot = 0
        self.start = 0  # buffer position of slot 0
        self._plan: SegmentPlan | object | None = None  # the call in progress (begin): a segment's plan, or _STEP
        self.batch_size: int | None = None
        self.pos_emb: torch.Tensor | None = None  # the scheme's step table: "rel" R [S, d_model]; "rope" θ [D/2]
        self.segment_klen = -1  # key length whose projected positions the layers hold (multi-token calls)
        self.dtype: torch.dtype | None = None  # the keys' dtype, bound by the first call
        self.failed = False  # a call failed inside the layers: the buffers may be half updated
        self.owner: weakref.ref | None = None  # the model whose keys the buffers hold (its first call's)
        self.layers = [LayerCache(self) for _ in range(n_layer)]
        self.held: list[torch.Tensor] | None = None  # compressive spans: the memory itself (docs/model.md)
        self._views = False  # segments after the memory read views of the buffers (a CPU's; set when they are made)

    @property
    def compressive(self) -> bool:
        """Whether the span has a compressed memory (the state then holds the memory in :attr:`held`)."""
        return self.span.cmem_len > 0

    def room(self, device: torch.device | str) -> int:
        """Buffer positions per layer on ``device``: S, plus on a CPU the spare room of segment views
        (docs/model.md, "The decoding cache") where the ring may fill and move (``spare_room`` and no
        ``max_tokens`` below S)."""
        views = self.spare_room and torch.device(device).type == "cpu" and self.capacity == self.slots
        return self.capacity + (min(self.capacity, max(self.capacity // 8, 2 * self.span.tgt_len)) if views else 0)

    def nbytes(self, config, batch_size: int, itemsize: int, device: torch.device | str = "cpu") -> int:
        """Bytes of the buffers for ``batch_size`` rows of a model of ``config`` on ``device``: keys and
        values (and inputs with ``keep_mems``) of ``itemsize`` bytes at every layer and buffer position; 0
        for a compressed memory (held as the model's memory tensors). Callers compare it with the memory
        available before the first call (:func:`txl.runtime.check_fits`)."""
        if self.compressive:
            return 0
        per_position = 2 * config.n_head * config.d_head + (config.d_model if self.keep_mems else 0)
        return len(self.layers) * batch_size * self.room(device) * per_position * itemsize

    def hold(self, mems: list[torch.Tensor], qlen: int) -> None:
        """Compressive spans: keep ``mems`` (``3 * n_layer`` tensors) as the memory after ``qlen`` more tokens."""
        self.held = mems
        self.length = min(self.length + qlen, self.capacity)
        self.next_slot = self.length % self.capacity

    def check_call(self, batch_size: int, dtype: torch.dtype | None, new_tokens: int = 0) -> None:
        """Refuse a call whose batch size or key dtype differs from the ones this state holds (a state
        is bound by its first call that runs, see :meth:`bind`), or that would take it past ``max_tokens``
        with fewer slots than the memory needs.

        Raises:
            TxlError: another batch size, another dtype (e.g. with autocast after a call without it), or
                ``new_tokens`` more than the slots left.
        """
        if self.batch_size not in (None, batch_size):
            raise TxlError(f"the decoding state holds {self.batch_size} rows but input_ids has {batch_size}; "
                           "make a new DecodingState for another batch")
        if self.dtype not in (None, dtype):
            raise TxlError(f"the decoding state holds {self.dtype} keys but this call computes in {dtype}; use the "
                           "same dtype (autocast or not) for every call with one state, or make a new DecodingState")
        if self.capacity < self.slots and self.seen + new_tokens > self.capacity:
            raise TxlError(f"the decoding state was made for max_tokens={self.max_tokens:,} tokens and holds "
                           f"{self.seen:,}; a call of {new_tokens:,} more does not fit: make it with a larger "
                           "max_tokens (or None)")

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

        The query is written to slot ``w = next_slot``; slot ``s`` then holds distance ``(w - s) mod S``.
        The tables hold distances S-1 ... 0 twice in a row, so that distance's column is ``s + S - 1 - w``
        (while the memory fills, ``w = length`` and the columns of this step end at S).
        """
        return self.capacity - 1 - self.next_slot

    def begin(self, qlen: int, klen: int, shape: tuple[int, int, int], dtype: torch.dtype,
              device: torch.device) -> None:
        """Start a call of ``qlen`` tokens over ``klen`` keys (memory included), once nothing else can
        reject it, just before the layers run; then each layer's :meth:`LayerCache.update`, then
        :meth:`commit`. The first call allocates the keys and values: ``shape`` is (B, H, D), ``dtype``
        the keys', on ``device``.

        A one-token call after a memory is a ring step; any other call is a segment, whose
        :class:`SegmentPlan` is made here.
        """
        if self.stack is None:
            self._allocate(*shape, dtype, device)
        if qlen == 1 and self.length > 0:
            self._plan = _STEP
            return
        S, m = self.capacity, self.memory_length
        end = self.start + self.length  # buffer position after the newest token, in time order
        if self.length == 0 or m + qlen > self.stack.size(4) or not self._views:
            self._plan = SegmentPlan(in_place=False)
            return
        rotated = self.length == S and self.next_slot != 0
        relocate = rotated or end + qlen > self.stack.size(4)
        first = 0 if relocate else end - m
        filled = min(m + qlen, S)
        self._plan = SegmentPlan(True, relocate, rotated, first, first + m + qlen - filled if filled == S else first)

    def commit(self, klen: int) -> None:
        """End the call :meth:`begin` started, after every layer's :meth:`LayerCache.update` (layers
        read the old contents first, so the counters move only now). ``klen``: its key length."""
        plan, self._plan = self._plan, None
        if plan is _STEP:
            self.commit_step()
            return
        self.seen += klen - self.memory_length  # (a first call's keys include its starting memory)
        self.start = plan.start_after
        self.length = min(klen, self.capacity)
        self.next_slot = self.length % self.capacity

    def commit_step(self) -> None:
        """After a one-token step wrote the token's key and value to slot ``next_slot``: it is the newest."""
        self.seen += 1
        self.length = min(self.length + 1, self.capacity)
        self.next_slot = (self.next_slot + 1) % self.capacity

    def _allocate(self, bsz: int, heads: int, d_head: int, dtype: torch.dtype, device: torch.device) -> None:
        """The keys and values at their full size. Zeros without spare room (a compiled ring step reads
        every slot, masked or not); otherwise uninitialised, as only written slots are read (pages a text
        never reaches are never touched). An allocation the device refuses is one line naming its size.

        Raises:
            TxlError: the allocator found no room (out of memory).
        """
        shape = (2, len(self.layers), bsz, heads, self.room(device), d_head)
        try:
            self.stack = (torch.empty if self.spare_room else torch.zeros)(shape, dtype=dtype, device=device)
        except RuntimeError as err:
            if not out_of_memory(err):
                raise
            need = format_bytes(2 * len(self.layers) * bsz * heads * self.room(device) * d_head * dtype.itemsize)
            raise TxlError(f"a decoding state with mem_len {self.span.mem_len:,} needs {need} for its keys and "
                           "values, which this device cannot allocate: make it with max_tokens (the tokens it "
                           "will hold) or use a smaller mem_len") from None
        self._views = self.spare_room and torch.device(device).type == "cpu"  # (other devices' kernels: no views)
        self._view_buffers()

    def _view_buffers(self) -> None:
        """Point every layer's keys and values at its part of :attr:`stack`."""
        for i, cache in enumerate(self.layers):
            cache.keys, cache.values = self.stack[0, i], self.stack[1, i]

    def ordered(self, buffer: torch.Tensor, n: int, dim: int) -> torch.Tensor:
        """The last ``n`` filled slots of ``buffer`` along ``dim``, oldest first (a copy when rotated)."""
        if self.length < self.capacity or self.next_slot == 0:  # time order from slot 0
            return buffer.narrow(dim, self.start + self.length - n, n)
        slots = buffer.narrow(dim, self.start, self.capacity)
        index = torch.arange(self.next_slot - n, self.next_slot, device=buffer.device) % self.capacity
        return slots.index_select(dim, index)

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
        if self.stack is not None:
            self.stack = self.stack.index_select(2, index.to(self.stack.device))
            self._view_buffers()
            for cache in self.layers:
                if cache.hidden is not None:
                    cache.hidden = cache.hidden.index_select(0, index.to(cache.hidden.device))
        if self.held is not None:
            self.held = [m.index_select(0, index.to(m.device)).contiguous() for m in self.held]
        if self.batch_size is not None:
            self.batch_size = int(index.numel())


def check_state(state: DecodingState, model, mems, span: AttentionSpan | None) -> AttentionSpan:
    """The span of a decoding ``state`` after checking that ``model`` may read with it (called by
    :meth:`~txl.model.TransformerXLLM.forward`; binds the state to the model on its first call).

    Raises:
        TxlError: one line for each way the state and the call do not fit (see :meth:`~txl.model.TransformerXLLM.forward`).
    """
    c = model.config
    if not isinstance(state, DecodingState):
        raise TxlError(f"caches must be a txl.model.DecodingState, got {type(state).__name__}")
    state.check_usable()
    if state.owner is not None and state.owner() is not model:
        raise TxlError("this decoding state holds the keys of another model; make a new DecodingState for "
                       "this one")
    if state.owner is None:
        state.owner = weakref.ref(model)
    if not model.config.has_memory:
        raise TxlError(f"a decoding state needs a model with memory; this model's attn_type {c.attn_type!r} "
                       "has none to hold")
    if torch.is_grad_enabled():
        raise TxlError("a decoding state is for reading without autograd: call the model inside torch.no_grad()")
    if model.training:  # its one-token step has no dropout: train mode would make the two paths differ
        raise TxlError("a decoding state is for reading in evaluation mode: call model.eval() first")
    if len(state.layers) != c.n_layer:
        raise TxlError(f"the decoding state was made for {len(state.layers)} layers but the model has "
                       f"{c.n_layer}; make it with DecodingState(model.config.n_layer, span)")
    if span is not None and span != state.span:
        raise TxlError(f"span {span} differs from the decoding state's span {state.span}; make a new "
                       "DecodingState for another span")
    if mems is not None and state.length > 0:
        raise TxlError("the decoding state already holds the memory: pass mems=None")
    return state.span


def ring_capacity(span: AttentionSpan) -> int:
    """Slots S of a ring over ``span``: ``mem_len + 1`` (the memory and the token itself), or ``mem_len``
    with ``same_length`` (and a memory)."""
    return span.mem_len + (0 if span.same_length and span.mem_len > 0 else 1)


def slot_padding_mask(state: DecodingState, mem_padding: torch.Tensor, batch: int) -> torch.Tensor:
    """bool [B, 1, 1, K] over the slots a one-token step attends to: True where a slot holds one of the
    first ``mem_padding[b]`` (oldest) tokens of row b's memory.

    Before the step the state remembers L tokens, M = ``memory_length`` of them form the memory,
    and the new token goes to slot ``w = next_slot``. While the ring is not full the slots are in
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


_STEP = object()  # DecodingState._plan during a one-token step (see DecodingState.begin)
