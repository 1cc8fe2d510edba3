"""Evaluation with memory in fresh processes: two commits side by side, with each call's page faults.

A ``txl bench`` row is one process, and the same code can run at two speeds in two processes: where
glibc's C heap hands the top of its free memory back to the system (it trims once more than a threshold
is free there) and the next layer's temporary tensors fault it in again, every call pays those page
faults. Which processes do depends on their allocations' history, so a comparison of two commits that
starts one process per commit can find a difference that is the heap's, not the code's.

This starts ``--launches`` fresh pairs of processes, one per commit (the order alternating), and in each
pair alternates ``--rounds`` timed rounds between the two. A round is 20 calls of a segment of 128 tokens
after a full memory of 128 (bench-small, a decoding state: how ``txl bench`` times evaluation with
memory); it reports the median call as tokens/s and the minor page faults per call (``getrusage``).

    OMP_NUM_THREADS=2 python benchmarks/eval_launches.py --base 2890aca --head 83af4cc --batch 1 \\
        --launches 10 --json benchmarks/results/eval-launches-83af4cc.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_commits import checkouts, python_path  # noqa: E402

BENCH_SMALL = dict(vocab_size=256, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024, tgt_len=128,
                   mem_len=128, dropout=0.0)
CALLS = 20


def worker(batch: int, bf16: bool) -> None:
    """Answer each line of stdin with one round: ``{"seconds": median call, "faults": minor faults per call}``
    (``bf16``: the model's weights in bfloat16, as ``txl eval --quantize bf16`` reads)."""
    import torch

    import txl
    from txl.model import TransformerXLConfig, TransformerXLLM

    # where the commit has them (asked of its own tree: an editable install of another checkout would
    # answer for modules this one lacks)
    package = Path(txl.__file__).parent
    if (package / "segments.py").is_file():
        from txl.segments import decoding_state
    else:
        from txl.model.segments import decoding_state
    torch.manual_seed(0)
    model = TransformerXLLM(TransformerXLConfig(**BENCH_SMALL)).eval()
    if bf16:
        if (package / "kernels").is_dir():
            from txl.kernels.int8 import to_bfloat16
        else:
            from txl.model.quantize import to_bfloat16
        model = to_bfloat16(model)
    memory = torch.randint(0, 256, (batch, 128))
    segment = torch.randint(0, 256, (batch, 128))
    with torch.no_grad():
        state = decoding_state(model, model.config.span)
        model(memory, caches=state)
        for _ in range(5):
            model(segment, caches=state)
        print("ready", flush=True)
        for _ in sys.stdin:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            seconds = []
            for _ in range(CALLS):
                start = time.perf_counter()
                model(segment, caches=state)
                seconds.append(time.perf_counter() - start)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            print(json.dumps({"seconds": statistics.median(seconds), "faults": faults / CALLS}), flush=True)


def launch(trees: dict[str, Path], paths: dict[str, str], order: tuple[str, str], batch: int, rounds: int,
           threads: str, bf16: bool) -> dict:
    """One pair of fresh workers (``paths``: each side's PYTHONPATH); their rounds, alternated. Returns per
    side the median tokens/s and the median faults per call."""
    procs = {}
    try:
        for side in order:
            env = {**os.environ, "PYTHONPATH": paths[side], "OMP_NUM_THREADS": threads}
            procs[side] = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(batch)]
                                           + ["--bf16"] * bf16, env=env,
                                           cwd=trees[side], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if procs[side].stdout.readline().strip() != "ready":
                raise SystemExit(f"eval_launches.py: the {side} worker did not start (see its error above)")
        found: dict[str, list[dict]] = {side: [] for side in order}
        for r in range(rounds):
            for side in order if r % 2 == 0 else order[::-1]:
                procs[side].stdin.write("go\n")
                procs[side].stdin.flush()
                line = procs[side].stdout.readline()
                if not line:
                    raise SystemExit(f"eval_launches.py: the {side} worker stopped (see its error above)")
                found[side].append(json.loads(line))
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    return {side: {"tokens_per_s": batch * 128 / statistics.median(r["seconds"] for r in runs),
                   "faults_per_call": statistics.median(r["faults"] for r in runs)} for side, runs in found.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="the commit before the change (any git revision)")
    ap.add_argument("--head", help="the commit of the change (default: this checkout's working tree)")
    ap.add_argument("--batch", type=int, default=1, help="rows per call (default 1)")
    ap.add_argument("--launches", type=int, default=8, help="fresh process pairs (default 8)")
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds per process (default 4)")
    ap.add_argument("--bf16", action="store_true", help="the weights in bfloat16 (as txl eval --quantize bf16 reads)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.bf16)
        return 0
    if not args.base or min(args.batch, args.launches, args.rounds) < 1:
        raise SystemExit("eval_launches.py: give --base, and --batch, --launches and --rounds of at least 1")
    threads = os.environ.get("OMP_NUM_THREADS", "2")
    start = time.time()
    launches = []
    with checkouts(args.base, args.head, "txl-launches-") as (commits, trees):
        paths = {side: python_path(tree) for side, tree in trees.items()}
        for n in range(args.launches):
            order = ("base", "head") if n % 2 == 0 else ("head", "base")
            row = launch(trees, paths, order, args.batch, args.rounds, threads, args.bf16)
            row["ratio"] = row["head"]["tokens_per_s"] / row["base"]["tokens_per_s"]
            launches.append(row)
            print(f"launch {n + 1}/{args.launches}: " + ", ".join(
                f"{side} {row[side]['tokens_per_s']:,.0f} tokens/s ({row[side]['faults_per_call']:,.0f} faults per call)"
                for side in ("base", "head")) + f", head / base {row['ratio']:.3f}", flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from txl.runtime import cpu_flags

    ratios = [row["ratio"] for row in launches]
    results = {"command": "python " + shlex.join(sys.argv), "date": time.strftime("%Y-%m-%d"), "commits": commits,
               "batch": args.batch, "weights": "bfloat16" if args.bf16 else "float32", "launches": args.launches,
               "rounds": args.rounds, "calls_per_round": CALLS, "threads": threads, "cpu_flags": sorted(cpu_flags() or ()), "wall_s": round(time.time() - start),
               "median_ratio": statistics.median(ratios), "rows": launches}
    print(f"head / base, median over launches: {results['median_ratio']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
