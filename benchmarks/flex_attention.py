"""The attention of one layer, two ways: txl's biased_attention (the rel-shifted bias handed to
scaled_dot_product_attention) and the same term as FlexAttention's score_mod (txl.model.flex), eager and
under torch.compile. Prints and writes (--json) the median time of each and the largest difference.

    PYTHONPATH=src python benchmarks/flex_attention.py --device cuda --json benchmarks/results/flex-<gpu>.json
    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/flex_attention.py   # CPU: the compiled kernel of inductor

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from txl.model.attention import attention_mask, biased_attention
    from txl.model.flex import flex_biased_attention
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
    r_k = rand(H, D, M + T)
    mask = attention_mask(T, M, False, M, device)
    scale = 1 / D**0.5
    compiled = torch.compile(flex_attention)
    forms = {
        "biased_attention": lambda: biased_attention(q_content, q_pos, k, v, r_k, mask, scale=scale, window=0),
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
