"""``txl plot RUN_DIR... [--out DIR]``: learning curves; ``--attention CHECKPOINT``: attention distances."""

from __future__ import annotations

import argparse
from pathlib import Path

from txl.errors import TxlError

NAME = "plot"


def register(subparsers) -> None:
    """Add the ``plot`` parser (no torch import here)."""
    p = subparsers.add_parser(NAME, help="learning curves of runs (metrics.csv) or attention-distance maps")
    p.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run directories holding metrics.csv")
    p.add_argument("--out", "-o", default="plots", help="output folder (default: plots)")
    p.add_argument("--labels", help="comma-separated legend labels, one per run")
    p.add_argument("--attention", metavar="CHECKPOINT",
                   help="instead: mean attention distance per layer and head of this checkpoint")
    p.add_argument("--text", help="with --attention: the text to read")
    p.add_argument("--text-file", help="with --attention: read the text from this file")
    p.add_argument("--max-segments", type=int, default=8, help="with --attention: segments to read (default 8)")
    p.add_argument("--mem_len", "--mem-len", type=int, default=None, help="with --attention: memory length")
    p.add_argument("--device", default="auto")


def run(args: argparse.Namespace) -> int:
    """Draw the requested plots; print the written paths."""
    from txl.analysis.plots import pyplot

    if args.attention:
        if args.runs:
            raise TxlError("give either RUN_DIR... (learning curves) or --attention CHECKPOINT, not both")
        return _attention(args)
    if args.text or args.text_file:
        raise TxlError("--text/--text-file go with --attention CHECKPOINT")
    if not args.runs:
        raise TxlError("give at least one RUN_DIR (a directory with metrics.csv) or --attention CHECKPOINT")
    labels = [v.strip() for v in args.labels.split(",")] if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        raise TxlError(f"--labels gives {len(labels)} labels for {len(args.runs)} runs")
    pyplot()
    from txl.analysis.plots import plot_learning_curves

    result = plot_learning_curves(args.runs, args.out, labels)
    for path in result["files"]:
        print(f"wrote {path}")
    return 0


def _attention(args: argparse.Namespace) -> int:
    if bool(args.text) == bool(args.text_file):
        raise TxlError("--attention needs the text to read: give --text TEXT or --text-file FILE")
    if args.max_segments < 1:
        raise TxlError(f"--max-segments must be >= 1, got {args.max_segments}")
    if args.mem_len is not None and args.mem_len < 0:
        raise TxlError(f"--mem-len must be >= 0, got {args.mem_len}")
    if args.text_file:
        try:
            text = Path(args.text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TxlError(f"cannot read {args.text_file}: {err}") from None
    else:
        text = args.text
    from txl.analysis.plots import pyplot

    pyplot()
    from txl.analysis.attention_maps import mean_attention_distance
    from txl.analysis.plots import plot_attention_distance
    from txl.training.checkpoint import load_checkpoint
    from txl.runtime import resolve_device

    ckpt = load_checkpoint(args.attention, map_location=str(resolve_device(args.device)))
    tokens = ckpt.tokenizer.encode(text)
    mem_len = args.mem_len if args.mem_len is not None else ckpt.run.eval.mem_len
    distance = mean_attention_distance(ckpt.model, tokens, mem_len=mem_len, max_segments=args.max_segments)
    cfg = ckpt.model.config
    path = Path(args.out) / "attention_distance.png"
    plot_attention_distance(distance, path, title=f"{ckpt.path.parent.name}: tgt_len {cfg.tgt_len}, mem_len {mem_len}")
    print(f"wrote {path}")
    for layer, row in enumerate(distance):
        print(f"layer {layer}: " + " ".join(f"{d:6.1f}" for d in row))
    return 0
