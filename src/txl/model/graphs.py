"""The one-token step as a graph of fixed shape: what ``txl export`` writes (with its prompt reader, the
export recipe's ``SegmentReader``, ``recipes/export``), and the step ``generate(..., compile=True)``
compiles (:class:`RingDecoder`).

A traced graph would freeze a :class:`~txl.model.DecodingState`'s Python counters, so here the ring
reaches the graph as tensors: ``keys``, ``values`` float [L, B, H, S, D] (a state's buffers without
spare room, or the exported runner's arrays), ``write`` int64 [] (the slot the next token goes to) and
``fill`` int64 [] (the slots that hold a token; while ``fill < S``, ``write == fill``). The step
(:class:`RingStep`) runs each layer's own step over the slots without writing them and returns the new
token's key and value; the caller writes them to slot ``write``. Slot s is at distance
``(write - s) mod S`` from the new token, read from a per-layer table of distances made once
(docs/export.md).

Shapes: L = layers, B = batch, H = heads, D = ``d_head``, S = capacity, M = ``mem_len``, d = ``d_model``,
T = ``tgt_len``, V = vocabulary.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from txl.errors import TxlError
from txl.model.decoding import DecodingState, LayerCache, ring_capacity
from txl.model.segments import segments
from txl.config import AttentionSpan
from txl.runtime import compile_module

EXPORTABLE = ("rel", "shaw")  # the schemes whose step is a table of distances (keys independent of position)
BACKENDS = ("inductor", "aot_eager", "eager")  # torch.compile backends RingDecoder takes


def check_exportable(config, span: AttentionSpan, what: str = "export", reader: bool = True) -> None:
    """Refuse what the ring modules cannot hold, with one line naming it (``what``: the feature asked
    for, e.g. "export" or "compiled decoding").

    Raises:
        TxlError: a position scheme other than "rel"/"shaw", a compressed memory, ``mem_len`` 0, or, with
            ``reader`` (the exported prompt reader, which recovers a call's memory from the memory it was
            given), ``mem_len < tgt_len``.
    """
    if config.attn_type not in EXPORTABLE:
        raise TxlError(f"{what} serves attn_type 'rel' and 'shaw' (keys independent of position); this model has "
                       f"{config.attn_type!r}")
    if span.cmem_len > 0 or config.cmem_len > 0:
        raise TxlError(f"{what} does not hold a compressed memory (cmem_len > 0): its slots change every few tokens")
    if span.mem_len < 1:
        raise TxlError(f"{what} needs a memory (mem_len >= 1): the step's state is the memory's keys and values")
    if reader and span.mem_len < span.tgt_len:
        raise TxlError(f"{what} needs mem_len >= tgt_len (got mem_len {span.mem_len}, tgt_len {span.tgt_len}): "
                       "use a longer memory (or, where it can be set, a shorter tgt_len)")


def distance_tables(model: nn.Module, span: AttentionSpan, dtype: torch.dtype) -> torch.Tensor:
    """The step's position keys: float [L, H, D, S], column j for distance S-1-j (clamped by ``clamp_len``).

    Built by each layer's position scheme exactly as a :class:`~txl.model.DecodingState` builds its
    step tables once the memory is full (``step_positions`` then ``position_keys``).
    """
    capacity = ring_capacity(span)
    weight = model.word_emb.emb_layers[0].weight
    state = SimpleNamespace(span=span, capacity=capacity, pos_emb=None)
    scheme = model.positions
    with torch.no_grad():
        scheme.step_positions(state, model.config, weight.device, dtype)
        return torch.stack([layer.attn.pos.position_keys(state).to(dtype) for layer in model.layers])


class RingStep(nn.Module):
    """The step graph: one token per row after the memory held in a ring (see the module doc).

    ``forward(input_ids, keys, values, write, fill)`` with ``input_ids`` int64 [B, 1], ``keys`` and
    ``values`` float [L, B, H, S, D], ``write`` and ``fill`` int64 []; returns ``(logits, key, value)``:
    logits [B, V] for the next token (the model's ``crit.logits``: raw scores, or log-probabilities
    with an adaptive softmax) and the new token's key and value [L, B, H, D] for slot ``write``.

    Each layer's own :meth:`~txl.model.transformer.DecoderLayer.step`, with the old slots and the new
    token's own key scored side by side instead of written first; a slot is attended to when
    ``s < fill`` and ``s != write`` (once full, slot ``write`` holds the token the new one replaces).

    Raises (at construction): TxlError as :func:`check_exportable`.
    """

    def __init__(self, model: nn.Module, span: AttentionSpan) -> None:
        super().__init__()
        check_exportable(model.config, span, reader=False)
        self.model, self.capacity = model, ring_capacity(span)
        self.register_buffer("tables", distance_tables(model, span, model.word_emb.emb_layers[0].weight.dtype),
                             persistent=False)

    def forward(self, input_ids, keys, values, write, fill):
        model, capacity = self.model, self.capacity
        slots = torch.arange(capacity, device=input_ids.device)
        hidden = ((slots >= fill) | (slots == write))[None, :]  # [1, S]: the slots the new token does not see
        distance = torch.remainder(write - slots, capacity)  # each slot's, then the own key's (0): table columns
        columns = capacity - 1 - torch.cat([distance, distance.new_zeros(1)])
        h = model.word_emb(input_ids)  # [B, 1, d]
        new_keys, new_values = [], []
        for i, layer in enumerate(model.layers):
            ring = LayerCache.graph_view(keys[i], values[i], self.tables[i], columns)
            h = layer.step(h, ring, hidden)
            new_keys.append(ring.own[0][:, :, 0])
            new_values.append(ring.own[1][:, :, 0])
        return model.crit.logits(h[:, 0]), torch.stack(new_keys), torch.stack(new_values)


class RingDecoder:
    """Decoding with a :class:`~txl.model.DecodingState` whose one-token steps run :class:`RingStep`,
    optionally compiled: ``generate(..., compile=True)``, and the PyTorch side of ``txl bench --export``.

    The state has no spare room (every layer's keys and values in one tensor [2, L, B, H, S, D], slot 0
    at position 0), so a compiled step is one graph for every step, whatever the memory holds (no
    recompilation as it fills). The prompt is read by the model's own forward into the state, as
    :func:`txl.generation.prime_memory` reads it; a step hands the stack and the counters ``write``
    (``next_slot``) and ``fill`` (``length``) to the step module, whose counters are int64 [] tensors
    made once per value, and writes the new token's key and value into slot ``write`` in place.

    Args:
        model: a :class:`~txl.model.TransformerXLLM` in eval mode (no autograd is used).
        span: the span to read and decode with (:func:`check_exportable` holds).
        compile: wrap the step in ``torch.compile(fullgraph=True)``: True (inductor) or a backend's name
            (e.g. "aot_eager"); False: run it eagerly.

    Raises:
        TxlError: as :func:`check_exportable`.
    """

    def __init__(self, model: nn.Module, span: AttentionSpan, compile: bool | str = False) -> None:
        self.model, self.span, self.capacity = model, span, ring_capacity(span)
        self.step_module = RingStep(model, span)
        if compile:
            backend = compile if isinstance(compile, str) else "inductor"
            if backend not in BACKENDS:  # (others, e.g. cudagraphs, may hand back outputs a later step overwrites)
                raise TxlError(f"compile takes True or one of {', '.join(BACKENDS)}, got {compile!r}")
            self.step_module = compile_module(self.step_module, fullgraph=True, dynamic=False, backend=backend)
        self.state = self.state_for(model, span)
        self.mems: list[torch.Tensor] | None = None  # a starting memory not read into the state yet
        # the counters' values 0 ... S on the model's device (one copy there), and (counter, value) -> its own
        # int64 [] tensor, cut from them once per value on the device: no copy from the host per step
        self._values = torch.arange(self.capacity + 1, device=model.word_emb.emb_layers[0].weight.device)
        self._counters: dict[tuple[int, int], torch.Tensor] = {}

    @staticmethod
    def state_for(model: nn.Module, span: AttentionSpan) -> DecodingState:
        """A fresh state of the layout the step reads: S slots from position 0, no spare room, no inputs kept."""
        return DecodingState(model.config.n_layer, span, keep_mems=False, spare_room=False)

    @torch.no_grad()
    def read_prompt(self, input_ids: torch.Tensor, mems: list[torch.Tensor] | None = None) -> None:
        """Read ``input_ids`` (int64 [B, T], T >= 0 tokens: the prompt without the token the first
        :meth:`step` reads) in calls of ``tgt_len`` after ``mems`` (``n_layer`` tensors [B, M', d], e.g.
        a ``txl serve`` session's memory) or from no memory (None), into a fresh state (what an earlier
        call read is dropped)."""
        self.state = self.state_for(self.model, self.span)
        self.mems = mems
        for seg in segments(self.model, input_ids.to(torch.long), span=self.span, mems=mems, caches=self.state):
            self.mems = seg.output.mems  # (None: the state holds the memory)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One token per row (int64 [B, 1]) after what was read: the next-token logits [B, V] (as the
        model's ``crit.logits``); the token's keys and values go to slot ``write`` (in place). A first
        token with nothing in the state yet is read by the model's forward.

        Raises:
            TxlError: the state was left half written by a call that failed, or ``input_ids`` has another
                batch size than what was read.
        """
        state = self.state
        state.check_usable()
        if state.length == 0:
            out = self.model(input_ids, mems=self.mems, caches=state, span=self.span)
            self.mems = None
            return out.logits[:, -1]
        # one layout for every step (a prompt's last column is strided, a sampled token's is not): one graph
        input_ids = input_ids.to(torch.long).clone(memory_format=torch.contiguous_format)
        state.check_call(input_ids.size(0), state.dtype)
        keys, values = state.stack.unbind(0)
        write = state.next_slot
        logits, key, value = self.step_module(input_ids, keys, values, self._counter(0, write),
                                              self._counter(1, state.length))
        keys.select(3, write).copy_(key)
        values.select(3, write).copy_(value)
        state.commit_step()
        return logits

    def _counter(self, which: int, value: int) -> torch.Tensor:
        """``value`` of counter ``which`` (0 write, 1 fill) as an int64 [] tensor on the model's device, made
        once per value by a copy on the device (a copy from the host per step would wait for a GPU). The two
        counters never share a tensor, even when equal: a graph compiled for two inputs would be compiled
        again for one input passed twice."""
        if (which, value) not in self._counters:
            self._counters[which, value] = self._values[value].clone()
        return self._counters[which, value]
