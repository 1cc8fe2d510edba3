"""CPU speed work behind the model's modules: a seam a reader of the model may skip.

Everything here gives the numbers of the plain computation up to the order of float additions (or, for
dropout, the same distribution); on other devices and while ``torch.compile`` traces, the plain forms
run. Three parts:

**The model's linear layer.** The model calls :class:`Linear` as it would call ``nn.Linear``, with two
optional arguments that say what a product is for, never how to compute it: ``rows`` selects output
rows (the queries' rows of ``qkv_net``, one cluster's rows of the softmax) and ``skip_rows`` says that
the first M input rows are the detached memory. Int8 weights are the same call on
:class:`~txl.kernels.int8.Int8Linear`, which :func:`~txl.kernels.int8.quantize_int8` swaps in; the
model's code does not know which it holds. Inside, :func:`product` takes the form fastest for the shape:

- decoding-step rows: a step reads every weight once per token, mostly from main memory, so at batch 1
  its time is the weight's bytes over the bandwidth the kernel reaches; a matrix-vector product streams
  a weight from one core, the same product as a batched product over row blocks of the weight (a view)
  reads the blocks on every intra-op thread (``benchmarks/results/cpu-*gen*.json``); for the one-token
  rows of a step ``weight @ x.T`` beats ``x @ weight.T``;
- the memory's rows in training: the memory is detached (the paper's stop-gradient, §3.2), so the
  backward of a product with ``skip_rows`` M computes the input gradient of the other rows only.

**Dropout** (:class:`Dropout`): ``torch.nn.Dropout`` draws one Bernoulli sample per element; on a CPU
that costs more than the matmuls of a small model's feed-forward layer. Here the mask comes from
62-bit random integers read as four 16-bit lanes: three uniform over 2^16 values and one over 2^14,
each compared with the threshold that keeps it with probability 1 - p (exact up to the lane's
resolution: |error| <= 2^-15 for any p). Same expectation (kept values scaled by 1 / (1 - p),
Srivastava et al. 2014).

**The attention's memory without autograd**: :func:`txl.model.attention.biased_attention` on a CPU
runs the batch rows and heads in blocks whose position scores take at most :data:`BLOCK_BYTES`
(:func:`in_blocks`), so that a long segment over a long memory needs a bounded room, not
[B, H, T, K] scores at once; and the bound of the memory those scores take, which the reading loops'
callers check before they start (:func:`check_attention_fits`). The blocks bound the memory and cost
no time: one call over everything takes 0.99x-1.05x their time (``benchmarks/results/eval-forms.json``).

Shapes: B = batch, H = heads, T = queries, K = keys.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from txl.errors import TxlError
from txl.runtime import check_fits

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


# ---------------------------------------------------------------- dropout

_SHORT_LANE = 3 if sys.byteorder == "little" else 0  # the 16 bits holding the int64's top (14 random) bits


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu",
              generator: torch.Generator | None = None) -> torch.Tensor:
    """A bool mask of ``shape``, each element True (kept) with probability 1 - p (to within 2^-15).

    Uses ``generator`` (default: torch's global generator), so seeding torch makes it reproducible.
    """
    n = 1
    for size in shape:
        n *= size
    words = torch.randint(0, 2**62, ((n + 3) // 4,), dtype=torch.int64, device=device, generator=generator)
    lanes = words.view(torch.int16).view(-1, 4)
    full, short = min(round(p * 65536), 65535) - 32768, min(round(p * 16384), 16383)
    thresholds = torch.full((4,), full, dtype=torch.int16, device=device)
    thresholds[_SHORT_LANE] = short
    keep = (lanes >= thresholds).view(-1)
    return (keep if keep.numel() == n else keep[:n]).view(shape)


class _KeepScale(torch.autograd.Function):
    """``x * keep * scale`` whose backward keeps the bool mask (1 byte per element), not a float copy.

    Computed as ``where(keep, x, 0) * scale``: two passes over x, no float mask (kept values are
    ``x * scale`` rounded once in x's dtype, in forward and backward alike).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0.0).mul_(ctx.scale), None, None


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout(p)``: in training, zero each element with probability ``p`` and scale
    the rest by ``1 / (1 - p)``; identity in eval mode or for p = 0. Any shape and float dtype (the
    output keeps the input's dtype)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise TxlError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return _KeepScale.apply(x, keep_mask(x.shape, self.p, x.device), 1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


# ---------------------------------------------------------------- the attention's memory

BLOCK_BYTES = 8 * 2**20  # without autograd, a block of position scores takes at most this


def even_step(n: int, most: int) -> int:
    """Block size for ``n`` items in blocks of at most ``most``: the fewest blocks, sizes as even as possible."""
    blocks = -(-n // most)
    return -(-n // blocks)


def in_blocks(attend: Callable[[slice, slice], torch.Tensor], shape: tuple[int, int, int, int], like: torch.Tensor,
              per_head: int) -> torch.Tensor:
    """``attend(rows, heads)`` over every batch row and head: the output ``shape`` [B, H, T, D] in ``like``'s
    dtype and device, in blocks whose position scores take at most :data:`BLOCK_BYTES` (``per_head``: the
    bytes of one head of one row): everything at once when it fits, else whole rows per block, else heads
    of one row per block, as few blocks as the limit allows, of even size."""
    bsz, heads = shape[:2]
    everything = slice(None)
    limit = BLOCK_BYTES  # (read at the call: tests lower it)
    if per_head * heads * bsz <= limit:
        return attend(everything, everything)
    out = like.new_empty(shape)
    if per_head * heads <= limit:
        step = even_step(bsz, limit // (per_head * heads))
        for b in range(0, bsz, step):
            out[b:b + step] = attend(slice(b, b + step), everything)
        return out
    step = even_step(heads, max(1, limit // per_head))
    for b in range(bsz):
        for h in range(0, heads, step):
            out[b:b + 1, h:h + step] = attend(slice(b, b + 1), slice(h, h + step))
    return out


def attention_bytes(bsz: int, heads: int, qlen: int, klen: int, n_layer: int, itemsize: int, grad: bool,
                    block_bytes: int) -> int:
    """A rough bound of the bytes a call's attention scores take on a CPU, for callers to compare with
    the memory available before reading (:func:`txl.runtime.check_fits`); it only catches hopeless
    calls (a segment of a million tokens).

    Scores [B, H, T, K] of ``itemsize`` bytes, three times over for the bias and the kernel's work;
    under autograd (``grad``) once more per layer (each keeps its bias for the backward); without
    autograd, in blocks of at most ``block_bytes`` or one head of one row.
    """
    per_head = qlen * klen * itemsize
    if grad:
        return (n_layer + 3) * bsz * heads * per_head
    return 3 * max(per_head, min(bsz * heads * per_head, block_bytes))


def check_attention_fits(model, bsz: int, qlen: int, klen: int, grad: bool, dtype: str = "float32") -> None:
    """Refuse a reading of segments of ``qlen`` tokens over ``klen`` keys (batch ``bsz``) whose attention
    scores could not fit in the available memory of ``model``'s device: called by the callers of the
    reading loops (:func:`check_reading_fits`, training) once before they start, never by the model itself.
    Devices other than the CPU are not checked (their allocator raises its own out-of-memory error), nor
    models whose attention keeps no scores ("abs"). ``dtype``: the reading's (an autocast dtype's scores
    take 2 bytes).

    Raises:
        TxlError: naming T, K, the bytes needed and available, and what to make smaller.
    """
    weight, scheme = next(model.parameters(), None), getattr(model, "positions", None)
    if weight is None or weight.device.type != "cpu" or not getattr(scheme, "keeps_scores", False):
        return  # (another device, "abs", or a stand-in model)
    c = model.config
    itemsize = 2 if dtype in ("bfloat16", "float16") else weight.element_size()
    need = attention_bytes(bsz, c.n_head, qlen, klen, c.n_layer, itemsize, grad, BLOCK_BYTES)
    if need >= 2**28:
        check_fits(need, f"a segment of {qlen:,} tokens over {klen:,} keys (batch {bsz:,})",
                   "use a smaller tgt_len (--tgt-len), a shorter memory or a smaller batch", weight.device)


def check_reading_fits(model, inputs, span, mems=None, positions=None, grad: bool = False,
                       dtype: str = "float32") -> None:
    """Refuse to read ``inputs`` (int64 [B, N], or a lazy array of that shape) with
    :func:`txl.segments.segments` and the same ``span``, ``mems``, ``positions``, ``grad`` and
    ``dtype`` when its largest call (a whole segment over the longest memory) has attention scores the
    available memory cannot hold (:func:`check_attention_fits`). A ``mem_len`` far beyond the text costs
    what the text holds. The callers of the segment loop call this before reading; the loop itself does
    not ask how much memory is free.

    Raises:
        TxlError: as :func:`check_attention_fits`.
    """
    n_rows, width = inputs.shape
    if not width:
        return
    qlen = min(width, span.tgt_len) if positions is None else max(size for _, size in positions)
    first = mems[0] if isinstance(mems, (list, tuple)) and mems else None  # [B, M, d]: M given positions
    given = first.size(1) if torch.is_tensor(first) and first.dim() == 3 else 0
    memory = min(max(given, span.mem_len), given + width - qlen)  # at most what came before the last segment
    check_attention_fits(model, n_rows, qlen, memory + qlen, grad, dtype)
