"""Compressive memory against plain memory at equal attention span and training budget (docs/compressive.md).

    python -m txl_studies.compressive.run --out runs/cmem [--steps 1600] [--seeds 0 1] [--jobs 2]

Trains each variant (below) on the built-in default corpus (bytes) and tiny Shakespeare (chars),
each run in its own process (one torch thread) so that its peak resident memory can be read, with a
validation every ``--eval-interval`` steps (the valid metric against the training budget), and
writes ``results.json``, ``compressive.md`` (tables) and ``compressive.png`` (:func:`plot_compressive`).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
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
from txl.config import load_run_config
from txl.training.loop import train
run = load_run_config("configs/cpu-tiny.toml", sys.argv[2:])
r = train(run, progress=False, log=lambda m: None)
print(json.dumps({"value": r.final.value, "unit": r.final.unit, "loss": r.final.loss, "n_tokens": r.final.n_tokens,
                  "settings": r.final.settings, "tokens_per_s": r.tokens_per_s, "wall_s": r.wall_s,
                  "steps": r.steps, "tokens": r.tokens,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def speed(variants: list[str], rounds: int) -> dict:
    """Training-step seconds per variant (byte model, batch 16 x tgt_len 32, one thread, AdamW, the
    reconstruction loss included), measured interleaved (A B C A B C ...) so that the machine's other
    load falls on every variant alike; the median over ``rounds`` timings of 5 steps each."""
    import statistics
    import time

    import torch

    from txl.model import TransformerXLLM
    from txl.config import load_run_config

    torch.set_num_threads(1)
    base = load_run_config("configs/cpu-tiny.toml", ["model.tgt_len=32", "model.vocab_size=256"]).model
    models = {}
    for name in variants:
        torch.manual_seed(0)
        model = TransformerXLLM(base.__class__(**{**base.to_dict(), **VARIANTS[name]})).train()
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    x = torch.randint(0, 256, (16, 32), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {name: [] for name in variants}
    mems = {name: None for name in variants}
    for _ in range(rounds + 1):  # the first round warms up
        for name, (model, opt) in models.items():
            start = time.perf_counter()
            for _ in range(5):
                out = model(x, mems=mems[name], labels=x)
                loss = out.loss if out.recon_loss is None else out.loss + out.recon_loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                mems[name] = out.mems
            times[name].append((time.perf_counter() - start) / 5)
    return {name: {"s_per_step": statistics.median(t[1:]), "tokens_per_s": 16 * 32 / statistics.median(t[1:]),
                   "all": t[1:]} for name, t in times.items()}


def table(results: dict) -> str:
    """Markdown: one row per corpus and variant, mean and spread (half the range) over the seeds."""
    rows = {}
    for key, r in results.items():
        if key == "speed":
            continue
        corpus, variant, _ = key.split("/")
        rows.setdefault((corpus, variant), []).append(r)
    lines = ["| corpus | variant | train mem_len / cmem_len (c) | seeds | valid (mean ± half range) | "
             "train tokens/s in the run | interleaved tokens/s | peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
    for (corpus, variant), rs in rows.items():
        values = [r["value"] for r in rs]
        v = VARIANTS[variant]
        span = f"{v['mem_len']} / {v['cmem_len']}" + (f" ({v['cmem_ratio']})" if v["cmem_len"] else "")
        mean, half = sum(values) / len(values), (max(values) - min(values)) / 2
        speed = sum(r["tokens_per_s"] for r in rs) / len(rs)
        rss = max(r["peak_rss_mib"] for r in rs)
        timed = results.get("speed", {}).get(variant, {}).get("tokens_per_s")
        lines.append(f"| {corpus} | {variant} | {span} | {len(rs)} | {rs[0]['unit']} {mean:.4f} ± {half:.4f} | "
                     f"{speed:,.0f} | {f'{timed:,.0f}' if timed else '-'} | {rss:,.0f} |")
    return "\n".join(lines) + "\n"


def curve(metrics_csv: Path) -> list[list[float]]:
    """``[[step, tokens, valid metric], ...]``: the periodic validations of one run's metrics.csv."""
    with open(metrics_csv, newline="") as f:
        return [[int(r["step"]), int(r["tokens"]), float(r["val_metric"])] for r in csv.DictReader(f) if r["val_metric"]]


def budget_table(results: dict) -> str:
    """Markdown: the valid metric at each validation step (mean over seeds), one row per corpus and
    variant: where the curves cross is the budget at which a memory starts to pay."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for key, r in results.items():
        if key != "speed" and r.get("curve"):
            corpus, variant, _ = key.split("/")
            rows.setdefault((corpus, variant), []).append(r)
    if not rows:
        return ""
    steps = sorted({point[0] for rs in rows.values() for r in rs for point in r["curve"]})
    lines = ["| corpus | variant | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for (corpus, variant), rs in rows.items():
        cells = []
        for s in steps:
            values = [v for r in rs for st, _, v in r["curve"] if st == s]
            cells.append(f"{sum(values) / len(values):.3f}" if values else "-")
        lines.append(f"| {corpus} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_compressive(results: dict, path) -> dict:
    """The compressive-memory comparison (:mod:`txl_studies.compressive.run`), one panel per corpus.

    With validation curves in the runs (``"curve": [[step, tokens, value], ...]``): the valid metric
    against training tokens, one line per variant (mean over seeds) with the seeds' range shaded.
    Without: the final valid metric against training tokens/s, one point per run.

    Args:
        results: ``{"corpus/variant/seed": {"value", "unit", "tokens_per_s", "curve"?, ...}}``, and
            optionally ``"speed": {variant: {"tokens_per_s"}}`` (interleaved timing, the x of the
            scatter when present).

    Returns:
        the plotted points ``{"corpus/variant": [(x, value), ...]}`` (x: tokens, or tokens/s).

    Raises:
        TxlError: matplotlib is not installed, or the path cannot be written.
    """
    from txl.analysis.plots import pyplot, save_figure, unit_suffix

    plt = pyplot()
    timed = results.get("speed", {})
    results = {k: v for k, v in results.items() if k.count("/") == 2}  # runs only
    corpora = sorted({key.split("/")[0] for key in results})
    with_curves = all(r.get("curve") for r in results.values())
    fig, axes = plt.subplots(1, len(corpora), figsize=(5.0 * len(corpora), 3.6), squeeze=False)
    points: dict[str, list] = {}
    by_variant: dict[str, list[dict]] = {}
    for key, r in results.items():
        corpus, variant, _ = key.split("/")
        by_variant.setdefault(f"{corpus}/{variant}", []).append(r)
        if not with_curves:
            speed = timed.get(variant, {}).get("tokens_per_s", r["tokens_per_s"])
            points.setdefault(f"{corpus}/{variant}", []).append((speed, r["value"]))
    markers = "osD^vP"
    for ax, corpus in zip(axes[0], corpora):
        names = sorted({k.split("/")[1] for k in by_variant if k.startswith(corpus + "/")})
        for i, name in enumerate(names):
            runs = by_variant[f"{corpus}/{name}"]
            if with_curves:
                tokens = sorted({t for r in runs for _, t, _ in r["curve"]})
                per = [[v for r in runs for _, t2, v in r["curve"] if t2 == t] for t in tokens]
                mean = [sum(v) / len(v) for v in per]
                points[f"{corpus}/{name}"] = list(zip(tokens, mean))
                thousands = [t / 1000 for t in tokens]
                ax.plot(thousands, mean, marker=markers[i % len(markers)], markersize=3, label=name)
                ax.fill_between(thousands, [min(v) for v in per], [max(v) for v in per], alpha=0.2)
            else:
                xs, ys = zip(*points[f"{corpus}/{name}"])
                ax.scatter(xs, ys, marker=markers[i % len(markers)], label=name)
        unit = next(r["unit"] for k, r in results.items() if k.startswith(corpus + "/"))
        if with_curves:
            ax.set_xlabel("training tokens (thousands)")
        else:
            ax.set_xlabel("training tokens/s (interleaved timing)" if timed else "training tokens/s")
        ax.set_ylabel(f"valid {unit}" + unit_suffix(unit))
        ax.set_title(corpus)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path)
    return points


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/cmem")
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--corpora", nargs="+", default=list(CORPORA))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--eval-tokens", type=int, default=16384)
    p.add_argument("--eval-interval", type=int, default=0, help="steps between validations (0: only at the end)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (each one torch thread)")
    p.add_argument("--speed-rounds", type=int, default=3,
                   help="interleaved timing rounds of a training step per variant (0: none)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    todo = [(corpus, name, seed) for corpus in args.corpora for name in args.variants for seed in args.seeds
            if f"{corpus}/{name}/{seed}" not in results]

    def one(job: tuple[str, str, int]) -> tuple[str, dict | str]:
        corpus, name, seed = job
        v = VARIANTS[name]
        run_dir = out / corpus / name / str(seed)
        overrides = [*CORPORA[corpus], f"train.out_dir={run_dir}",
                     f"train.seed={seed}", f"train.max_steps={args.steps}",
                     f"train.eval_interval={args.eval_interval or args.steps}",
                     "train.sample_tokens=0", f"train.eval_max_tokens={args.eval_tokens}",
                     f"train.warmup_steps={max(1, args.steps // 10)}",
                     f"eval.max_tokens={args.eval_tokens}", "model.tgt_len=32",
                     *(f"model.{k}={val}" for k, val in v.items()),
                     f"eval.mem_len={v['mem_len']}", f"eval.cmem_len={v['cmem_len']}"]
        print("run", f"{corpus}/{name}/{seed}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-c", ONE_RUN, "--", *overrides], capture_output=True, text=True)
        if done.returncode:
            return f"{corpus}/{name}/{seed}", done.stderr
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["curve"] = curve(run_dir / "metrics.csv")
        return f"{corpus}/{name}/{seed}", r

    failed = None
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(one, job) for job in todo]
        for future in as_completed(futures):
            if future.cancelled():
                continue
            key, r = future.result()
            if isinstance(r, str):  # start no more runs; the runs already going finish and are kept
                failed = failed or r
                for other in futures:
                    other.cancel()
                continue
            results[key] = r
            results_path.write_text(json.dumps(results, indent=1))
    if failed:
        print(failed, file=sys.stderr)
        return 1
    if args.speed_rounds and "speed" not in results:
        results["speed"] = speed(args.variants, args.speed_rounds)
        results_path.write_text(json.dumps(results, indent=1))

    (out / "compressive.md").write_text(table(results) + "\n" + budget_table(results))
    plot_compressive(results, out / "compressive.png")
    print((out / "compressive.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
