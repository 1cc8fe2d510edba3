"""The CPU's fast paths of the attention's position bias, without autograd: a seam a reader of the
maths (:func:`txl.model.attention.biased_attention`) may skip.

Two forms give the numbers of the plain computation up to the order of float additions:

- the masked, realigned bias as a strided view of the position scores themselves, with no masked copy
  of [B, H, T, K], when the mask is exactly the causal or same_length one (:func:`masked_shift_view`);
- the batch rows and heads in blocks whose position scores stay in the last-level cache
  (:func:`in_blocks`).

Shapes: B = batch, H = heads, T = queries, K = keys.
"""

from __future__ import annotations

from typing import Callable

import torch

BLOCK_BYTES = 8 * 2**20  # CPU: a block of position scores this large stays in the last-level cache


def masked_shift_view(scores: torch.Tensor, future: torch.Tensor, window: int) -> torch.Tensor:
    """The realigned, masked bias [..., T, K] as a strided view of ``scores`` [..., T, K + 1] (column
    m holds distance K - m; column 0, distance K, occurs for no query).

    Entry (i, j), distance d = M + i - j, is column ``T - i + j`` of row i: row i starts T - i
    elements into its row of ``scores``, and rows are K apart, so they tile the storage without
    overlap. A future key (d < 0) runs into row i + 1, at a column below ``T - (i + 1)``, which no
    visible entry of row i + 1 reads: those columns (``future[i, m]``: m < T - i) are set to -inf,
    and with a ``window`` so are the columns of distance >= window. Writes only the [T, T] corner
    and the window's columns.
    """
    *lead, qlen, width = scores.shape
    klen = width - 1
    scores[..., :qlen].masked_fill_(future, float("-inf"))
    if 0 < window <= klen:
        scores[..., :klen + 1 - window] = float("-inf")
    if scores.stride()[-2:] != (width, 1):
        scores = scores.contiguous()
    return scores.as_strided((*lead, qlen, klen), scores.stride()[:-2] + (klen, 1), scores.storage_offset() + qlen)


def even_step(n: int, most: int) -> int:
    """Block size for ``n`` items in blocks of at most ``most``: the fewest blocks, sizes as even as possible."""
    blocks = -(-n // most)
    return -(-n // blocks)


def in_blocks(attend: Callable[[slice, slice], torch.Tensor], shape: tuple[int, int, int, int], like: torch.Tensor,
              per_head: int, block_bytes: int | None = None) -> torch.Tensor:
    """``attend(rows, heads)`` over every batch row and head: the output ``shape`` [B, H, T, D] in ``like``'s
    dtype and device, in blocks whose position scores take at most ``block_bytes`` (default
    :data:`BLOCK_BYTES`; ``per_head``: the bytes of one head of one row): everything at once when it fits,
    else whole rows per block, else heads of one row per block, as few blocks as the limit allows, of even
    size."""
    bsz, heads = shape[:2]
    everything = slice(None)
    limit = BLOCK_BYTES if block_bytes is None else block_bytes
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
