"""Evaluation with memory on a CPU, read in the forms a commit offers: which speed work earns its code.

The model floor keeps a second form of a computation only where it is measured at least 10% faster
than the first. This script times ``txl.evaluation.evaluate`` (what ``txl eval`` runs) on random
tokens with bench-small and a wider model, alternating the forms in every round (median of the
rounds), and checks that every form gives the same loss. Forms, where the commit has them:

- ``view``: the CPU seam's attention with the masked-shift view (no masked copy of the bias);
- ``shifted``: the same seam, the bias as a masked copy of the realigned scores;
- ``plain``: no seam: the realigned, masked bias and ``scaled_dot_product_attention`` in one call;
- ``no spare room``: a decoding state without spare positions (the memory concatenated every segment);
- ``no state``: no decoding state (the memory's keys projected again every segment).

``--rev`` runs the script inside a temporary git worktree of that commit (the forms are those of the
code there), so a form that a later commit removed can still be measured:

    OMP_NUM_THREADS=2 python benchmarks/eval_forms.py --rev 9adc56f --json benchmarks/results/eval-forms.json

Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = (  # (model widening, mem_len, batch, same_length, tokens)
    ({}, 128, 16, False, 24_000),
    ({}, 640, 8, False, 24_000),
    ({}, 640, 8, True, 24_000),
    ({"d_model": 512, "d_head": 64, "d_inner": 2048}, 1600, 2, True, 8_000),
    # the paper's enwik8 large model's layers (4 of its 24), at its evaluation's attention length
    ({"n_layer": 4, "d_model": 1024, "d_head": 128, "d_inner": 3072}, 3800, 8, True, 40_000),
)


def forms() -> dict:
    """name -> a function that installs the form (by replacing module attributes) and returns an undo."""
    import torch.nn.functional as F

    import txl.evaluation.stream as ES
    from txl.kernels import cpu
    from txl.model import DecodingState, attention

    def patch(module, name, value):
        old = getattr(module, name)
        setattr(module, name, value)
        return lambda: setattr(module, name, old)

    seam = cpu.biased_attention

    def shifted(*args, window=None, **kwargs):
        return seam(*args, window=None, **kwargs)

    def plain(q_content, q_pos, k, v, r_k, mask, *, scale, dropout_p, window, scores, shifted):
        bias = attention.rel_shift_bias(attention.position_scores(q_pos, r_k[..., -k.size(2):]), mask)
        return F.scaled_dot_product_attention(q_content, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)

    def no_spare_room(model, span, max_tokens=None):
        return DecodingState(model.config.n_layer, span, keep_mems=False, max_tokens=max_tokens, spare_room=False)

    table = {"view": lambda: (lambda: None), "no state": lambda: patch(ES, "decoding_state", lambda *a, **k: None)}
    if hasattr(cpu, "masked_shift_view"):
        table["shifted"] = lambda: patch(cpu, "biased_attention", shifted)
    if hasattr(cpu, "biased_attention"):
        table["plain"] = lambda: patch(cpu, "biased_attention", plain)
    if "spare_room" in DecodingState.__init__.__code__.co_varnames:
        table["no spare room"] = lambda: patch(ES, "decoding_state", no_spare_room)
    return table


def measure(rounds: int, which: list[int]) -> list[dict]:
    import numpy as np
    import torch

    import txl.evaluation.stream as ES
    from txl.model import TransformerXLConfig, TransformerXLLM
    from txl_studies.speed.bench import BENCH_SMALL

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    tokens = np.random.default_rng(0).integers(0, 256, 64_000).astype(np.int64)
    table, rows = forms(), []
    for wider, mem_len, batch, same_length, n in (ROWS[i] for i in which):
        torch.manual_seed(0)
        config = TransformerXLConfig(**dict(BENCH_SMALL, **wider, dropout=0.0))
        model = TransformerXLLM(config).eval()
        times: dict[str, list[float]] = {name: [] for name in table}
        losses: dict[str, float] = {}
        for r in range(rounds):
            for name in table if r % 2 == 0 else reversed(table):
                undo = table[name]()
                try:
                    start = time.perf_counter()
                    losses[name] = ES.evaluate(model, tokens[:n], unit="bpc", batch_size=batch, tgt_len=128,
                                               mem_len=mem_len, same_length=same_length).loss
                    times[name].append(time.perf_counter() - start)
                finally:
                    undo()
        median = {name: statistics.median(t) for name, t in times.items()}
        row = {"d_model": config.d_model, "n_layer": config.n_layer, "tgt_len": 128, "mem_len": mem_len,
               "batch": batch, "same_length": same_length, "tokens": n,
               "tokens_per_s": {name: n / s for name, s in median.items()},
               "speedup_of_view": {name: s / median["view"] for name, s in median.items() if name != "view"},
               "runs_s": times, "loss": losses,
               "max_loss_difference": max(losses.values()) - min(losses.values())}
        rows.append(row)
        print(f"d_model {config.d_model} mem_len {mem_len} batch {batch} same_length {same_length}: " +
              ", ".join(f"{name} {v:.3f}" for name, v in row["speedup_of_view"].items()), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="measure the code of this commit (a temporary git worktree)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, alternating the forms' order (default 5)")
    ap.add_argument("--rows", default=",".join(map(str, range(len(ROWS)))),
                    help=f"which rows, numbered from 0 (default: all {len(ROWS)})")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    which = [int(i) for i in args.rows.split(",")]
    if not which or any(not 0 <= i < len(ROWS) for i in which):
        raise SystemExit(f"eval_forms.py: --rows takes numbers 0 ... {len(ROWS) - 1}")
    if args.rev:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from compare_commits import checkouts, python_path

        with checkouts(args.rev, None, "txl-forms-") as (commits, trees):
            env = dict(os.environ, PYTHONPATH=python_path(trees["base"]), TXL_FORMS_COMMIT=commits["base"],
                       TXL_FORMS_COMMAND="python " + shlex.join(sys.argv))
            argv = [sys.executable, __file__, "--rounds", str(args.rounds), "--rows", args.rows]
            out = ["--json", str(Path(args.json).resolve())] if args.json else []
            return subprocess.run(argv + out, env=env, cwd=trees["base"]).returncode
    import platform

    import torch

    from txl.runtime import cpu_flags

    start = time.time()
    rows = measure(args.rounds, which)
    commit = os.environ.get("TXL_FORMS_COMMIT") or subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() + " (working tree)"
    command = os.environ.get("TXL_FORMS_COMMAND") or "python " + shlex.join(sys.argv)
    results = {"command": command, "date": time.strftime("%Y-%m-%d"), "commit": commit,
               "rounds": args.rounds, "threads": os.environ.get("OMP_NUM_THREADS", "2"),
               "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
               "cpu_flags": sorted(cpu_flags() or ()), "wall_s": round(time.time() - start), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
