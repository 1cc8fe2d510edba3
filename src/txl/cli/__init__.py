"""The ``txl`` command line: train, eval and generate.

Every user error is printed as one line ``txl: error: ...`` on stderr with exit status 2; an
interrupted run exits with 130 after saving its ``last/`` checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from txl.errors import TxlError

# torch and numpy are imported inside the commands, so that Ctrl-C during start-up or a usage
# error never needs them and never shows a traceback


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors reported as one ``txl: error:`` line (exit status 2)."""

    def error(self, message: str):  # noqa: D102 - argparse hook
        self.exit(2, f"txl: error: {message} (see: {self.prog} --help)\n")


def _add_span_args(p: argparse.ArgumentParser) -> None:
    for name, kind, text in (("tgt_len", int, "tokens scored per segment"),
                             ("mem_len", int, "memory length (0: none)"),
                             ("clamp_len", int, "clamp relative distances at this value (<= 0: none)")):
        p.add_argument(f"--{name}", f"--{name.replace('_', '-')}", type=kind, default=None, help=text)
    p.add_argument("--same_length", "--same-length", action=argparse.BooleanOptionalAction, default=None,
                   help="every query sees the same number of keys")


def build_parser() -> argparse.ArgumentParser:
    from txl import __version__

    parser = _Parser(prog="txl", description="Transformer-XL: train, evaluate and sample "
                     "language models with segment-level memory.")
    parser.add_argument("--version", action="version", version=f"txl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model (no DATA: the built-in default corpus)")
    p.add_argument("items", nargs="*", metavar="[DATA] [KEY=VALUE ...]",
                   help="a text file or directory (default: Python's standard-library sources), then config "
                        "overrides such as model.n_layer=6 lr=1e-3")
    p.add_argument("--config", "-c", help="TOML run config (sections model, data, train, eval)")
    p.add_argument("--out", "-o", help="run directory (train.out_dir)")
    p.add_argument("--tokenizer", choices=["byte", "char", "word", "bpe"], help="data.tokenizer")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its last/ checkpoint")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept KEY=VALUE overrides that change the saved config")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train in N processes on this machine (runs torchrun; one per GPU, or gloo on CPU)")

    p = sub.add_parser("eval", help="evaluate a checkpoint (bpc or perplexity) with memory")
    p.add_argument("checkpoint", help="checkpoint directory or run directory (uses best/)")
    p.add_argument("--data", help="evaluate this whole file/directory instead of the run's split")
    p.add_argument("--split", choices=["valid", "test"], default=None, help="split of the run's corpus")
    _add_span_args(p)
    p.add_argument("--warmup", action="store_true", help="fill the memory before scoring (every scored token sees a full memory)")
    p.add_argument("--batch_size", "--batch-size", type=int, default=None)
    p.add_argument("--max_tokens", "--max-tokens", type=int, default=None, help="score only this many tokens")
    p.add_argument("--sliding_window", "--sliding-window", type=int, default=None, metavar="CONTEXT",
                   help="vanilla protocol: recompute a window of CONTEXT tokens for each prediction")
    p.add_argument("--stride", type=int, default=1, help="predictions per sliding window (default 1)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--dynamic", action="store_true",
                   help="dynamic evaluation (Krause et al. 2019): score each segment, then adapt the weights to it")
    p.add_argument("--dynamic-lr", type=float, default=None,
                   help="dynamic evaluation step size (default 1e-4 for rms, 0.01 for sgd)")
    p.add_argument("--dynamic-decay", type=float, default=0.0,
                   help="pull towards the trained weights per segment (lambda, default 0)")
    p.add_argument("--dynamic-method", choices=["sgd", "rms"], default="rms",
                   help="rms: updates divided by RMS gradients from training data (default); sgd: plain steps")
    p.add_argument("--sweep-mem", metavar="M1,M2,...", default=None,
                   help="evaluate at each of these memory lengths and print a table")
    p.add_argument("--plot", metavar="FILE", default=None, help="with --sweep-mem: draw the metric against mem_len (.png, .pdf, .svg, ...)")

    p = sub.add_parser("generate", help="sample text from a checkpoint, reusing the memory")
    p.add_argument("checkpoint", help="checkpoint directory or run directory (uses best/)")
    p.add_argument("--prompt", "-p", default=None, help="prompt text (default: a newline)")
    p.add_argument("--prompt-file", default=None, help="read the prompt from this file")
    p.add_argument("--max_new_tokens", "--max-new-tokens", "-n", type=int, default=300)
    p.add_argument("--temperature", "-t", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", "--top-k", type=int, default=None)
    p.add_argument("--top_p", "--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--mem_len", "--mem-len", type=int, default=None, help="memory length while sampling")
    p.add_argument("--device", default="auto")

    p = sub.add_parser("bench", help="throughput and memory, optionally against transformers' TransfoXL")
    p.add_argument("--vs", choices=["hf"], help="also run transformers' TransfoXL (same weights) and GPT-2")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--eval-speedup", action="store_true", help="vanilla sliding window vs memory (paper Table 9)")
    p.add_argument("--lengths", default="128,256,512,800", help="attention lengths for --eval-speedup")
    p.add_argument("--json", help="also write the results to this JSON file")

    p = sub.add_parser("convert", help="convert Hugging Face TransfoXL checkpoints to txl and back")
    conv = p.add_subparsers(dest="direction", required=True)
    for name, text in (("hf", "an HF TransfoXLLMHeadModel folder (config.json, weights, vocab.pkl) -> a txl checkpoint"),
                       ("to-hf", "a txl checkpoint -> an HF TransfoXLLMHeadModel folder")):
        q = conv.add_parser(name, help=text)
        q.add_argument("src")
        q.add_argument("dst")
        if name == "hf":
            q.add_argument("--vocab", help="vocabulary to use instead of SRC/vocab.pkl (txl vocab.json or HF vocab.pkl)")

    p = sub.add_parser("data", help="standard datasets (enwik8, text8, wikitext, ptb, lm1b)")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="download/unpack a benchmark into train/valid/test.txt + dataset.json")
    p.add_argument("name", help="enwik8, text8, wikitext-2, wikitext-103, wikitext-2-raw, wikitext-103-raw, "
                                "ptb, ptb-char or lm1b")
    p.add_argument("--source", help="the official archive, a folder with its extracted files, or an http(s) URL")
    p.add_argument("--out", "-o", help="output folder (default: data/NAME)")
    p.add_argument("--sha256", help="expected sha256 of the archive (overrides the published checksum)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    for module in _command_modules():
        module.register(sub)
    return parser


# Subcommands that live in their own modules. Each module defines ``NAME``, ``register(subparsers)``
# (adds its parser; must not import torch) and ``run(args) -> int``.
COMMAND_MODULES: tuple[str, ...] = ("txl.cli.score", "txl.cli.classify", "txl.cli.ablate", "txl.cli.recl", "txl.cli.plot")


def _command_modules():
    import importlib

    return [importlib.import_module(name) for name in COMMAND_MODULES]


def cmd_train(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from txl.training.config import RunConfig, load_run_config, parse_override
    from txl.fileio import read_json_object

    overrides, paths = [], []
    for item in args.items:
        (overrides if "=" in item and not Path(item).exists() else paths).append(item)
    if len(paths) > 1:
        raise TxlError(f"give one DATA path (a file or directory), got {len(paths)}: {' '.join(paths)}")
    if args.resume:
        if paths or args.config or args.out or args.tokenizer:
            raise TxlError("--resume continues a run with its saved config: give no DATA, --config, --out or "
                           "--tokenizer")
        if overrides and not args.allow_config_change:
            raise TxlError("--resume continues a run with its saved config; to change it anyway (e.g. "
                           "train.max_steps=...), add --allow-config-change")
        run_json = Path(args.resume) / "run.json"
        if not run_json.is_file():
            raise TxlError(f"{args.resume} is not a run directory (no run.json)")
        saved = read_json_object(run_json)
        changes: dict = {}
        for text in overrides:
            section, key, value = parse_override(text)
            changes.setdefault(section, {})[key] = value
        run = RunConfig.from_dict(changes, base=RunConfig.from_dict(saved))
        run.train.out_dir = args.resume
    else:
        if paths:
            overrides.append(f"data.path={paths[0]}")
        if args.out:
            overrides.append(f"train.out_dir={args.out}")
        if args.tokenizer:
            overrides.append(f"data.tokenizer={args.tokenizer}")
        run = load_run_config(args.config, overrides)
    if args.nproc is not None:
        return _launch(args, argv, run)
    from txl.training.loop import train

    return _report(train(run, progress=not args.quiet, resume=bool(args.resume)), run)


def _launch(args: argparse.Namespace, argv: list[str] | None, run) -> int:
    """``txl train --nproc N ...``: check what can be checked here, then run the same command in N ranks."""
    from txl.training.distributed import launch

    run.validate()
    t = run.train
    if args.nproc < 1:
        raise TxlError(f"--nproc must be >= 1, got {args.nproc}")
    if t.batch_size % (args.nproc * t.grad_accum_steps):
        raise TxlError(f"train.batch_size {t.batch_size} must divide into {args.nproc} ranks × train.grad_accum_steps "
                       f"{t.grad_accum_steps} equal pieces")
    if not args.resume and (Path(t.out_dir) / "run.json").exists():
        raise TxlError(f"{t.out_dir} already holds a run; choose another train.out_dir (--out), remove it, "
                       "or continue it with --resume")
    import torch

    if t.device in ("auto", "cuda") and torch.cuda.is_available() and args.nproc > torch.cuda.device_count():
        raise TxlError(f"--nproc {args.nproc} exceeds the {torch.cuda.device_count()} GPUs here (one rank per GPU)")
    rest = list(sys.argv[1:] if argv is None else argv)
    for i, item in enumerate(rest):  # drop --nproc N / --nproc=N, keep everything else as given
        if item == "--nproc":
            del rest[i:i + 2]
            break
        if item.startswith("--nproc="):
            del rest[i]
            break
    return launch(args.nproc, rest)


def _report(result, run) -> int:
    if result.rank:  # torchrun: rank 0 reports for the run
        return 0
    print(f"trained {result.steps} steps, {result.tokens:,} tokens in {result.wall_s:.0f} s "
          f"({result.tokens_per_s:,.0f} tokens/s including validation)")
    print(f"{run.eval.split} {result.final}")
    print(f"checkpoint: {result.best_dir}")
    if result.sample:
        print("--- prompt ---")
        print(result.sample_prompt, end="" if result.sample_prompt.endswith("\n") else "\n")
        print("--- sample ---")
        print(result.sample)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from txl.data import load_bytes, read_corpus_files
    from txl.evaluation.stream import evaluate, evaluate_sliding_window, metric_unit
    from txl.training.checkpoint import load_checkpoint
    from txl.data.corpus import load_run_corpus
    from txl.runtime import resolve_device

    for name in ("batch_size", "tgt_len"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise TxlError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("max_tokens", "mem_len"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise TxlError(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.stride != 1 and args.sliding_window is None:
        raise TxlError("--stride applies to --sliding-window evaluation; give --sliding-window CONTEXT too")
    if args.data and args.split:
        raise TxlError("--split chooses a split of the run's corpus; with --data the whole file is evaluated")
    modes = [name for name, on in (("--dynamic", args.dynamic), ("--sweep-mem", args.sweep_mem is not None),
                                   ("--sliding-window", args.sliding_window is not None)) if on]
    if len(modes) > 1:
        raise TxlError(f"choose one of {' and '.join(modes)}")
    if args.plot and args.sweep_mem is None:
        raise TxlError("--plot draws the --sweep-mem results; give --sweep-mem M1,M2,... too")
    if args.dynamic and args.warmup:
        raise TxlError("--dynamic reads the text from its start without warm-up; drop --warmup")
    if not args.dynamic and (args.dynamic_lr is not None or args.dynamic_decay or args.dynamic_method != "rms"):
        raise TxlError("--dynamic-lr/--dynamic-decay/--dynamic-method apply to --dynamic; add --dynamic")
    if args.dynamic and not 0.0 <= args.dynamic_decay < 1.0:
        raise TxlError(f"--dynamic-decay must be in [0, 1), got {args.dynamic_decay}")
    if args.dynamic and args.dynamic_lr is not None and not 0 <= args.dynamic_lr < float("inf"):
        raise TxlError(f"--dynamic-lr must be a finite number >= 0, got {args.dynamic_lr}")
    if args.dynamic and args.batch_size is not None and args.batch_size != 1:
        raise TxlError("--dynamic reads the text as one stream (batch size 1); drop --batch-size")
    if args.sweep_mem is not None:
        from txl.evaluation.mem_sweep import parse_mem_lens

        sweep = parse_mem_lens(args.sweep_mem)
        if args.mem_len is not None:
            raise TxlError("--sweep-mem sets the memory length itself; drop --mem_len")
    if args.plot:
        from txl.analysis.plots import pyplot

        plt = pyplot()  # fail before the evaluation if matplotlib is missing, the type is unknown or the path unusable
        kind = Path(args.plot).suffix[1:].lower() or "png"
        if kind not in plt.figure().canvas.get_supported_filetypes() or kind == "pgf":
            raise TxlError(f"--plot {args.plot}: unknown image type .{kind}; use .png, .pdf or .svg")
        plt.close("all")
        if Path(args.plot).is_dir():
            raise TxlError(f"--plot {args.plot} is a folder; give a file name")
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint, map_location=str(device))
    e = ckpt.run.eval
    split = args.split or e.split
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
        if len(tokens) < 2:
            raise TxlError(f"the {split} split is empty; use --split valid or --data FILE")
    unit = metric_unit(ckpt.tokenizer.kind)
    batch_size = args.batch_size or e.batch_size
    max_tokens = e.max_tokens if args.max_tokens is None else args.max_tokens
    def pick(cli, cfg):
        return cli if cli is not None else cfg
    if args.dynamic:
        return _eval_dynamic(args, ckpt, tokens, where, unit, max_tokens, e, pick)
    if args.sweep_mem is not None:
        from txl.evaluation.mem_sweep import format_sweep, sweep_mem_len

        results = sweep_mem_len(ckpt.model, tokens, sweep, warmup=args.warmup or e.warmup, unit=unit,
                                batch_size=batch_size, tgt_len=pick(args.tgt_len, e.tgt_len),
                                clamp_len=pick(args.clamp_len, e.clamp_len),
                                same_length=pick(args.same_length, e.same_length), max_tokens=max_tokens,
                                dtype=args.dtype)
        if args.json:
            print(json.dumps({"checkpoint": str(ckpt.path), "data": where, "unit": unit,
                              "results": [{"value": r.value, "loss_nats": r.loss, "n_tokens": r.n_tokens,
                                           **r.settings} for r in results]}))
        else:
            print(f"{where}: {unit} against evaluation memory length")
            print(format_sweep(sweep, results))
        if args.plot:
            from txl.analysis.plots import plot_mem_sweep

            name = ckpt.path.parent.name if ckpt.path.name in ("best", "last") else ckpt.path.name
            plot_mem_sweep(sweep, [r.value for r in results], unit, args.plot, label=name)
            print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
        return 0
    if args.sliding_window is not None:
        res = evaluate_sliding_window(ckpt.model, tokens, context=args.sliding_window, stride=args.stride, unit=unit,
                                      batch_size=max(batch_size, 1), max_tokens=max_tokens, dtype=args.dtype)
    else:
        res = evaluate(ckpt.model, tokens, unit=unit, batch_size=batch_size,
                       tgt_len=pick(args.tgt_len, e.tgt_len), mem_len=pick(args.mem_len, e.mem_len),
                       clamp_len=pick(args.clamp_len, e.clamp_len), same_length=pick(args.same_length, e.same_length),
                       warmup=args.warmup or e.warmup, max_tokens=max_tokens, dtype=args.dtype)
    if args.json:
        print(json.dumps({"checkpoint": str(ckpt.path), "data": where, "unit": res.unit, "value": res.value,
                          "loss_nats": res.loss, "n_tokens": res.n_tokens, **res.settings}))
    else:
        print(f"{where}: {res}")
    return 0


def _eval_dynamic(args, ckpt, tokens, where, unit, max_tokens, e, pick) -> int:
    """``txl eval --dynamic``: the static and the dynamic number on the same segments (batch size 1)."""
    from txl.evaluation.dynamic import dynamic_evaluate, gradient_statistics
    from txl.evaluation.stream import evaluate
    from txl.data.corpus import load_run_corpus

    lr = args.dynamic_lr if args.dynamic_lr is not None else (1e-4 if args.dynamic_method == "rms" else 0.01)
    span = dict(tgt_len=pick(args.tgt_len, e.tgt_len), mem_len=pick(args.mem_len, e.mem_len),
                clamp_len=pick(args.clamp_len, e.clamp_len), same_length=pick(args.same_length, e.same_length))
    stats = None
    if args.dynamic_method == "rms" and ckpt.has_run_config and not ckpt.state.get("converted_from"):
        try:
            train_tokens = load_run_corpus(ckpt.run.data, tokenizer=ckpt.tokenizer).train
        except TxlError:
            train_tokens = None  # corpus gone: statistics on the fly instead
        if train_tokens is not None and len(train_tokens) >= 2:
            stats = gradient_statistics(ckpt.model, train_tokens, tgt_len=span["tgt_len"], mem_len=span["mem_len"])
    static = evaluate(ckpt.model, tokens, unit=unit, batch_size=1, max_tokens=max_tokens, dtype=args.dtype, **span)
    dyn = dynamic_evaluate(ckpt.model, tokens, unit=unit, lr=lr, decay=args.dynamic_decay, method=args.dynamic_method,
                           stats=stats, max_tokens=max_tokens, dtype=args.dtype, **span)
    if args.json:
        print(json.dumps({"checkpoint": str(ckpt.path), "data": where, "unit": unit, "static": static.value,
                          "dynamic": dyn.value, "static_loss_nats": static.loss, "dynamic_loss_nats": dyn.loss,
                          "n_tokens": dyn.n_tokens, **dyn.settings}))
    else:
        print(f"{where}:")
        print(f"  static  {static}")
        print(f"  dynamic {dyn}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from txl.generation import generate_stream
    from txl.training.checkpoint import load_checkpoint
    from txl.runtime import resolve_device

    import numpy as np
    import torch

    from txl.generation import check_sampling

    check_sampling(args.temperature, args.top_k, args.top_p)
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise TxlError(f"--seed must be in [0, 2**63), got {args.seed}")
    if args.prompt is not None and args.prompt_file:
        raise TxlError("give either --prompt or --prompt-file, not both")
    if args.max_new_tokens < 0:
        raise TxlError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.mem_len is not None and args.mem_len < 0:
        raise TxlError(f"--mem_len must be >= 0, got {args.mem_len}")
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint, map_location=str(device))
    if args.prompt_file:
        try:
            raw = Path(args.prompt_file).read_bytes()
        except OSError as err:
            raise TxlError(f"cannot read prompt file {args.prompt_file}: {err.strerror or err}") from None
        if ckpt.tokenizer.kind == "byte":  # any bytes: undecodable ones travel as surrogate escapes
            prompt = raw.decode("utf-8", errors="surrogateescape")
        else:
            from txl.data.tokenizers import decode_utf8

            prompt = decode_utf8(raw, source=f"prompt file {args.prompt_file}", kind=ckpt.tokenizer.kind)
    else:
        prompt = args.prompt if args.prompt is not None else "\n"
    if prompt == "":
        raise TxlError("the prompt is empty; give at least one character with --prompt")
    ids = torch.as_tensor(np.asarray(ckpt.tokenizer.encode(prompt), dtype=np.int64), device=device)[None]
    if ids.size(1) == 0:
        raise TxlError("the prompt encodes to no tokens; give a longer prompt")
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed if args.seed is not None else torch.seed() % (2**63))
    sys.stdout.write(prompt.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
    sys.stdout.flush()
    pending: list[int] = []
    at_line_start = prompt.endswith("\n")
    for token in generate_stream(ckpt.model, ids, args.max_new_tokens, temperature=args.temperature,
                                 top_k=args.top_k, top_p=args.top_p, generator=generator, mem_len=args.mem_len):
        pending.append(int(token[0]))
        text = ckpt.tokenizer.decode(pending)
        if "\ufffd" not in text or len(pending) >= 4:  # wait for complete UTF-8 sequences (byte models)
            if ckpt.tokenizer.kind == "word" and text != "\n" and not at_line_start:
                text = " " + text  # words are separated by spaces, lines end with <eos>
            at_line_start = text.endswith("\n")
            sys.stdout.write(text)
            sys.stdout.flush()
            pending = []
    if pending:
        sys.stdout.write(ckpt.tokenizer.decode(pending))
    sys.stdout.write("\n")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from txl.data.datasets import prepare_dataset

    info = prepare_dataset(args.name, args.source, args.out or f"data/{args.name}", sha256=args.sha256,
                           progress=not args.quiet)
    print(f"recommended tokenizer: {info['tokenizer']}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from txl.analysis.bench import eval_speedup, format_table, run_bench
    from txl.fileio import write_json

    if args.batch < 1 or args.repeats < 1:
        raise TxlError("--batch and --repeats must be >= 1")
    if args.eval_speedup:
        try:
            lengths = [int(v) for v in args.lengths.split(",") if v.strip()]
        except ValueError:
            raise TxlError(f"--lengths must be comma-separated integers, got {args.lengths!r}") from None
        if not lengths or min(lengths) < 1:
            raise TxlError("--lengths needs positive integers")
        results = eval_speedup(lengths, device=args.device, repeats=args.repeats)
    else:
        results = run_bench(vs_hf=args.vs == "hf", device=args.device, dtype=args.dtype, batch=args.batch,
                            repeats=args.repeats, memory=not args.no_memory)
        print(format_table(results))
    if args.json:
        write_json(args.json, results)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from txl.convert.commands import convert_from_hf, convert_to_hf

    if args.direction == "hf":
        path = convert_from_hf(args.src, args.dst, vocab=args.vocab)
    else:
        path = convert_to_hf(args.src, args.dst)
    print(f"wrote {path}")
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "generate": cmd_generate, "data": cmd_data,
            "convert": cmd_convert, "bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``txl`` console script; returns the exit status."""
    try:
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(argv)
            unknown = [e for e in extra if e.startswith("-") or args.command != "train"]
            if unknown:
                parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        except SystemExit as exit_:  # usage errors (one line already printed), --help, --version
            return int(exit_.code or 0)
        if extra:  # overrides placed after an option: `txl train --tokenizer char a=1`
            args.items += extra
        if args.command == "train":
            return cmd_train(args, argv)
        if args.command in COMMANDS:
            return COMMANDS[args.command](args)
        return next(m for m in _command_modules() if m.NAME == args.command).run(args)
    except TxlError as err:
        if os.environ.get("RANK", "0") == "0":  # torchrun: every rank meets the same error; rank 0 reports it
            print(f"txl: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0":
            print("txl: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        print(f"txl: error: {err.strerror or err}{f' ({err.filename})' if err.filename else ''}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
