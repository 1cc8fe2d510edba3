"""The relative position term in the form a fused attention kernel takes: FlexAttention's ``score_mod``.

:func:`~txl.model.attention.biased_attention` hands ``scaled_dot_product_attention`` the position
term (b) + (d) of §3.3 as a realigned, masked bias [B, H, T, K]. A fused kernel that computes scores
block by block (FlexAttention, ``torch.nn.attention.flex_attention``) takes the same term as a score
modification instead: for query i and key j, the distance ``M + i - j`` picks the column of the
position scores ``(q + v)·W_kR R`` -- the rel-shift becomes an index -- and the causal, same_length
and padding masks become a block mask, so whole blocks of future keys are skipped and neither the
shifted copy nor the probabilities are ever written out. The position scores themselves are still one
[B, H, T, K] product: they depend on the query and the distance, not on the key, so no per-key
operand of the kernel can carry them (the kernel's own product is the content term (q + u)·k).

On a CPU without ``torch.compile`` FlexAttention runs a slow reference (the tests hold this form equal
to :func:`~txl.model.attention.biased_attention` in float64 there); the fused kernels are the compiled
ones (CUDA, and the CPU backend of inductor). ``benchmarks/flex_attention.py`` times the two forms.
"""

from __future__ import annotations

import warnings

import torch

from txl.errors import TxlError
from txl.model.attention import position_scores


def flex_biased_attention(q_content: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          r_k: torch.Tensor, mask: torch.Tensor, *, scale: float, kernel=None) -> torch.Tensor:
    """``softmax(scale * q_content·k + rel_shift(q_pos·r_k) masked) @ v`` through FlexAttention: the
    arguments and result of :func:`~txl.model.attention.biased_attention` (no attention dropout).

    Args:
        q_content: [B, H, T, D] queries for the content term (q + u for "rel"), unscaled.
        q_pos: [B, H, T, D] queries for the position term (q + v for "rel"), already scaled.
        k, v: [B, H, K, D] keys and values over [memory + current segment], K = M + T.
        r_k: [H, D, K] position keys for distances K-1 ... 0 (or [H, D, K + 1] with a leading column
            for distance K, which no query reads).
        mask: bool [T, K] or [B, 1, T, K], True = not visible (every row keeps at least one key).
        scale: the content term's scale, 1/sqrt(D).
        kernel: the ``flex_attention`` function to call (e.g. its ``torch.compile``'d form on a GPU);
            None: ``torch.nn.attention.flex_attention.flex_attention`` as it is.

    Returns:
        [B, H, T, D], equal to :func:`~txl.model.attention.biased_attention` up to float rounding.

    Raises:
        TxlError: a torch without FlexAttention (before 2.5), or arguments whose shapes disagree.
    """
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:  # pragma: no cover - torch >= 2.5 is required by the package
        raise TxlError(f"this torch ({torch.__version__}) has no FlexAttention; it needs torch >= 2.5") from err
    bsz, heads, qlen, _ = q_pos.shape
    klen = k.size(2)
    if r_k.size(-1) == klen + 1:
        r_k = r_k[..., 1:]
    batch_mask = mask.dim() == 2 or (mask.dim() == 4 and mask.size(0) in (1, bsz) and mask.size(1) == 1)
    if (r_k.size(-1) != klen or k.shape[:2] != (bsz, heads) or mask.shape[-2:] != (qlen, klen) or not batch_mask
            or q_content.shape != q_pos.shape or v.shape[:3] != k.shape[:3]):
        raise TxlError(f"flex attention: queries {tuple(q_content.shape)} and {tuple(q_pos.shape)}, keys "
                       f"{tuple(k.shape)}, values {tuple(v.shape)}, position keys {tuple(r_k.shape)} and mask "
                       f"{tuple(mask.shape)} do not fit together")
    pos = position_scores(q_pos, r_k)  # [B, H, T, K]: column c holds distance K - 1 - c
    visible = ~(mask if mask.dim() == 4 else mask[None, None]).expand(bsz, 1, qlen, klen)[:, 0]  # [B, T, K]
    shift = qlen - 1  # query i, key j: distance M + i - j is column j + T - 1 - i

    def score_mod(score, b, h, i, j):
        return score + pos[b, h, i, (j + shift - i).clamp(max=klen - 1)]  # future keys: masked below

    def mask_mod(b, h, i, j):
        return visible[b, i, j]

    block_mask = create_block_mask(mask_mod, B=bsz, H=None, Q_LEN=qlen, KV_LEN=klen, device=q_pos.device)
    run = flex_attention if kernel is None else kernel
    with warnings.catch_warnings():  # eager FlexAttention warns that it is a slow reference: known here
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        return run(q_content, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
