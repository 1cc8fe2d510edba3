"""``txl recl CHECKPOINT... --data FILE``: relative effective context length of a model group (paper §4.3)."""

from __future__ import annotations

import argparse
from pathlib import Path

from txl.cli.checks import check_output, check_exists, finite_float
from txl.cli.common import add_batch_size, add_data, add_device, add_dtype, add_force, add_json, emit_json, human_stream
from txl.errors import TxlError, counted
from txl_studies.flags import finite_floats

NAME = "recl"
HELP = "relative effective context length (RECL) of a group of models"
EXAMPLE = "txl recl runs/xl runs/vanilla --data data/wikitext-103/test.txt --names XL,vanilla --out results/recl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``recl`` flags (no torch import here)."""
    p.set_defaults(_more="checkpoints")  # later items of the list, after an option (see txl.cli.main)
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="checkpoint or run directories (uses best/); the group shares one baseline")
    add_data(p, "text file or directory to score (encoded with each model's tokenizer; default: the test split "
                "of the runs' own corpus)")
    p.add_argument("--names", help="comma-separated labels for the models (default: directory names)")
    p.add_argument("--start", type=int, default=16, help="first context length c (tokens, default 16)")
    p.add_argument("--delta", type=int, default=16, help="step between context lengths (default 16)")
    p.add_argument("--max-context", type=int, default=256, help="longest context length (default 256)")
    p.add_argument("--ratios", type=finite_floats(), default="0.1,0.5,1.0", metavar="R1,R2,...",
                   help="top-r ratios (default 0.1,0.5,1.0)")
    p.add_argument("--threshold", type=finite_float, default=0.01, help="relative gain threshold (paper: 0.01)")
    p.add_argument("--positions", type=int, default=2000,
                   help="number of scored positions, evenly spread over the text (0: all; default 2000)")
    add_batch_size(p, default=64, text="windows per forward pass")
    add_dtype(p)
    add_device(p)
    p.add_argument("--out", "-o", help="new or empty folder for recl.json, recl.md and recl_gain.png")
    add_json(p)
    add_force(p)
    p.add_argument("--no-plot", action="store_true", help="do not draw recl_gain.png")


def _check(args: argparse.Namespace) -> tuple[list[int], list[float], list[str]]:
    if args.start < 1 or args.delta < 1 or args.max_context < args.start + args.delta:
        raise TxlError("need --start >= 1, --delta >= 1 and --max-context >= start + delta")
    if args.batch_size < 1 or args.positions < 0:
        raise TxlError("--batch-size must be >= 1 and --positions >= 0")
    if not 0.0 <= args.threshold < 1.0:
        raise TxlError(f"--threshold must be in [0, 1), got {args.threshold}")
    ratios = args.ratios  # finite numbers (finite_floats)
    if any(not 0.0 < r <= 1.0 for r in ratios):
        raise TxlError(f"--ratios must lie in (0, 1], got {','.join(f'{r:g}' for r in ratios)}")
    for item in args.checkpoints:  # paths before torch is imported
        check_exists(item, "checkpoint", kind="folder")
    check_exists(args.data, "--data")
    contexts = list(range(args.start, args.max_context + 1, args.delta))
    names = ([n.strip() for n in args.names.split(",")] if args.names
             else [Path(c).resolve().name for c in args.checkpoints])
    if len(names) != len(args.checkpoints):
        raise TxlError(f"--names gives {counted(len(names), 'label')} for "
                       f"{counted(len(args.checkpoints), 'checkpoint')}")
    if len(set(names)) != len(names):
        if args.names:
            raise TxlError(f"--names must give each model its own label, got {args.names!r}")
        names = [str(c) for c in args.checkpoints]
        if len(set(names)) != len(names):
            raise TxlError("the same checkpoint is given twice")
    return contexts, ratios, names


def _run_test_split(ckpt):
    """The test split (else valid) of the corpus a checkpoint was trained on, with its own tokenizer."""
    from txl.data.corpus import load_run_corpus

    if not ckpt.has_run_config or ckpt.state.get("converted_from"):
        raise TxlError(f"{ckpt.path} has no run.json naming its corpus; pass --data FILE")
    if ckpt.run.finetune is not None:  # its data is JSON Lines of pairs, not a text corpus
        raise TxlError(f"{ckpt.path} is fine-tuned on prompt/completion pairs, whose JSON Lines are no text corpus; "
                       "pass --data FILE (its completion loss: txl eval)")
    corpus = load_run_corpus(ckpt.run.data, tokenizer=ckpt.tokenizer)
    return corpus.test if len(corpus.test) > 1 else corpus.valid


def run(args: argparse.Namespace) -> int:
    """Score every model at every context length, then print the RECL table (and write files)."""
    contexts, ratios, names = _check(args)
    inputs = [*args.checkpoints, args.data]
    check_output(args, args.json, inputs, flag="--json")
    if not args.out:
        return _run(args, contexts, ratios, names)
    from txl.fileio import claim_folder

    with claim_folder(args.out, empty=True, inputs=inputs):  # one process per folder, before the slow part
        return _run(args, contexts, ratios, names)


def _run(args: argparse.Namespace, contexts: list[int], ratios: list[float], names: list[str]) -> int:
    """:func:`run` once the arguments are checked and ``--out`` (if any) is claimed."""
    if not args.no_plot and args.out:
        from txl.analysis.plots import pyplot

        pyplot()  # a missing matplotlib fails before the slow part
    import numpy as np

    from txl.data import load_bytes, read_corpus_files
    from txl.data.mapped import token_array
    from txl.fileio import atomic_write, write_json
    from txl_studies.recl.measure import context_losses, equal_arrays, plot_recl_gains, recl_table, scored_positions
    from txl.cli.common import load_checkpoint, note_threads, print_notes
    from txl.runtime import autocast

    report = human_stream(args)
    note_threads(args)
    raw = load_bytes(read_corpus_files(args.data)) if args.data else None
    losses, reference = [], None
    for name, path in zip(names, args.checkpoints):
        ckpt, device = load_checkpoint(args, path)
        tokens = token_array(ckpt.tokenizer.encode_file_bytes(raw, source=args.data) if raw is not None
                             else _run_test_split(ckpt), min_tokens=0)
        if reference is None:
            reference = tokens
            positions = scored_positions(len(tokens), contexts[-1], args.positions)
        elif not equal_arrays(tokens, reference):
            raise TxlError(f"{path} tokenizes {args.data or 'its test split'} differently from the first model; RECL compares "
                           "models position by position, so they need the same tokenizer")
        print_notes(args)  # the threads, once the first model and its text have passed their checks
        print(f"scoring {name}: {len(positions)} positions x {len(contexts)} context lengths", file=report, flush=True)
        with autocast(device, args.dtype):
            losses.append(context_losses(ckpt.model, tokens, contexts, positions, batch_size=args.batch_size))
    settings = {"data": args.data or "test split of the runs' corpus", "protocol": "exact window: each scored token is predicted from exactly c "
                "previous tokens, no memory", "start": args.start, "delta": args.delta}
    result = recl_table(np.stack(losses), names, contexts, ratios, args.threshold, settings=settings)
    table = result.markdown()
    print(table, file=report)
    if args.out:
        out = Path(args.out)
        write_json(out / "recl.json", result.to_dict())
        atomic_write(out / "recl.md", lambda tmp: Path(tmp).write_text(table + "\n", encoding="utf-8"))
        if not args.no_plot:
            plot_recl_gains(result, out / "recl_gain.png")
        print(f"wrote {out}/recl.json, recl.md" + ("" if args.no_plot else ", recl_gain.png"), file=report)
    if args.json:
        emit_json(args.json, result.to_dict(), force=args.force)
    return 0
