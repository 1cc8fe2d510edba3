"""The attention of one layer, two ways: txl's biased_attention (the rel-shifted bias handed to
scaled_dot_product_attention) and the same term as FlexAttention's score_mod (:func:`flex_biased_attention`),
eager and under torch.compile. Prints and writes (--json) the median time of each and the largest difference.

    PYTHONPATH=src python benchmarks/flex_attention.py --device cuda --json benchmarks/results/flex-<gpu>.json
    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/flex_attention.py   # CPU: the compiled kernel of inductor

The position term in the form a block-wise fused kernel takes: for query i and key j the distance
``M + i - j`` picks the column of the position scores ``(q + v)·W_kR R`` (the rel-shift becomes an
index), and the causal, same_length and padding masks become a block mask, so whole blocks of future
keys are skipped and neither the shifted copy nor the probabilities are written out. The position
scores are still one [B, H, T, K] product: they depend on the query and the distance, not on the key,
so no per-key operand of the kernel can carry them. On a CPU without ``torch.compile`` FlexAttention
runs a slow reference (``tests/benchmarks/test_flex_attention.py`` holds the two forms equal in float64).

The flex rows include building the block mask from the mask (``create_block_mask``) in every call, as
the model would per segment. Shapes: bench-small's layer by default (batch 8, 8 heads of 32, tgt_len 128, mem_len 128); --tgt-len,
--mem-len, --batch-size change them. Timings are only comparable within one run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from txl.errors import TxlError  # noqa: E402
from txl.model.attention import position_scores  # noqa: E402


def flex_biased_attention(q_content: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          r_k: torch.Tensor, mask: torch.Tensor, *, scale: float, kernel=None) -> torch.Tensor:
    """``softmax(scale * q_content·k + rel_shift(q_pos·r_k) masked) @ v`` through FlexAttention: the
    arguments and result of :func:`~txl.model.attention.biased_attention` (no attention dropout).

    Args:
        q_content: [B, H, T, D] queries for the content term (q + u for "rel"), unscaled.
        q_pos: [B, H, T, D] queries for the position term (q + v for "rel"), already scaled.
        k, v: [B, H, K, D] keys and values over [memory + current segment], K = M + T.
        r_k: [H, D, K + 1] position keys for distances K ... 0 (as biased_attention takes them).
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
    batch_mask = mask.dim() == 2 or (mask.dim() == 4 and mask.size(0) in (1, bsz) and mask.size(1) == 1)
    if (r_k.size(-1) != klen + 1 or k.shape[:2] != (bsz, heads) or mask.shape[-2:] != (qlen, klen) or not batch_mask
            or q_content.shape != q_pos.shape or v.shape[:3] != k.shape[:3]):
        raise TxlError(f"flex attention: queries {tuple(q_content.shape)} and {tuple(q_pos.shape)}, keys "
                       f"{tuple(k.shape)}, values {tuple(v.shape)}, position keys {tuple(r_k.shape)} and mask "
                       f"{tuple(mask.shape)} do not fit together")
    pos = position_scores(q_pos, r_k)  # [B, H, T, K + 1]: column c holds distance K - c
    visible = ~(mask if mask.dim() == 4 else mask[None, None]).expand(bsz, 1, qlen, klen)[:, 0]  # [B, T, K]
    shift = qlen  # query i, key j: distance M + i - j is column j + T - i

    def score_mod(score, b, h, i, j):
        return score + pos[b, h, i, (j + shift - i).clamp(max=klen)]  # future keys: masked below

    def mask_mod(b, h, i, j):
        return visible[b, i, j]

    block_mask = create_block_mask(mask_mod, B=bsz, H=None, Q_LEN=qlen, KV_LEN=klen, device=q_pos.device)
    run = flex_attention if kernel is None else kernel
    with warnings.catch_warnings():  # eager FlexAttention warns that it is a slow reference: known here
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        return run(q_content, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def main() -> int:
    from torch.nn.attention.flex_attention import flex_attention

    from txl.model.attention import attention_mask, biased_attention
    from txl.runtime import cpu_flags

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d-head", type=int, default=32)
    ap.add_argument("--tgt-len", type=int, default=128)
    ap.add_argument("--mem-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    B, H, T, M, D = args.batch_size, args.heads, args.tgt_len, args.mem_len, args.d_head

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device)

    q_content, q_pos, k, v = rand(B, H, T, D), rand(B, H, T, D) / D**0.5, rand(B, H, M + T, D), rand(B, H, M + T, D)
    r_k = rand(H, D, M + T + 1)
    mask = attention_mask(T, M, False, M, device)
    scale = 1 / D**0.5
    compiled = torch.compile(flex_attention)
    forms = {
        "biased_attention": lambda: biased_attention(q_content, q_pos, k, v, r_k, mask, scale=scale),
        "flex_eager": lambda: flex_biased_attention(q_content, q_pos, k, v, r_k, mask, scale=scale),
        "flex_compiled": lambda: flex_biased_attention(q_content, q_pos, k, v, r_k, mask, scale=scale, kernel=compiled),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = {"shape": {"batch": B, "heads": H, "tgt_len": T, "mem_len": M, "d_head": D}, "device": str(device),
               "torch": torch.__version__, "cpu_flags": sorted(cpu_flags() or ()), "ms": {}, "max_abs_diff": {}}
    with torch.no_grad():
        want = forms["biased_attention"]()
        for name, fn in forms.items():
            out = fn()  # the first call compiles
            results["max_abs_diff"][name] = float((out - want).abs().max())
            times = []
            for _ in range(args.repeats):
                sync()
                start = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - start)
            results["ms"][name] = round(1000 * statistics.median(times), 3)
            print(f"{name:18s} {results['ms'][name]:9.3f} ms   max |diff| {results['max_abs_diff'][name]:.2e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
