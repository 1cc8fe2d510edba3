"""``txl plot RUN_DIR... [--out DIR]``: learning curves; ``txl plot CHECKPOINT --attention``: attention distances."""

from __future__ import annotations

import argparse
from pathlib import Path

from txl.cli.checks import check_exists, check_output, check_range
from txl.cli.common import add_data, add_device, add_force, add_span, load_checkpoint, note_threads, print_notes
from txl.errors import TxlError, counted

NAME = "plot"
HELP = "learning curves of runs (metrics.csv) or the attention distances of a checkpoint"
EXAMPLE = "txl plot runs/xl runs/vanilla --labels XL,vanilla --out plots"
MAX_SEGMENTS = 8  # segments --attention reads by default
DETAILS = ("With RUN_DIR...: learning curves from each run's metrics.csv. With CHECKPOINT --attention: the mean "
           "attention distance per layer and head while reading --text TEXT or --data FILE, e.g. "
           "txl plot runs/xl --attention --data notes.txt")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``plot`` flags (no torch import here)."""
    p.set_defaults(_more="runs")  # later items of the list, after an option (see txl.cli.main)
    p.add_argument("runs", nargs="*", metavar="RUN_DIR|CHECKPOINT",
                   help="run directories holding metrics.csv; with --attention: one checkpoint")
    p.add_argument("--out", "-o", default="plots", help="output folder (default: plots)")
    p.add_argument("--labels", help="comma-separated legend labels, one per run")
    # a switch: the older spelling `--attention CHECKPOINT` still parses, its CHECKPOINT landing in the positionals
    p.add_argument("--attention", action="store_true",
                   help="instead of curves: mean attention distance per layer and head of the CHECKPOINT")
    p.add_argument("--text", help="with --attention: the text to read")
    add_data(p, "with --attention: read the text from this file", aliases=("--text-file",))
    p.add_argument("--max-segments", type=int, default=MAX_SEGMENTS,
                   help=f"with --attention: segments to read (default {MAX_SEGMENTS})")
    add_span(p, ("mem_len", "cmem_len"), default_text="the checkpoint's eval config")
    add_device(p)
    add_force(p)


# the files txl_recipes.plot.curves.plot_learning_curves writes into --out
CURVE_FILES = ("curves_steps.png", "curves_time.png", "lr.png", "throughput.png")
ATTENTION_FILE = "attention_distance.png"


def _attention_checkpoint(args: argparse.Namespace) -> str:
    """The checkpoint of ``txl plot CHECKPOINT --attention`` (or the older ``txl plot --attention CHECKPOINT``)."""
    if len(args.runs) != 1:
        raise TxlError(f"--attention reads one CHECKPOINT, got {len(args.runs)}: txl plot CHECKPOINT --attention")
    return args.runs[0]


def run(args: argparse.Namespace) -> int:
    """Draw the requested plots; print the written paths."""
    from txl.analysis.plots import pyplot

    if args.attention:
        return _attention(args, _attention_checkpoint(args))
    reading = [flag for flag, on in (("--text", args.text), ("--data", args.data),
                                     ("--max-segments", args.max_segments != MAX_SEGMENTS),
                                     ("--mem-len", args.mem_len is not None),
                                     ("--cmem-len", args.cmem_len is not None)) if on]
    if reading:  # they say how a checkpoint reads a text: learning curves read none
        raise TxlError(f"{', '.join(reading)} go{'es' if len(reading) == 1 else ''} with CHECKPOINT --attention, "
                       "not with learning curves")
    if not args.runs:
        raise TxlError("give at least one RUN_DIR (a directory with metrics.csv), or CHECKPOINT --attention")
    labels = [v.strip() for v in args.labels.split(",")] if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        raise TxlError(f"--labels gives {counted(len(labels), 'label')} for {counted(len(args.runs), 'run')}")
    for item in args.runs:
        check_exists(item, "run directory", kind="folder", hint="give a run directory with metrics.csv")
    for name in CURVE_FILES:
        check_output(args, str(Path(args.out) / name), args.runs, flag="--out", makes_folder=True)
    pyplot()
    from txl_recipes.plot.curves import plot_learning_curves

    result = plot_learning_curves(args.runs, args.out, labels)
    for path in result["files"]:
        print(f"wrote {path}")
    return 0


def _attention(args: argparse.Namespace, checkpoint: str) -> int:
    """``txl plot CHECKPOINT --attention``: draw attention_distance.png and print the table."""
    if bool(args.text) == bool(args.data):
        raise TxlError("--attention needs the text to read: give --text TEXT or --data FILE")
    check_range(args, 1, "max_segments")
    check_exists(checkpoint, "checkpoint", kind="folder")
    check_exists(args.data, "--data", kind="file")
    if args.data:  # bytes now, text once the tokenizer is known (decode_file_text)
        from txl.fileio import read_bytes

        raw = read_bytes(args.data)
    check_output(args, str(Path(args.out) / ATTENTION_FILE), [checkpoint, args.data], flag="--out",
                 makes_folder=True)
    from txl.analysis.plots import pyplot

    pyplot()
    from txl_recipes.plot.attention import compressed_attention_mass, mean_attention_distance, plot_attention_distance

    note_threads(args)
    ckpt, _ = load_checkpoint(args, checkpoint)
    if args.data:
        from txl.data.tokenizers import decode_file_text

        text = decode_file_text(raw, ckpt.tokenizer.kind, args.data)
    else:
        text = args.text
    tokens = ckpt.tokenizer.encode(text)
    if len(tokens) == 0:
        raise TxlError(f"{f'--data {args.data}' if args.data else '--text'} encodes to no tokens; give a longer text")
    print_notes(args)  # the threads (the input has passed its checks)
    mem_len = args.mem_len if args.mem_len is not None else ckpt.run.eval.mem_len
    cmem_len = args.cmem_len if args.cmem_len is not None else (ckpt.run.eval.cmem_len if ckpt.run.eval.cmem_len
                                                                   is not None else ckpt.model.config.cmem_len)
    distance = mean_attention_distance(ckpt.model, tokens, mem_len=mem_len, max_segments=args.max_segments,
                                       cmem_len=cmem_len)
    cfg = ckpt.model.config
    path = Path(args.out) / ATTENTION_FILE
    plot_attention_distance(distance, path, title=f"{ckpt.path.parent.name}: tgt_len {cfg.tgt_len}, mem_len {mem_len}")
    print(f"wrote {path}")
    for layer, row in enumerate(distance):
        print(f"layer {layer}: " + " ".join(f"{d:6.1f}" for d in row))
    if cmem_len:
        mass = compressed_attention_mass(ckpt.model, tokens, mem_len=mem_len, cmem_len=cmem_len,
                                         max_segments=args.max_segments)
        print(f"attention on the compressed memory ({cmem_len} slots), share per head:")
        for layer, row in enumerate(mass):
            print(f"layer {layer}: " + " ".join(f"{m:6.3f}" for m in row))
    return 0
