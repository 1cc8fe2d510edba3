"""``txl bench``: throughput and memory of a model config, optionally against transformers' TransfoXL."""

from __future__ import annotations

import argparse
import sys

from txl.cli.common import add_batch_size, add_device, add_dtype, add_force, add_json, check_output, emit_json
from txl.errors import TxlError

NAME = "bench"
HELP = "throughput and memory, optionally against transformers' TransfoXL"
EXAMPLE = "txl bench --vs hf --json benchmarks/results/cpu-bench-small.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` flags (no torch import here)."""
    p.add_argument("--vs", choices=["hf"], help="also run transformers' TransfoXL (same weights) and GPT-2")
    add_device(p)
    add_dtype(p)
    add_batch_size(p, default=16, text="sequences per measured batch", aliases=("--batch",))
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (default 5)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--eval-speedup", action="store_true", help="vanilla sliding window vs memory (paper Table 9)")
    p.add_argument("--lengths", default="128,256,512,800", help="attention lengths for --eval-speedup")
    add_json(p)
    add_force(p)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print its table and write ``--json``; returns the exit status."""
    from txl.analysis.bench import eval_speedup, format_table, run_bench

    if args.batch_size < 1 or args.repeats < 1:
        raise TxlError("--batch-size and --repeats must be >= 1")
    check_output(args, args.json, flag="--json")
    # with --json - the JSON owns stdout: progress and the table go to stderr
    report = sys.stderr if args.json == "-" else sys.stdout

    def log(message: str) -> None:
        print(message, file=report, flush=True)

    if args.eval_speedup:
        try:
            lengths = [int(v) for v in args.lengths.split(",") if v.strip()]
        except ValueError:
            raise TxlError(f"--lengths must be comma-separated integers, got {args.lengths!r}") from None
        if not lengths or min(lengths) < 1:
            raise TxlError("--lengths needs positive integers")
        results = eval_speedup(lengths, device=args.device, repeats=args.repeats, log=log)
    else:
        results = run_bench(vs_hf=args.vs == "hf", device=args.device, dtype=args.dtype, batch=args.batch_size,
                            repeats=args.repeats, memory=not args.no_memory, log=log)
        print(format_table(results), file=report)
    if args.json:
        emit_json(args.json, results, force=args.force)
    return 0
