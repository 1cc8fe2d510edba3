"""Compressive memory against plain memory at equal attention span and training budget (docs/compressive.md).

    PYTHONPATH=src python benchmarks/compressive.py --out runs/cmem [--steps 200] [--seeds 0 1]

Trains each variant (below) on the built-in default corpus (bytes) and tiny Shakespeare (chars),
each run in its own process (one torch thread) so that its peak resident memory can be read, and
writes ``results.json``, ``compressive.md`` (table) and ``compressive.png`` (via txl.analysis.plots).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

M = 64  # the attention span beyond the segment, in key slots
VARIANTS = {  # name: model overrides (equal span: mem_len + cmem_len = M for the memory models)
    "xl-mem64": dict(mem_len=M, cmem_len=0),
    "cmem32+32-c3": dict(mem_len=M // 2, cmem_len=M // 2, cmem_ratio=3),
    "xl-mem32": dict(mem_len=M // 2, cmem_len=0),
    "no-memory": dict(mem_len=0, cmem_len=0),
}
CORPORA = {"default": ["data.tokenizer=byte"],
           "shakespeare": ["data.path=data/tinyshakespeare.txt", "data.tokenizer=char"]}

ONE_RUN = r"""
import json, resource, sys, torch
torch.set_num_threads(1)
from txl.training.config import load_run_config
from txl.training.loop import train
run = load_run_config("configs/cpu-tiny.toml", sys.argv[2:])
r = train(run, progress=False, log=lambda m: None)
print(json.dumps({"value": r.final.value, "unit": r.final.unit, "loss": r.final.loss, "n_tokens": r.final.n_tokens,
                  "settings": r.final.settings, "tokens_per_s": r.tokens_per_s, "wall_s": r.wall_s,
                  "steps": r.steps, "tokens": r.tokens,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def table(results: dict) -> str:
    """Markdown: one row per corpus and variant, mean and spread (half the range) over the seeds."""
    rows = {}
    for key, r in results.items():
        corpus, variant, _ = key.split("/")
        rows.setdefault((corpus, variant), []).append(r)
    lines = ["| corpus | variant | train mem_len / cmem_len (c) | seeds | valid (mean ± half range) | "
             "train tokens/s | peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    for (corpus, variant), rs in rows.items():
        values = [r["value"] for r in rs]
        v = VARIANTS[variant]
        span = f"{v['mem_len']} / {v['cmem_len']}" + (f" ({v['cmem_ratio']})" if v["cmem_len"] else "")
        mean, half = sum(values) / len(values), (max(values) - min(values)) / 2
        speed = sum(r["tokens_per_s"] for r in rs) / len(rs)
        rss = max(r["peak_rss_mib"] for r in rs)
        lines.append(f"| {corpus} | {variant} | {span} | {len(rs)} | {rs[0]['unit']} {mean:.4f} ± {half:.4f} | "
                     f"{speed:,.0f} | {rss:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/cmem")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--corpora", nargs="+", default=list(CORPORA))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--eval-tokens", type=int, default=16384)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for corpus in args.corpora:
        for name in args.variants:
            for seed in args.seeds:
                key = f"{corpus}/{name}/{seed}"
                if key in results:
                    continue
                v = VARIANTS[name]
                overrides = [*CORPORA[corpus], f"train.out_dir={out / corpus / name / str(seed)}",
                             f"train.seed={seed}", f"train.max_steps={args.steps}", f"train.eval_interval={args.steps}",
                             "train.sample_tokens=0", f"train.eval_max_tokens={args.eval_tokens}",
                             f"train.warmup_steps={max(1, args.steps // 10)}",
                             f"eval.max_tokens={args.eval_tokens}", "model.tgt_len=32",
                             *(f"model.{k}={val}" for k, val in v.items()),
                             f"eval.mem_len={v['mem_len']}", f"eval.cmem_len={v['cmem_len']}"]
                print("run", key, file=sys.stderr, flush=True)
                done = subprocess.run([sys.executable, "-c", ONE_RUN, "--", *overrides], capture_output=True,
                                      text=True)
                if done.returncode:
                    print(done.stderr, file=sys.stderr)
                    return 1
                results[key] = json.loads(done.stdout.strip().splitlines()[-1])
                results_path.write_text(json.dumps(results, indent=1))
    from txl.analysis.plots import plot_compressive

    (out / "compressive.md").write_text(table(results))
    plot_compressive(results, out / "compressive.png")
    print((out / "compressive.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
