"""``txl bench``: throughput and memory of a model config, optionally against transformers' TransfoXL."""

from __future__ import annotations

import argparse
import sys

from txl.cli.common import (add_batch_size, add_device, add_dtype, add_force, add_json, check_output, emit_json,
                            note_threads, parse_ints, print_notes, require_installed)
from txl.errors import TxlError

NAME = "bench"
HELP = "throughput and memory, optionally against transformers' TransfoXL"
EXAMPLE = "txl bench --vs hf --json benchmarks/results/cpu-bench-small.json"
LENGTHS = "128,256,512,800,1800,2800,3800"  # --eval-speedup's default attention lengths


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` flags (no torch import here)."""
    p.add_argument("--vs", choices=["hf"], help="also run transformers' TransfoXL (same weights) and GPT-2")
    add_device(p)
    add_dtype(p)
    add_batch_size(p, default=16, text="sequences per measured batch", aliases=("--batch",))
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (default 5)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--eval-speedup", action="store_true", help="vanilla sliding window vs memory (paper Table 9)")
    p.add_argument("--model", choices=["bench-small", "enwik8-large"], default=None,
                   help="model for --eval-speedup: bench-small (6 layers, d_model 256; batch 8, about 2 minutes on "
                        "2 cores) or enwik8-large, the paper's 24-layer model evaluated at length 3,800 "
                        "(batch 1, about 5 minutes); default bench-small")
    p.add_argument("--lengths", default=LENGTHS,
                   help="attention lengths for --eval-speedup (default: 128-800 and the paper's 1800, 2800, 3800)")
    p.add_argument("--gen-lengths", default=None, metavar="L,L,...",
                   help="instead: greedy generation tokens/s against the length attended to (txl mem_len = L, "
                        "GPT-2 after L tokens; needs --vs hf for GPT-2), e.g. 128,512,1024,2048,3800")
    add_json(p)
    add_force(p)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print its table and write ``--json``; returns the exit status."""
    if args.batch_size < 1 or args.repeats < 1:
        raise TxlError("--batch-size and --repeats must be >= 1")
    _check_modes(args)
    if args.vs == "hf":
        require_installed("transformers", message="--vs hf needs transformers: pip install transformers==4.35.2 "
                                                  "(the version the tests use as an oracle)")
    lengths = parse_ints(args.lengths, "--lengths", 1) if args.eval_speedup else None
    gen_lengths = parse_ints(args.gen_lengths, "--gen-lengths", 1) if args.gen_lengths else None
    check_output(args, args.json, flag="--json")
    from txl.analysis.bench import eval_speedup, format_table, run_bench  # torch: once the arguments are checked

    note_threads(args)
    print_notes(args)  # the threads: the arguments have passed their checks
    # with --json - the JSON owns stdout: progress and the table go to stderr
    report = sys.stderr if args.json == "-" else sys.stdout

    def log(message: str) -> None:
        print(message, file=report, flush=True)

    if args.dtype not in (None, "float32"):
        from txl import runtime

        device = runtime.resolve_device(args.device)
        if not runtime.native_dtype_support(device, args.dtype):
            # an emulated half-precision run measures the emulation, not txl: nothing worth reporting
            log(f"txl bench: skipping --dtype {args.dtype}: this {device.type} has no native {args.dtype} "
                "arithmetic (on x86 CPUs: AVX512-BF16 or AMX), so it would only be emulated, many times slower "
                "than float32; run the float32 benchmark here, or this one on a CPU or GPU with native support")
            return 0
    if args.eval_speedup:
        from txl.analysis.bench import EVAL_PRESETS

        model = args.model or "bench-small"
        config, batch = EVAL_PRESETS[model]
        results = eval_speedup(lengths, device=args.device, batch=batch, repeats=args.repeats, config=config, log=log)
        results["model"] = model
    elif args.gen_lengths:
        from txl.analysis.bench import BENCH_SMALL
        from txl.analysis.bench_generation import generation_lengths
        from txl.runtime import resolve_device

        rows = generation_lengths(BENCH_SMALL, gen_lengths, device=resolve_device(args.device), repeats=args.repeats,
                                  with_gpt2=args.vs == "hf", log=log)
        from txl.analysis.bench import hardware

        results = {"hardware": hardware(resolve_device(args.device)), "config": BENCH_SMALL, "generation_lengths": rows}
    else:
        results = run_bench(vs_hf=args.vs == "hf", device=args.device, dtype=args.dtype, batch=args.batch_size,
                            repeats=args.repeats, memory=not args.no_memory, log=log)
        print(format_table(results), file=report)
    if args.json:
        emit_json(args.json, results, force=args.force)
    return 0


def _check_modes(args: argparse.Namespace) -> None:
    """Refuse a flag the chosen mode would ignore (one line naming it), rather than measure without it."""
    given = {"--vs hf": args.vs is not None, "--dtype": args.dtype not in (None, "float32"),
             "--batch-size": args.batch_size != 16, "--no-memory": args.no_memory,
             "--gen-lengths": args.gen_lengths is not None, "--model": args.model is not None,
             "--lengths": args.lengths != LENGTHS}
    if args.eval_speedup:
        mode, ignored = "--eval-speedup", ("--vs hf", "--dtype", "--batch-size", "--no-memory", "--gen-lengths")
    elif args.gen_lengths is not None:
        mode, ignored = "--gen-lengths", ("--dtype", "--batch-size", "--no-memory", "--model", "--lengths")
    else:
        mode, ignored = "the speed table", ("--model", "--lengths")
    for flag in ignored:
        if given[flag]:
            raise TxlError(f"{flag} does not apply to {mode} (it would be ignored); leave it out")
