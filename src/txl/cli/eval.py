"""``txl eval``: evaluate a checkpoint (bpb, bpc or perplexity) with memory, a sliding window, dynamic
evaluation or a sweep over memory lengths."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from txl.cli.checks import (check_output, check_range, check_exists, finite_float, flag_name,
                            parse_ints)
from txl.cli.common import (add_quantize, add_batch_size, add_checkpoint_name, add_data, add_device, add_dtype, add_force, add_json,
                            add_option, add_seed, add_span, emit_json, human_stream, load_checkpoint, model_name, pick,
                            print_notes, span_args, underscore)
from txl.config import SPAN_FIELDS, check_dynamic
from txl.errors import TxlError

NAME = "eval"
HELP = "evaluate a checkpoint (bpb, bpc or perplexity) with memory"
EXAMPLE = "txl eval runs/enwik8 --split test --mem-len 1600 --clamp-len 1000 --json result.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``eval`` flags (no torch import here)."""
    # optional to argparse only so that the older `txl eval --json CKPT` keeps working (see _checkpoint)
    p.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT",
                   help="checkpoint directory, or a run directory (uses its best/)")
    add_checkpoint_name(p)
    add_data(p, "evaluate this whole file/directory instead of the run's split")
    p.add_argument("--split", choices=["valid", "test"], default=None, help="split of the run's corpus")
    add_span(p)
    p.add_argument("--warmup", action="store_true",
                   help="fill the memory before scoring (every scored token sees a full memory)")
    add_batch_size(p, text="sequences side by side")
    add_option(p, "--max-tokens", aliases=underscore("--max-tokens"), type=int, default=None, metavar="N",
               help="score only this many tokens (0: all)")
    add_option(p, "--sliding-window", aliases=underscore("--sliding-window"), type=int, default=None,
               metavar="CONTEXT", help="vanilla protocol: recompute a window of CONTEXT tokens for each prediction")
    p.add_argument("--stride", type=int, default=1, help="predictions per sliding window (default 1)")
    add_dtype(p)
    add_quantize(p)
    p.add_argument("--compile", action="store_true",
                   help="read the segments through torch.compile, float32 or --quantize int8 (the first segments "
                        "pay the compilation; docs/compile.md)")
    add_device(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar (stderr)")
    add_seed(p, text="seeds python, numpy and torch (evaluation itself draws no random numbers)", unset="not seeded")
    add_json(p, bare=True)
    p.add_argument("--dynamic", action="store_true",
                   help="dynamic evaluation (Krause et al. 2019): score each segment, then adapt the weights to it")
    p.add_argument("--dynamic-lr", type=finite_float, default=None,
                   help="dynamic evaluation step size (default 1e-4 for rms, 0.01 for sgd)")
    p.add_argument("--dynamic-decay", type=finite_float, default=0.0,
                   help="pull towards the trained weights per segment (lambda, default 0)")
    p.add_argument("--dynamic-method", choices=["sgd", "rms"], default="rms",
                   help="rms: updates divided by RMS gradients from training data (default); sgd: plain steps")
    p.add_argument("--sweep-mem", metavar="M1,M2,...", default=None,
                   help="evaluate at each of these memory lengths and print a table")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="with --sweep-mem: draw the metric against mem_len (.png, .pdf, .svg, ...)")
    add_force(p)


def _checkpoint(args: argparse.Namespace) -> None:
    """Settle the checkpoint argument: ``txl eval --json CKPT`` (the older switch) means ``txl eval CKPT --json -``."""
    if args.checkpoint is None:
        if args.json in (None, "-"):
            raise TxlError("give the CHECKPOINT to evaluate (a checkpoint or run directory)")
        args.checkpoint, args.json = args.json, "-"


def _check(args: argparse.Namespace) -> None:
    """Reject flag combinations that make no sense, before anything is loaded."""
    check_range(args, 1, "batch_size", "tgt_len")
    check_range(args, 0, "max_tokens", "mem_len", "cmem_len")
    check_range(args, 1, "sliding_window", "stride")
    if args.stride != 1 and args.sliding_window is None:
        raise TxlError("--stride applies to --sliding-window evaluation; give --sliding-window CONTEXT too")
    if args.sliding_window is not None and args.stride > args.sliding_window:
        raise TxlError(f"--stride {args.stride} is more than --sliding-window {args.sliding_window}: a window predicts "
                       "at most its own tokens; use a --stride of at most the window")
    if args.data and args.split:
        raise TxlError("--split chooses a split of the run's corpus; with --data the whole file is evaluated")
    modes = [name for name, on in (("--dynamic", args.dynamic), ("--sweep-mem", args.sweep_mem is not None),
                                   ("--sliding-window", args.sliding_window is not None)) if on]
    if len(modes) > 1:
        raise TxlError(f"choose one of {' and '.join(modes)}")
    if args.plot and args.sweep_mem is None:
        raise TxlError("--plot draws the --sweep-mem results; give --sweep-mem M1,M2,... too")
    if args.sliding_window is not None:  # the vanilla window reads no memory: the span flags would be ignored
        spans = ["--" + name.replace("_", "-") for name in SPAN_FIELDS if getattr(args, name, None) is not None]
        spans += ["--warmup"] if args.warmup else []
        if spans:
            raise TxlError(f"--sliding-window evaluates windows of CONTEXT tokens without memory: {', '.join(spans)} "
                           "would be ignored; leave them out")
    if args.compile and args.quantize == "bf16":
        raise TxlError("--compile does not take --quantize bf16 yet; drop one of them")
    if args.compile and modes:
        raise TxlError(f"--compile applies to the plain evaluation with memory, not {modes[0]}; drop one of them")
    if args.dynamic and args.quantize != "none":
        raise TxlError("--dynamic adapts the weights, which --quantize makes inference-only; drop --quantize")
    if args.dynamic and args.warmup:
        raise TxlError("--dynamic reads the text from its start without warm-up; drop --warmup")
    if not args.dynamic and (args.dynamic_lr is not None or args.dynamic_decay or args.dynamic_method != "rms"):
        raise TxlError("--dynamic-lr/--dynamic-decay/--dynamic-method apply to --dynamic; add --dynamic")
    if args.dynamic:
        check_dynamic(args.dynamic_lr, args.dynamic_decay, named=lambda field: flag_name(args, f"dynamic_{field}"))
    if args.dynamic and args.batch_size is not None and args.batch_size != 1:
        raise TxlError("--dynamic reads the text as one stream (batch size 1); drop --batch-size")
    _check_outputs(args, [args.checkpoint, args.data])


def _check_outputs(args: argparse.Namespace, inputs: list) -> None:
    """``--json FILE`` and ``--plot FILE`` may be written: not an input, not in a checkpoint, not existing without --force."""
    if args.json not in (None, "-") and args.plot and os.path.abspath(args.json) == os.path.abspath(args.plot):
        raise TxlError(f"--json and --plot name the same file {args.json}; give two files")
    check_output(args, args.json, inputs, flag="--json")
    check_output(args, args.plot, inputs, flag="--plot")


def _check_plot(path: str) -> None:
    """Fail before the evaluation if matplotlib is missing, the image type is unknown or the path unusable."""
    from txl.analysis.plots import pyplot

    plt = pyplot()
    kind = Path(path).suffix[1:].lower() or "png"
    if kind not in plt.figure().canvas.get_supported_filetypes() or kind == "pgf":
        raise TxlError(f"--plot {path}: unknown image type .{kind}; use .png, .pdf or .svg")
    plt.close("all")
    if Path(path).is_dir():
        raise TxlError(f"--plot {path} is a folder; give a file name")


def run(args: argparse.Namespace) -> int:
    """Run ``txl eval``; returns the exit status (user errors raise :class:`TxlError`)."""
    _checkpoint(args)
    _check(args)
    check_exists(args.checkpoint, "checkpoint", kind="folder")  # arguments and paths before torch is imported
    check_exists(args.data, "--data")
    sweep = None
    if args.sweep_mem is not None:
        sweep = sorted(set(parse_ints(args.sweep_mem, "--sweep-mem", 0)))
        if args.mem_len is not None:
            raise TxlError("--sweep-mem sets the memory length itself; drop --mem-len")
    if args.plot:
        _check_plot(args.plot)
    from txl.data import load_bytes, read_corpus_files
    from txl.data.corpus import load_run_corpus
    from txl.evaluation.stream import evaluate, evaluate_sliding_window, metric_unit

    if args.seed is not None:
        from txl.runtime import seed_everything

        seed_everything(args.seed)
    ckpt, _ = load_checkpoint(args, announce=True)
    if args.dynamic:
        from txl.fileio.model_files import check_trainable

        check_trainable(ckpt.model.state_dict(), f"{ckpt.path} (--dynamic adapts the weights)")
    if not args.data and ckpt.has_run_config:  # the run's corpus is read too: never written over either
        d = ckpt.run.data
        _check_outputs(args, [args.checkpoint, d.path, d.train, d.valid, d.test])
    e = ckpt.run.eval
    split = args.split or e.split
    if not args.data and ckpt.run.finetune is not None:  # the run's split is prompt/completion pairs
        return _eval_pairs(args, ckpt, split, e)
    if not args.data and ckpt.state.get("converted_from"):
        raise TxlError(f"{ckpt.path} was converted from another format and has no corpus of its own; "
                       "pass --data FILE to evaluate it")
    if not args.data and not ckpt.has_run_config:
        raise TxlError(f"{ckpt.path} has no run.json saying which corpus it was trained on; pass --data FILE")
    if args.data:
        files = read_corpus_files(args.data)
        tokens = ckpt.tokenizer.encode_file_bytes(load_bytes(files), source=args.data)
        where = args.data
    else:
        try:
            corpus = load_run_corpus(ckpt.run.data, tokenizer=ckpt.tokenizer)
        except TxlError as err:
            raise TxlError(f"{err} (the run's corpus; pass --data FILE to evaluate other text)") from None
        tokens = corpus.valid if split == "valid" else corpus.test
        where = f"{split} split of {corpus.source}"
        from txl.training.fingerprint import split_digest

        _note_changed(args, ckpt, {f"{split} split": split_digest(corpus, split)}, f"the {where}")
        if len(tokens) < 2:
            raise TxlError(f"the {split} split is empty; use --split valid or --data FILE")
    unit = metric_unit(ckpt.tokenizer.kind)
    print_notes(args)  # which checkpoint (the input has passed its checks)
    batch_size = args.batch_size or e.batch_size
    max_tokens = e.max_tokens if args.max_tokens is None else args.max_tokens
    if args.dynamic:
        return _eval_dynamic(args, ckpt, tokens, where, unit, max_tokens, e)
    if sweep is not None:
        return _eval_sweep(args, ckpt, tokens, where, unit, max_tokens, e, sweep, batch_size)
    if args.sliding_window is not None:
        res = evaluate_sliding_window(ckpt.model, tokens, context=args.sliding_window, stride=args.stride, unit=unit,
                                      batch_size=max(batch_size, 1), max_tokens=max_tokens, dtype=args.dtype,
                                      progress=not args.quiet)
    else:
        res = evaluate(ckpt.model, tokens, unit=unit, batch_size=batch_size, warmup=args.warmup or e.warmup,
                       max_tokens=max_tokens, dtype=args.dtype, progress=not args.quiet, compiled=args.compile,
                       **span_args(args, e))
    return _report(args, ckpt, where, [f"{where}: {res}"],
                   {"unit": res.unit, "value": res.value, "loss_nats": res.loss, "n_tokens": res.n_tokens,
                    **res.settings})


def _note_changed(args, ckpt, now: dict, what: str) -> None:
    """Keep a warning for the start lines when ``what``, the run's data about to be evaluated, differs
    from the data the checkpoint records it was trained and validated on (``now``: the fingerprint
    parts of what is read, :mod:`txl.training.fingerprint`)."""
    from txl.training.fingerprint import changed_since_training

    changes = changed_since_training(ckpt.state, now)
    if changes:
        args.__dict__.setdefault("_notes", []).append(
            f"txl: warning: {what} differs from the data {ckpt.path} was trained and validated on "
            f"({'; '.join(changes)})")


def _report(args, ckpt, where: str, lines: list[str], record: dict) -> int:
    """Print ``lines`` (unless the JSON goes to stdout) and write ``record`` to ``--json``; returns 0."""
    if args.json != "-":
        print("\n".join(lines))
    if args.json:
        emit_json(args.json, {"checkpoint": str(ckpt.path), "data": where, **record}, force=args.force)
    return 0


def _eval_pairs(args, ckpt, split, e) -> int:
    """``txl eval`` of a fine-tuned run without ``--data``: the completion metric on its pairs' ``split``
    (mean loss per completion token, the number ``txl finetune`` reports), not the raw JSON Lines as text."""
    from txl.config import resolve_span
    from txl.data.pairs import encode_pair, find_markers, pair_splits
    from txl.evaluation.completions import evaluate_completions
    from txl.evaluation.stream import metric_unit

    flags = [flag for flag, on in (("--dynamic", args.dynamic), ("--sweep-mem", args.sweep_mem is not None),
                                   ("--sliding-window", args.sliding_window is not None), ("--warmup", args.warmup),
                                   ("--max-tokens", args.max_tokens is not None), ("--compile", args.compile)) if on]
    if flags:
        raise TxlError(f"{ckpt.path} is fine-tuned on prompt/completion pairs: txl eval scores the completions of "
                       f"its {split} pairs, and {', '.join(flags)} does not apply to that; leave it out, or pass "
                       "--data FILE to evaluate text")
    try:
        pairs = pair_splits(ckpt.run.data)[split]
    except TxlError as err:
        raise TxlError(f"{err} (the run's pairs; pass --data FILE to evaluate text)") from None
    if not pairs:
        raise TxlError(f"the {split} split of the run's pairs is empty; use --split valid or --data FILE")
    from txl.training.fingerprint import file_digest

    part = "path" if ckpt.run.data.path is not None else split
    _note_changed(args, ckpt, {f"data.{part}": file_digest(getattr(ckpt.run.data, part))},
                  f"the pairs file {getattr(ckpt.run.data, part)}")
    markers = find_markers(ckpt.tokenizer)
    rows = [encode_pair(ckpt.tokenizer, markers, pair, ckpt.run.finetune.max_prompt_tokens) for pair in pairs]
    print_notes(args)  # which checkpoint (the input has passed its checks)
    span = resolve_span(ckpt.model.config, **span_args(args, e))  # cmem_len too
    res = evaluate_completions(ckpt.model, rows, span=span, unit=metric_unit(ckpt.tokenizer.kind),
                               batch_size=args.batch_size or e.batch_size, dtype=args.dtype, progress=not args.quiet)
    where = f"{split} pairs of the run (completion tokens)"
    return _report(args, ckpt, where, [f"{where}: {res}"],
                   {"metric": "completion", "unit": res.unit, "value": res.value, "loss_nats": res.loss,
                    "n_tokens": res.n_tokens, **res.settings})


def _eval_sweep(args, ckpt, tokens, where, unit, max_tokens, e, sweep, batch_size) -> int:
    """``txl eval --sweep-mem M1,M2,...``: one evaluation per memory length, as a table (and a plot)."""
    from txl.evaluation.mem_sweep import format_sweep, sweep_mem_len

    results = sweep_mem_len(ckpt.model, tokens, sweep, warmup=args.warmup or e.warmup, unit=unit,
                            batch_size=batch_size, tgt_len=pick(args.tgt_len, e.tgt_len),
                            clamp_len=pick(args.clamp_len, e.clamp_len),
                            same_length=pick(args.same_length, e.same_length), max_tokens=max_tokens,
                            dtype=args.dtype, progress=not args.quiet)
    _report(args, ckpt, where, [f"{where}: {unit} against evaluation memory length", format_sweep(sweep, results)],
            {"unit": unit, "results": [{"value": r.value, "loss_nats": r.loss, "n_tokens": r.n_tokens, **r.settings}
                                       for r in results]})
    if args.plot:
        from txl.analysis.plots import plot_mem_sweep

        plot_mem_sweep(sweep, [r.value for r in results], unit, args.plot, label=model_name(ckpt.path))
        print(f"wrote {args.plot}", file=human_stream(args))
    return 0


def _eval_dynamic(args, ckpt, tokens, where, unit, max_tokens, e) -> int:
    """``txl eval --dynamic``: the static and the dynamic number on the same segments (batch size 1)."""
    from txl.data.corpus import load_run_corpus
    from txl.evaluation.dynamic import dynamic_evaluate, gradient_statistics
    from txl.evaluation.stream import evaluate

    lr = args.dynamic_lr if args.dynamic_lr is not None else (1e-4 if args.dynamic_method == "rms" else 0.01)
    span = span_args(args, e)
    stats = None
    if args.dynamic_method == "rms" and ckpt.has_run_config and not ckpt.state.get("converted_from") \
            and ckpt.run.finetune is None:  # a fine-tuned run's data is pairs, not text to take statistics on
        try:
            train_tokens = load_run_corpus(ckpt.run.data, tokenizer=ckpt.tokenizer).train
        except TxlError:
            train_tokens = None  # corpus gone: statistics on the fly instead
        if train_tokens is not None and len(train_tokens) >= 2:
            stats = gradient_statistics(ckpt.model, train_tokens, tgt_len=span["tgt_len"], mem_len=span["mem_len"],
                                        progress=not args.quiet)
    static = evaluate(ckpt.model, tokens, unit=unit, batch_size=1, max_tokens=max_tokens, dtype=args.dtype,
                      progress=not args.quiet and "static evaluation", **span)
    dyn = dynamic_evaluate(ckpt.model, tokens, unit=unit, lr=lr, decay=args.dynamic_decay, method=args.dynamic_method,
                           stats=stats, max_tokens=max_tokens, dtype=args.dtype, progress=not args.quiet, **span)
    return _report(args, ckpt, where, [f"{where}:", f"  static  {static}", f"  dynamic {dyn}"],
                   {"unit": unit, "static": static.value, "dynamic": dyn.value, "static_loss_nats": static.loss,
                    "dynamic_loss_nats": dyn.loss, "n_tokens": dyn.n_tokens, **dyn.settings})
