"""The one-token step as a graph of fixed shape: what ``txl export`` writes (with its prompt reader, the
export recipe's ``SegmentReader``, ``recipes/export``), and the step ``generate(..., compile=True)``
compiles (:class:`txl.generation.compiled.RingDecoder`).

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
from txl.model.decoding import LayerCache, ring_capacity
from txl.config import AttentionSpan

EXPORTABLE = ("rel", "shaw")  # the schemes whose step is a table of distances (keys independent of position)


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
