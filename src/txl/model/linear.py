"""The model's linear layer, and the CPU product forms behind it: a seam a reader of the model may skip.

The model calls :class:`Linear` as it would call ``nn.Linear``, with two optional arguments that say what
a product is for, never how to compute it: ``rows`` selects output rows (the queries' rows of
``qkv_net``, one cluster's rows of the softmax) and ``skip_rows`` says that the first M input rows are
the detached memory. Int8 weights are the same call on :class:`~txl.model.quantize.Int8Linear`, which
:func:`~txl.model.quantize.quantize_int8` swaps in; the model's code does not know which it holds.

Inside, :func:`product` takes the form that is fastest for the shape; every form gives the numbers of
``F.linear`` up to the order of float additions:

- **Decoding-step rows.** A step reads every weight once per token, mostly from main memory, so at
  batch 1 its time is the weight's bytes over the bandwidth the kernel reaches. On a CPU a
  matrix-vector product streams a weight from one core; the same product as a batched product over
  row blocks of the weight (a view, no copy) reads the blocks on every intra-op thread
  (``benchmarks/results/cpu-*gen*.json``). From a few rows on, a plain product is as fast, and for the
  one-token rows of a step ``weight @ x.T`` (the weight read along its rows) beats ``x @ weight.T``.
- **The memory's rows in training.** The memory is detached (the paper's stop-gradient, §3.2), so
  the input gradient of its rows is never used: the backward of a product with ``skip_rows`` M
  computes the input gradient of the other rows only, which saves a [B*M, out] x [out, in] product
  per call (the keys and values over the memory).

While ``torch.compile`` or ``torch.export`` traces, every product but the memory-rows one is ``F.linear``
(a test of the number of rows would fix the batch size of the graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FEW_ROWS = 2  # up to this many rows, the row-block product (CPU)
AUTOCAST_DEVICES = ("cpu", "cuda", "mps", "xpu")  # device kinds the memory-rows product follows autocast on


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters ``weight`` [out, in] and ``bias`` [out], same initialisation, same
    saved names) whose call takes the model's two hints.

    ``forward(x, rows=None, skip_rows=0)``: x [..., in] -> [..., out'], out' the selected rows' count:
    ``rows`` a slice of the output rows (None: all); ``skip_rows`` M: x's first M rows along dim 1 are
    a detached memory whose input gradient is not needed (training; zeros are returned for them).
    """

    def forward(self, x: torch.Tensor, rows: slice | None = None, skip_rows: int = 0) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if rows is not None:
            weight, bias = weight[rows], None if bias is None else bias[rows]
        return product(x, weight, bias, skip_rows)


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            skip_rows: int = 0) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (x [..., in], weight [out, in], bias [out] -> [..., out]) in the form
    fastest for its shape (see the module doc); ``skip_rows`` as in :class:`Linear`."""
    if skip_rows and torch.is_grad_enabled() and x.requires_grad and x.device.type in AUTOCAST_DEVICES:
        return _memory_rows(x, weight, bias, skip_rows)  # (compiled training traces it too)
    if torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    step = x.dim() == 3 and x.size(1) == 1  # one token per row: a decoding step
    if x.dim() != 2 and not step:
        return F.linear(x, weight, bias)
    rows = x.size(0)
    flat = x.reshape(rows, x.size(-1))
    if rows <= FEW_ROWS and weight.device.type == "cpu" and weight.is_contiguous():
        out = _row_block_product(flat, weight, bias)
    elif not step:
        return F.linear(x, weight, bias)
    elif rows == 1:
        out = torch.mm(flat, weight.t()) if bias is None else torch.addmm(bias, flat, weight.t())
    else:
        out = (torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())).t()
    return out.unsqueeze(1) if step else out


def _row_block_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [N, in] (N <= :data:`FEW_ROWS`) times ``weight.T`` [in, out] as a batched product over row blocks
    of the weight (:func:`_row_blocks`; ``F.linear`` when none divides ``out``)."""
    rows, in_features = x.shape
    out_features = weight.size(0)
    blocks = _row_blocks(out_features)
    if blocks == 1:
        return F.linear(x, weight, bias)
    parts = weight.view(blocks, out_features // blocks, in_features)
    out = torch.bmm(parts, x.t().unsqueeze(0).expand(blocks, in_features, rows))  # [n, out/n, N]
    out = out.view(out_features, rows).t()
    # the bias in the product's dtype, as autocast gives it to F.linear (bf16 in, bf16 out)
    return out if bias is None else out + bias.to(out.dtype)


def _row_blocks(out_features: int) -> int:
    """Row blocks of the product: as many as the intra-op threads (at least 2, at most 8) among 8, 4, 2
    that divide ``out_features``; 1 when none does. The x operand is passed as a view with strides
    (0, 1, in): the layout for which the batched kernel reads the blocks in parallel."""
    most = min(8, max(2, torch.get_num_threads()))
    for blocks in (8, 4, 2):
        if blocks <= most and out_features % blocks == 0:
            return blocks
    return 1


class _MemoryRowsProduct(torch.autograd.Function):
    """``F.linear(x, weight)`` whose backward computes the input gradient of the rows after ``mlen``
    only (the rows before it are the detached memory: their gradient would be discarded)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, mlen: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.mlen = mlen
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        mlen = ctx.mlen
        grad_x = grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = grad.reshape(-1, grad.size(-1)).t().mm(x.reshape(-1, x.size(-1)))
        if ctx.needs_input_grad[0]:
            grad_x = x.new_empty(x.shape)
            grad_x[:, :mlen].zero_()
            grad_x[:, mlen:] = torch.matmul(grad[:, mlen:], weight)
        return grad_x, grad_weight, None


def _memory_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mlen: int) -> torch.Tensor:
    """The product for x [B, M + T, in] = [memory, segment] under autograd, computing no input gradient for
    the M memory rows. Under autocast it computes in the autocast dtype, as ``F.linear`` would."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)  # autocast casts floating operands, but float64, to it
        x, weight = (t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t for t in (x, weight))
        with torch.autocast(kind, enabled=False):
            out = _MemoryRowsProduct.apply(x, weight, mlen)
    else:
        out = _MemoryRowsProduct.apply(x, weight, mlen)
    return out if bias is None else out + bias.to(out.dtype)
