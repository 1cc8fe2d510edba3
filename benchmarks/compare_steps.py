"""Decoding steps of two commits, taken in turns by two processes that stay alive: ratios head / base.

``compare_commits.py`` starts a fresh ``txl bench`` per part and round, so a slow minute of a shared
machine falls on one side only; a decoding step of bench-small lasts 0.5-2 ms, and such runs have
moved by 10-15% between identical trees. Here each tree gets one worker process per row, built
(and compiled) once; the two workers of a row then take ``--rounds`` turns, in alternating order, each
turn reading the same 127-token prompt and timing ``--tokens`` greedy steps (median seconds per step).
The ratio of a row is the median over the turns of base time / head time, so the machine's drift falls
on both sides of every ratio.

Rows: ``float32 eager`` (``txl.generation.generate_steps``, what ``txl generate`` runs) and
``int8 compiled`` (the int8 model's ring step under ``torch.compile``, as ``txl generate --compile
--quantize int8`` decodes), each at batch 1 and 8; bench-small, ``mem_len`` 128.

    OMP_NUM_THREADS=2 python benchmarks/compare_steps.py --base 4c3cd8c \\
        --json benchmarks/results/compare-steps-<change>.json

``--head`` defaults to this checkout's working tree; ``--base`` is checked out into a temporary git
worktree. The worker runs inside each tree's own ``src`` (the code below uses only what both trees
have). Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compare_commits import checkouts, python_path  # noqa: E402  (the two trees, checked out the same way)

ROWS = ("float32 eager", "int8 compiled")


def worker(row: str, batch: int, tokens: int) -> None:
    """Build the row's decoder, say "ready", then time ``tokens`` steps for every line read from stdin."""
    import torch

    try:  # a tree from before the studies left the library
        from txl.analysis.bench import BENCH_SMALL
    except ImportError:
        from txl_studies.speed.bench import BENCH_SMALL
    from txl.generation import generate_steps
    from txl.model import TransformerXLConfig, TransformerXLLM
    from txl.kernels.int8 import quantize_int8
    try:
        from txl.generation.compiled import RingDecoder
    except ImportError:  # older commits keep it in txl.model
        try:
            from txl.model.graphs import RingDecoder
        except ImportError:
            from txl.model.ring import RingDecoder

    torch.manual_seed(0)
    config = TransformerXLConfig(**dict(BENCH_SMALL, dropout=0.0))
    model = TransformerXLLM(config).eval()
    span = config.span.replace(mem_len=128)
    prompt = torch.randint(0, config.vocab_size, (batch, 128), generator=torch.Generator().manual_seed(1))
    if row == "int8 compiled":
        decoder = RingDecoder(quantize_int8(model), span, compile=True)
        decoder.read_prompt(prompt[:, :8])
        decoder.step(prompt[:, -1:])  # compiles the step

    def steps():
        if row == "float32 eager":
            it = generate_steps(model, prompt, tokens + 1, span=span, temperature=0.0)
            next(it)  # reads the prompt, samples the first token (not timed)
            for _ in range(tokens):
                yield lambda: next(it)
            return
        decoder.read_prompt(prompt[:, :-1])
        token = prompt[:, -1:]
        for _ in range(tokens):
            def one():
                nonlocal token
                token = decoder.step(token).argmax(-1, keepdim=True)
            yield one

    print("ready", flush=True)
    for _ in sys.stdin:
        times = []
        for step in steps():
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        print(statistics.median(times), flush=True)


def compare(trees: dict[str, Path], row: str, batch: int, rounds: int, tokens: int, threads: str) -> dict:
    """One row: both trees' workers, ``rounds`` turns each in alternating order; seconds per step and ratios."""
    workers, logs = {}, {side: tempfile.TemporaryFile("w+") for side in trees}  # stderr: a pipe could fill up
    for side, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": python_path(tree), "OMP_NUM_THREADS": threads}
        command = [sys.executable, __file__, "--worker", row, str(batch), str(tokens)]
        workers[side] = subprocess.Popen(command, env=env, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=logs[side], text=True)
    try:
        for side, proc in workers.items():
            if proc.stdout.readline().strip() != "ready":
                proc.wait()
                logs[side].seek(0)
                raise SystemExit(f"compare_steps.py: the {side} worker for {row!r} failed: "
                                 + " | ".join(logs[side].read().strip().splitlines()[-3:]))
        seconds: dict[str, list[float]] = {"base": [], "head": []}
        for r in range(rounds):
            for side in ("base", "head") if r % 2 == 0 else ("head", "base"):
                workers[side].stdin.write("go\n")
                workers[side].stdin.flush()
                seconds[side].append(float(workers[side].stdout.readline()))
    finally:
        for side, proc in workers.items():
            proc.stdin.close()
            proc.wait()
            logs[side].close()
    ratios = [b / h for b, h in zip(seconds["base"], seconds["head"])]
    return {"row": row, "batch": batch, "base_tokens_per_s": batch / statistics.median(seconds["base"]),
            "head_tokens_per_s": batch / statistics.median(seconds["head"]), "ratio": statistics.median(ratios),
            "ratios": [round(x, 3) for x in ratios]}


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit before the change (any git revision)")
    ap.add_argument("--head", help="the commit of the change (default: this checkout's working tree)")
    ap.add_argument("--rounds", type=int, default=12, help="turns of each worker per row (default 12)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy steps timed per turn (default 64)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS),
                    help="which rows (default both; 'int8 compiled' needs a C++ compiler and, at older bases, VNNI)")
    ap.add_argument("--floor", type=float, default=0.95, help="flag a ratio head / base below this (default 0.95)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.rounds < 1 or args.tokens < 1:
        raise SystemExit("compare_steps.py: --rounds and --tokens must be >= 1")
    threads = os.environ.get("OMP_NUM_THREADS", "2")
    start, rows = time.time(), []
    with checkouts(args.base, args.head, "txl-steps-") as (commits, trees):
        for row in args.rows:
            for batch in args.batch_size:
                rows.append(compare(trees, row, batch, args.rounds, args.tokens, threads))
                r = rows[-1]
                flag = "  SLOWER" if r["ratio"] < args.floor else ""
                print(f"{row:14s} batch {batch}: base {r['base_tokens_per_s']:7.0f} head "
                      f"{r['head_tokens_per_s']:7.0f} tokens/s  ratio {r['ratio']:.3f}{flag}", flush=True)
    sys.path.insert(0, str(ROOT / "src"))
    from txl.runtime import cpu_flags

    results = {"command": "python " + shlex.join(sys.argv), "date": time.strftime("%Y-%m-%d"), "commits": commits,
               "rounds": args.rounds, "tokens": args.tokens, "threads": threads, "cpu_flags": sorted(cpu_flags() or ()),
               "wall_s": round(time.time() - start), "floor": args.floor, "rows": rows,
               "slower": [f"{r['row']} batch {r['batch']}" for r in rows if r["ratio"] < args.floor]}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
