"""``txl bench``: throughput and memory of a model config, optionally against transformers' TransfoXL."""

from __future__ import annotations

import argparse
import sys

from txl.cli.checks import check_output, parse_ints, require_installed
from txl.cli.common import (add_batch_size, add_device, add_dtype, add_force, add_json, emit_json, note_threads,
                            print_notes)
from txl.errors import TxlError

NAME = "bench"
HELP = "throughput and memory, optionally against transformers' TransfoXL"
EXAMPLE = ("txl bench --vs hf --json benchmarks/results/cpu-bench-small.json\n  txl bench --long-range --out runs/long-range\n"
           "  txl bench --quantize int8 --json benchmarks/results/int8.json\n  txl bench --compile\n  txl bench --export")
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
                   help="model for --eval-speedup, --quantize, --compile and --export: bench-small (6 layers, d_model 256; batch 8, 2-4 minutes on "
                        "2 cores) or enwik8-large, the paper's 24-layer model evaluated at length 3,800 "
                        "(batch 1, about 5 minutes); default bench-small")
    p.add_argument("--lengths", default=LENGTHS,
                   help="attention lengths for --eval-speedup (default: 128-800 and the paper's 1800, 2800, 3800)")
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="instead: int8 (and, on a CPU with native bfloat16, bfloat16) weights against float32 on "
                        "--model, decoding at batch 1 and 8 and evaluation with memory, side by side, with the int8 "
                        "model also under torch.compile (inductor: needs a C++ compiler; docs/quantization.md)")
    p.add_argument("--compile", action="store_true",
                   help="instead: the model under torch.compile against eager on --model, a training segment and "
                        "an evaluation segment with memory, side by side (docs/compile.md)")
    p.add_argument("--export", action="store_true",
                   help="instead: --model exported to ONNX (txl export) and decoded by ONNX Runtime against txl's "
                        "eager decoding, batch 1 and 8, side by side (docs/export.md; needs the export extra)")
    p.add_argument("--gen-lengths", default=None, metavar="L,L,...",
                   help="instead: greedy generation tokens/s against the length attended to (txl mem_len = L, "
                        "GPT-2 after L tokens; needs --vs hf for GPT-2), e.g. 128,512,1024,2048,3800")
    add_json(p)
    add_force(p)
    g = p.add_argument_group("long-range retrieval (--long-range; docs/long-range.md)")
    g.add_argument("--long-range", action="store_true",
                   help="train the memory rows on facts in real text and measure exact retrieval against distance")
    g.add_argument("--out", default=None, metavar="DIR",
                   help="--long-range: new or empty output folder (default runs/long-range)")
    g.add_argument("--rows", default=None, metavar="A,B,...",
                   help="--long-range: rows to train (default the equal-budget rows: mem64,mem256,mem1024,cmem,mem0,abs,"
                        "mem64-bptt4; also mem64-bptt2 (--steps 3000) and mem64-L4-bptt4 (--steps 2000), the recipes "
                        "that use the stacked reach: docs/long-range.md)")
    g.add_argument("--seeds", type=int, default=3, metavar="N", help="--long-range: seeds per row (default 3)")
    g.add_argument("--first-seed", type=int, default=0, metavar="S",
                   help="--long-range: the first seed (default 0): --first-seed 2 --seeds 1 runs seed 2 alone, "
                        "with the numbers it gives in a full run")
    g.add_argument("--steps", type=int, default=None, metavar="N",
                   help="--long-range: training steps per row (default 1000, of 32 episodes each)")
    g.add_argument("--episodes", type=int, default=None, metavar="N",
                   help="--long-range: episodes per task and distance (default 64)")
    g.add_argument("--pool", type=int, default=None, metavar="N",
                   help="--long-range: distinct training episodes a row draws its steps from (default 16384; "
                        "steps x 32 makes every training episode new)")
    g.add_argument("--distances", default=None, metavar="D,D,...",
                   help="--long-range: distances asked (default 16,64,256,512,1024,2048,4096,8192; each row is "
                        "also asked at its direct reach and twice that)")
    g.add_argument("-q", "--quiet", action="store_true", help="--long-range: no progress bars")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print its table and write ``--json``; returns the exit status."""
    if args.batch_size < 1 or args.repeats < 1:
        raise TxlError("--batch-size and --repeats must be >= 1")
    _check_modes(args)
    if args.long_range:
        return _long_range(args)
    if args.vs == "hf":
        require_installed("transformers", message="--vs hf needs transformers: pip install transformers==4.35.2 "
                                                  "(the version the tests use as an oracle)")
    lengths = parse_ints(args.lengths, "--lengths", 1) if args.eval_speedup else None
    gen_lengths = parse_ints(args.gen_lengths, "--gen-lengths", 1) if args.gen_lengths else None
    check_output(args, args.json, flag="--json")
    from txl_studies.speed.bench import eval_speedup, format_table, run_bench  # torch: once the arguments are checked

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
        from txl_studies.speed.bench import EVAL_PRESETS

        model = args.model or "bench-small"
        config, batch = EVAL_PRESETS[model]
        results = eval_speedup(lengths, device=args.device, batch=batch, repeats=args.repeats, config=config, log=log)
        results["model"] = model
    elif args.quantize:
        from txl_studies.speed.bench import hardware
        from txl_studies.speed.quantize import quantize_table
        from txl.runtime import resolve_device

        if resolve_device(args.device).type != "cpu":
            raise TxlError("--quantize measures the int8 kernels of a CPU; run it with --device cpu")
        from txl_studies.speed.bench import EVAL_PRESETS

        model = args.model or "bench-small"
        from txl.runtime import native_dtype_support

        bf16 = native_dtype_support(resolve_device("cpu"), "bfloat16")  # emulated bf16 would measure the emulation
        if not bf16:
            log("txl bench: no bfloat16 column: this CPU has no native bfloat16 arithmetic (AVX512-BF16 or AMX)")
        results = {"hardware": hardware(resolve_device("cpu")), "model": model,
                   **quantize_table(EVAL_PRESETS[model][0], repeats=args.repeats, bf16=bf16, log=log)}
    elif args.compile:
        from txl_studies.speed.bench import EVAL_PRESETS, hardware
        from txl_studies.speed.compile import compile_table
        from txl.runtime import resolve_device

        device = resolve_device(args.device)
        model = args.model or "bench-small"
        config, batch = EVAL_PRESETS[model]
        results = {"hardware": hardware(device), "model": model,
                   **compile_table(config, batch=batch, repeats=args.repeats, device=device, log=log)}
    elif args.export:
        from txl_studies.speed.bench import EVAL_PRESETS, hardware
        from txl_studies.speed.export import export_table
        from txl.runtime import resolve_device

        if resolve_device(args.device).type != "cpu":
            raise TxlError("--export measures ONNX Runtime's CPU provider; run it with --device cpu")
        for package in ("onnx", "onnxscript", "onnxruntime"):
            require_installed(package, message=f"--export needs {package}: in the txl folder, "
                                                ".venv/bin/python -m pip install -e '.[export]'")
        model = args.model or "bench-small"
        results = {"hardware": hardware(resolve_device("cpu")), "model": model,
                   **export_table(EVAL_PRESETS[model][0], repeats=args.repeats, log=log)}
    elif args.gen_lengths:
        from txl_studies.speed.bench import BENCH_SMALL
        from txl_studies.speed.generation import generation_lengths
        from txl.runtime import resolve_device

        rows = generation_lengths(BENCH_SMALL, gen_lengths, device=resolve_device(args.device), repeats=args.repeats,
                                  with_gpt2=args.vs == "hf", log=log)
        from txl_studies.speed.bench import hardware

        results = {"hardware": hardware(resolve_device(args.device)), "config": BENCH_SMALL, "generation_lengths": rows}
    else:
        results = run_bench(vs_hf=args.vs == "hf", device=args.device, dtype=args.dtype, batch=args.batch_size,
                            repeats=args.repeats, memory=not args.no_memory, log=log)
        print(format_table(results), file=report)
    if args.json:
        emit_json(args.json, results, force=args.force)
    return 0


LONG_RANGE_FLAGS = ("--out", "--rows", "--seeds", "--first-seed", "--steps", "--episodes", "--pool", "--distances",
                    "--quiet")


def _check_modes(args: argparse.Namespace) -> None:
    """Refuse a flag the chosen mode would ignore (one line naming it), rather than measure without it."""
    given = {"--vs hf": args.vs is not None, "--dtype": args.dtype not in (None, "float32"),
             "--batch-size": args.batch_size != 16, "--no-memory": args.no_memory,
             "--gen-lengths": args.gen_lengths is not None, "--model": args.model is not None,
             "--lengths": args.lengths != LENGTHS, "--eval-speedup": args.eval_speedup,
             "--quantize": args.quantize is not None, "--compile": args.compile,
             "--export": args.export, "--repeats": args.repeats != 5, "--json": args.json is not None,
             "--out": args.out is not None, "--rows": args.rows is not None, "--seeds": args.seeds != 3,
             "--first-seed": args.first_seed != 0,
             "--steps": args.steps is not None, "--episodes": args.episodes is not None,
             "--pool": args.pool is not None, "--distances": args.distances is not None, "--quiet": args.quiet}
    if args.long_range:
        for flag in ("--vs hf", "--dtype", "--batch-size", "--no-memory", "--gen-lengths", "--model", "--lengths",
                     "--eval-speedup", "--repeats", "--json", "--quantize", "--compile", "--export"):
            if given[flag]:
                raise TxlError(f"{flag} does not apply to --long-range (it would be ignored); leave it out")
        return
    for flag in LONG_RANGE_FLAGS:
        if given[flag]:
            raise TxlError(f"{flag} applies to --long-range only; add --long-range or leave it out")
    if args.quantize:
        mode, ignored = "--quantize", ("--vs hf", "--dtype", "--batch-size", "--no-memory", "--gen-lengths",
                                       "--lengths", "--eval-speedup", "--compile", "--export")
    elif args.compile:
        mode, ignored = "--compile", ("--vs hf", "--dtype", "--batch-size", "--no-memory", "--gen-lengths",
                                      "--lengths", "--eval-speedup", "--export")
    elif args.export:
        mode, ignored = "--export", ("--vs hf", "--dtype", "--batch-size", "--no-memory", "--gen-lengths",
                                     "--lengths", "--eval-speedup")
    elif args.eval_speedup:
        mode, ignored = "--eval-speedup", ("--vs hf", "--dtype", "--batch-size", "--no-memory", "--gen-lengths", "--quantize",
                                           "--export")
    elif args.gen_lengths is not None:
        mode, ignored = "--gen-lengths", ("--dtype", "--batch-size", "--no-memory", "--model", "--lengths", "--quantize",
                                          "--export")
    else:
        mode, ignored = "the speed table", ("--model", "--lengths")
    for flag in ignored:
        if given[flag]:
            raise TxlError(f"{flag} does not apply to {mode} (it would be ignored); leave it out")


def _long_range(args: argparse.Namespace) -> int:
    """``txl bench --long-range``: train the rows, print the table; results in ``--out``."""
    from txl.cli.checks import check_range

    check_range(args, 1, "seeds", "steps", "episodes", "pool")
    check_range(args, 0, "first_seed")
    default = ("mem64", "mem256", "mem1024", "cmem", "mem0", "abs", "mem64-bptt4")  # studies.long_range.suite.ROWS (no torch)
    known = (*default, "mem64-bptt2", "mem64-L4-bptt4")  # and EXTRA_ROWS, run only when named
    names = [n.strip() for n in args.rows.split(",")] if args.rows else list(default)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise TxlError(f"--rows takes names among {', '.join(known)}, got {args.rows!r}")
    distances = tuple(parse_ints(args.distances, "--distances", 8)) if args.distances else None
    out = args.out or "runs/long-range"
    from pathlib import Path

    if Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise TxlError(f"--out {out} already exists and is not an empty folder; choose a new folder (nothing was changed)")
    require_installed("matplotlib", message="--long-range draws its plot with matplotlib: in the txl folder, "
                                            ".venv/bin/python -m pip install -e '.[plot]'")
    from txl_studies.long_range.suite import DISTANCES, EXTRA_ROWS, ROWS, TABLE_NAME, Budget, run_long_range

    note_threads(args)
    print_notes(args)
    budget = Budget()
    budget = Budget(**{**budget.__dict__, **{k: v for k, v in (("steps", args.steps), ("episodes", args.episodes),
                                                                ("pool", args.pool)) if v is not None}})
    rows = tuple(r for r in ROWS + EXTRA_ROWS if r.name in names)
    run_long_range(out, rows=rows, seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)), budget=budget, distances=distances or DISTANCES,
                   progress=not args.quiet, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(Path(out, TABLE_NAME).read_text(encoding="utf-8"))
    print(f"wrote {out}/{TABLE_NAME}, results.json and long_range.png")
    return 0
