"""The exported prompt reader: one right-padded segment after a left-padded memory, as a graph of fixed
shape beside the ring step of :mod:`txl.model.graphs`, so greedy tokens equal ``txl generate``'s
(docs/export.md).

Shapes: L = layers, B = batch, H = heads, D = ``d_head``, S = capacity, M = ``mem_len``, d = ``d_model``,
T = ``tgt_len``.
"""

from __future__ import annotations

import torch
from torch import nn

from txl.config import AttentionSpan
from txl.model.decoding import ring_capacity
from txl.model.graphs import check_exportable


def layer_keys(attn: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [B, H, n, D] a layer projects from its inputs ``hidden`` [B, n, d] (pre-LN applied
    first, as :meth:`~txl.model.attention.MultiHeadAttention.forward` does)."""
    hd = attn.n_head * attn.d_head
    x = attn.layer_norm(hidden) if attn.pre_lnorm else hidden
    k, v = attn.qkv_net(x, slice(hd, None)).split(hd, dim=-1)
    return attn._heads(k), attn._heads(v)


class SegmentReader(nn.Module):
    """The prompt reader graph: read one right-padded segment with a left-padded memory of ``mem_len`` positions.

    ``forward(input_ids, mems, mem_padding, n_valid)``:

    - ``input_ids`` int64 [B, T]: the segment, its first ``n_valid`` tokens real (1 <= n_valid <= T);
    - ``mems`` float [L, B, M, d]: each layer's memory, its first ``mem_padding`` positions padding;
    - ``mem_padding`` int64 [B] (0 ... M); ``n_valid`` int64 [].

    Returns ``(mems, mem_padding, keys, values, fill)``: the memory after the real tokens [L, B, M, d]
    and its padding [B]; the ring made from it, keys and values [L, B, H, S, D] (slots 0 ... fill-1 the
    memory in time order, the rest zeros) and ``fill`` int64 [] (``write`` is ``fill % S``). The ring
    assumes every row has the same padding (prompts of one length).

    Raises (at construction): TxlError as :func:`check_exportable`.
    """

    def __init__(self, model: nn.Module, span: AttentionSpan) -> None:
        super().__init__()
        check_exportable(model.config, span)
        self.model, self.span, self.capacity = model, span, ring_capacity(span)

    def forward(self, input_ids, mems, mem_padding, n_valid):
        span, tgt_len, mem_len = self.span, self.span.tgt_len, self.span.mem_len
        out = self.model(input_ids, mems=list(mems.unbind(0)), span=span, mem_padding=mem_padding)
        # out.mems holds positions T ... M+T-1 of [memory + segment]; the old memory holds 0 ... M-1 (T <= M)
        cat = torch.cat([mems[:, :, :tgt_len], torch.stack(out.mems)], dim=2)  # [L, B, M + T, d]
        index = torch.arange(mem_len, device=input_ids.device) + n_valid  # the M positions after the real tokens
        new_mems = cat.index_select(2, index)
        new_padding = (mem_padding - n_valid).clamp(min=0)
        return (new_mems, new_padding, *self.ring(new_mems, new_padding))

    def ring(self, mems: torch.Tensor, mem_padding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ring made from a left-padded memory ``mems`` [L, B, M, d] (``mem_padding`` [B], the same in
        every row): keys and values [L, B, H, S, D], the memory's in slots 0 ... fill-1 in time order, and
        ``fill`` int64 []."""
        mem_len = self.span.mem_len
        keys, values = zip(*(layer_keys(layer.attn, m) for layer, m in zip(self.model.layers, mems.unbind(0))))
        keys, values = torch.stack(keys), torch.stack(values)  # [L, B, H, M, D]
        pad = mem_padding[0]
        slots = (torch.arange(mem_len, device=mems.device) + pad).clamp(max=mem_len - 1)
        real = (torch.arange(mem_len, device=mems.device) < mem_len - pad)[:, None]
        keys = keys.index_select(3, slots) * real
        values = values.index_select(3, slots) * real
        if self.capacity > mem_len:  # one more slot for the token that fills the ring
            extra = keys.new_zeros(*keys.shape[:3], self.capacity - mem_len, keys.size(-1))
            keys, values = torch.cat([keys, extra], dim=3), torch.cat([values, extra], dim=3)
        return keys, values, mem_len - pad
