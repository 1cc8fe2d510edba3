"""Weight products for the few rows of a decoding step, in the form that reads the weight fastest.

A decoding step computes every weight product for one token per row, so it reads every weight once
per token, mostly from main memory: at batch 1 its cost is the weights' bytes over the bandwidth
the product's kernel reaches. On the CPUs measured (docs/benchmarks.md), a single matrix-vector
product streams a weight at about 13 GB/s on one core; the same product as a batched product over
row blocks of the weight (a view, no copy) reads the blocks on every intra-op thread and runs 2.2-2.4x
faster for bench-small's weights at batch 1. From about four rows on, a plain matrix product is as
fast, and ``weight @ x.T`` (the weight read along its rows) beats ``x @ weight.T`` by about 15%.
Every form gives the numbers of ``F.linear`` up to the order of float additions.

An int8 layer (:mod:`txl.model.quantize`) hands these functions its weight as :class:`Int8Rows` instead of a
tensor; every function here then takes the int8 product (:func:`int8_linear`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FEW_ROWS = 2  # up to this many rows, the row-block product (CPU)
AUTOCAST_DEVICES = ("cpu", "cuda", "mps", "xpu")  # device kinds memory_rows_linear follows autocast on


class Int8Rows:
    """The rows of an int8 weight: ``weight`` int8 [out, in] (contiguous) and ``scale`` [out] (float32), with
    W ~= weight * scale[:, None] (one scale per output channel, symmetric: |weight| <= 127).

    Slicing selects output rows (``rows[:hd]``, a view: no copy), as slicing a float weight does, so code
    that takes the queries' rows of ``qkv_net`` works on both.
    """

    __slots__ = ("weight", "scale")

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor) -> None:
        self.weight, self.scale = weight, scale

    def __getitem__(self, rows: slice) -> "Int8Rows":
        return Int8Rows(self.weight[rows], self.scale[rows])

    def size(self, dim: int | None = None):
        """The weight's size, as ``Tensor.size``."""
        return self.weight.size() if dim is None else self.weight.size(dim)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [out, in] these rows stand for."""
        return self.weight.to(dtype) * self.scale.to(dtype)[:, None]


def linear(x: torch.Tensor, weight: "torch.Tensor | Int8Rows", bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., in] -> [..., out], for a float weight [out, in] or :class:`Int8Rows`."""
    if isinstance(weight, Int8Rows):
        return int8_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def int8_linear(x: torch.Tensor, weight: Int8Rows, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] (float32, bfloat16 or float16) times an int8 weight's transpose -> [..., out] in x's dtype.

    On a CPU each row of x is quantised with its own symmetric scale (max |x_row| / 127, dynamic
    quantisation) and multiplied by the int8 weight with exact int32 sums (``torch._int_mm``), then scaled
    back by the row's and the output channel's scales: a row's result does not depend on the other rows,
    so a decoding step and a whole segment give a token the same numbers. Other dtypes (float64) and
    devices multiply by :meth:`Int8Rows.dequantize` (the weight's rounding only, no saving).
    """
    lead, flat = x.shape[:-1], x.reshape(-1, x.size(-1))
    if flat.device.type != "cpu" or flat.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        out = F.linear(flat, weight.dequantize(flat.dtype))
    else:
        wide = flat.float()
        row_scale = wide.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(127.0)  # [N, 1]
        q = wide.div(row_scale).round_().to(torch.int8)  # |q| <= 127 by construction
        out = torch._int_mm(q, weight.weight.t()).to(torch.float32).mul_(row_scale).mul_(weight.scale)
        out = out.to(flat.dtype)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.view(*lead, out.size(-1))


def linear_rows(x: torch.Tensor, weight: "torch.Tensor | Int8Rows", bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [N, in], weight [out, in], bias [out] -> [N, out], as the
    row-block product when N <= :data:`FEW_ROWS` on a CPU, else ``F.linear`` itself (:func:`int8_linear`
    for :class:`Int8Rows`). While ``torch.compile`` or ``torch.export`` traces, ``F.linear`` whatever N
    (a test of N would fix the batch size of the graph)."""
    if isinstance(weight, Int8Rows):
        return int8_linear(x, weight, bias)
    rows, in_features = x.shape
    out_features = weight.size(0)
    fits = (not torch.compiler.is_compiling() and rows <= FEW_ROWS and weight.device.type == "cpu"
            and weight.is_contiguous())
    blocks = _row_blocks(out_features) if fits else 1
    if blocks == 1:
        return F.linear(x, weight, bias)
    parts = weight.view(blocks, out_features // blocks, in_features)
    out = torch.bmm(parts, x.t().unsqueeze(0).expand(blocks, in_features, rows))  # [n, out/n, N]
    out = out.view(out_features, rows).t()
    # the bias in the product's dtype, as autocast gives it to F.linear (bf16 in, bf16 out)
    return out if bias is None else out + bias.to(out.dtype)


def step_linear(x: torch.Tensor, weight: "torch.Tensor | Int8Rows", bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for the one-token rows of a decoding step: x [B, 1, in] -> [B, 1, out] (possibly a
    strided view). Up to :data:`FEW_ROWS` rows on a CPU: :func:`linear_rows`' row-block product; more
    rows: ``(weight @ x.T).T``; :func:`int8_linear` for :class:`Int8Rows`."""
    rows = x.size(0)
    flat = x.reshape(rows, x.size(-1))
    if isinstance(weight, Int8Rows):
        out = int8_linear(flat, weight, bias)
    elif rows <= FEW_ROWS and weight.device.type == "cpu":
        out = linear_rows(flat, weight, bias)
    elif rows == 1:
        out = torch.mm(flat, weight.t()) if bias is None else torch.addmm(bias, flat, weight.t())
    else:
        out = (torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())).t()
    return out.unsqueeze(1)


def _row_blocks(out_features: int) -> int:
    """Row blocks of the product: as many as the intra-op threads (at least 2, at most 8) among 8, 4, 2
    that divide ``out_features``; 1 when none does. The x operand is passed as a view with strides
    (0, 1, in): the layout for which the batched kernel reads the blocks in parallel."""
    most = min(8, max(2, torch.get_num_threads()))
    for blocks in (8, 4, 2):
        if blocks <= most and out_features % blocks == 0:
            return blocks
    return 1


class _MemoryRowsLinear(torch.autograd.Function):
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


def memory_rows_linear(x: torch.Tensor, weight: torch.Tensor, mlen: int) -> torch.Tensor:
    """``F.linear(x, weight)`` for x [B, M + T, in] = [memory, segment] (weight [out, in]) -> [B, M + T, out].

    The memory is detached (the paper's stop-gradient, §3.2), so the gradient of its rows is never
    used: this product's backward computes the input gradient of the T segment rows only (zeros for
    the memory rows), which saves a [B*M, out] x [out, in] product per call in training, e.g. the
    keys and values over the memory. Under autocast it computes in the autocast dtype, as
    ``F.linear`` would. Without autograd, or with no memory, it is ``F.linear`` itself (:func:`int8_linear`
    for :class:`Int8Rows`: inference only).
    """
    if isinstance(weight, Int8Rows):
        return int8_linear(x, weight)
    if mlen == 0 or not torch.is_grad_enabled() or not x.requires_grad:
        return F.linear(x, weight)
    kind = x.device.type
    if kind not in AUTOCAST_DEVICES:
        return F.linear(x, weight)
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)  # autocast casts floating operands, but float64, to it
        x, weight = (t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t for t in (x, weight))
        with torch.autocast(kind, enabled=False):
            return _MemoryRowsLinear.apply(x, weight, mlen)
    return _MemoryRowsLinear.apply(x, weight, mlen)
