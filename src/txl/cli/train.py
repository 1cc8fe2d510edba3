"""``txl train``: train a model from a corpus and a run config, or continue a stopped run."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from txl.cli.checks import check_exists, check_range, flag_name, require_installed
from txl.cli.common import add_batch_size, add_data, add_device, add_dtype, add_seed, interrupted_by
from txl.errors import TxlError

NAME = "train"
HELP = "train a model (no DATA: the built-in default corpus)"
EXAMPLE = "txl train data/enwik8 --config configs/enwik8-base.toml --out runs/enwik8 train.max_steps=2000"

# shared flags that are config overrides here: flag destination -> config field
_OVERRIDES = {"data": "data.path", "device": "train.device", "dtype": "train.dtype", "seed": "train.seed",
              "batch_size": "train.batch_size"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``train`` flags (no torch import here)."""
    p.set_defaults(_more="items")  # later items of the list, after an option (see txl.cli.main)
    p.add_argument("items", nargs="*", metavar="[DATA] [KEY=VALUE ...]",
                   help="a text file or directory (default: Python's standard-library sources), then config "
                        "overrides such as model.n_layer=6 lr=1e-3")
    add_data(p, "the corpus, as a flag (the same as the positional DATA)")
    p.add_argument("--config", "-c", help="TOML run config (sections model, data, train, eval)")
    p.add_argument("--out", "-o", help="run directory (train.out_dir)")
    p.add_argument("--tokenizer", choices=["byte", "char", "word", "bpe"], help="data.tokenizer")
    add_device(p, threads_text="train.threads, 0: automatic")
    p.set_defaults(device=None)  # None: train.device of the config
    add_dtype(p, default=None)
    add_batch_size(p, text="train.batch_size")
    add_seed(p, text="train.seed", unset="the config's train.seed, 1234 unless set")
    p.set_defaults(seed=None)
    add_run_flags(p, "continue a stopped run from its last/ checkpoint (give the run folder; RUN_DIR/last is "
                     "accepted too)")
    p.add_argument("--log", action="append", choices=["tensorboard"], metavar="NAME",
                   help="also write the metric rows as TensorBoard event files under OUT/tensorboard (train.log; "
                        "needs the tensorboard package: pip install -e '.[log]' in the txl folder)")


TENSORBOARD_HINT = ("train.log tensorboard needs the tensorboard package: in the txl folder, "
                    ".venv/bin/python -m pip install -e '.[log]' (or pip install tensorboard)")


def add_run_flags(p: argparse.ArgumentParser, resume_text: str) -> None:
    """The flags of a training run that ``txl train`` and ``txl finetune`` share: ``--quiet``, ``--resume``
    (its help: ``resume_text``), ``--allow-config-change``, ``--allow-data-change`` and ``--nproc``."""
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="RUN_DIR", help=resume_text)
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept KEY=VALUE overrides that change the saved config")
    p.add_argument("--allow-data-change", action="store_true",
                   help="with --resume: continue although the data (token splits, or pairs files) differ from "
                        "those the checkpoint was trained on (size and sha256 are compared; refused otherwise)")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train in N processes on this machine (runs torchrun; one per GPU, or gloo on CPU)")


def check_resume_flags(args: argparse.Namespace) -> None:
    """``--allow-data-change`` and ``--allow-config-change`` mean something only with ``--resume``."""
    if getattr(args, "allow_data_change", False) and not args.resume:
        raise TxlError("--allow-data-change applies to --resume only (a new run records the data it trains on)")
    if getattr(args, "allow_config_change", False) and not args.resume:
        raise TxlError("--allow-config-change applies to --resume only (a new run takes every KEY=VALUE as given)")


def run(args: argparse.Namespace) -> int:
    """Run ``txl train``; returns the exit status (user errors raise :class:`TxlError`)."""
    check_resume_flags(args)
    overrides, paths = [], []
    for item in args.items:
        (overrides if "=" in item and not os.path.exists(item) else paths).append(item)  # (False for a too-long name)
    if args.data is not None:
        if paths:
            raise TxlError(f"give the corpus once: DATA {paths[0]} or --data {args.data}")
        paths = [args.data]
    if len(paths) > 1:
        raise TxlError(f"give one DATA path (a file or directory), got {len(paths)}: {' '.join(paths)}")
    check_run_args(args, paths[0] if paths else None)
    refuse_twice(args, overrides, {**_OVERRIDES, "out": "train.out_dir", "tokenizer": "data.tokenizer",
                                   "log": "train.log"}, {"data.path": f"DATA {paths[0]}"} if paths and args.data is None
                 else None)
    flags = [f"{field}={getattr(args, dest)}" for dest, field in _OVERRIDES.items()
             if dest != "data" and getattr(args, dest) is not None]
    if getattr(args, "log", None):
        flags.append("train.log=" + json.dumps(list(dict.fromkeys(args.log))))  # a TOML array of strings
    if args.resume:
        if paths or args.config or args.out or args.tokenizer:
            raise TxlError("--resume continues a run with its saved config: give no DATA, --config, --out or "
                           "--tokenizer")
        overrides += flags
        args.resume, saved, run_config = resumed_config(args.resume, overrides, args.allow_config_change)
    else:
        if paths:
            overrides.append(f"data.path={paths[0]}")
        if args.out:
            overrides.append(f"train.out_dir={args.out}")
        if args.tokenizer:
            overrides.append(f"data.tokenizer={args.tokenizer}")
        from txl.config import load_run_config  # torch: once the arguments are checked

        run_config = load_run_config(args.config, overrides + flags)
    if "tensorboard" in run_config.train.log:
        require_installed("tensorboard", message=TENSORBOARD_HINT)
    return run_training(args, run_config, NAME, changed=bool(overrides))


def refuse_twice(args: argparse.Namespace, overrides: list[str], flags: dict[str, str],
                 more: dict[str, str] | None = None) -> None:
    """Refuse a setting given both by a flag (``flags``: flag destination -> config field, and ``more``:
    config field -> how it was given, e.g. DATA) and by a KEY=VALUE override, instead of letting one
    silently win.

    Raises:
        TxlError: ``give train.seed once: --seed 7 or train.seed=8``.
    """
    from txl.config import parse_override  # (torch-free)

    shown = {dest: " ".join(map(str, value)) if isinstance(value, list) else value  # (--log a --log b: a list)
             for dest, value in ((dest, getattr(args, dest, None)) for dest in flags)}
    given = {field: f"{flag_name(args, dest)} {shown[dest]}" for dest, field in flags.items()
             if shown[dest] not in (None, "")}
    given.update(more or {})
    for text in overrides:
        section, key, _ = parse_override(text)
        if f"{section}.{key}" in given:
            raise TxlError(f"give {section}.{key} once: {given[f'{section}.{key}']} or {text}")


def run_training(args: argparse.Namespace, run_config, command: str, changed: bool) -> int:
    """The end of ``txl {command}`` (``train``, ``finetune``) once ``run_config`` is built: ``--threads`` set on
    it; a ``--resume`` without ``changed`` settings of a run already at ``train.max_steps`` said so, nothing
    trained (with changes, the training loop checks them first); else the run, in ``--nproc`` ranks
    (:func:`_launch`) or here, reported by :func:`_report`. Returns the exit status; what the launch or the
    training loop refuses raises :class:`TxlError`."""
    if args.threads is not None:  # how this process runs, not what it trains: allowed with --resume too
        run_config.train.threads = args.threads
    if args.resume and not changed:
        from txl.training.resume import saved_step

        done = saved_step(args.resume)
        if done is not None and done >= run_config.train.max_steps:
            print(f"{args.resume} is already complete at step {done} (train.max_steps={run_config.train.max_steps}); "
                  f"nothing to train. To train longer: txl {command} --resume {args.resume} --allow-config-change "
                  "train.max_steps=N")
            return 0
    if args.nproc is not None:
        return _launch(args, run_config)
    from txl.training.loop import train

    # SIGTERM outside the steps (loading, the final evaluation and sample) ends the command as Ctrl-C does,
    # with one line and exit status 130; during the steps the loop's own handler writes last/ first
    with interrupted_by(signal.SIGTERM):
        return _report(train(run_config, progress=not args.quiet, resume=bool(args.resume),
                             allow_data_change=args.allow_data_change), run_config)


def check_run_args(args: argparse.Namespace, data: str | None) -> None:
    """The ranges of ``txl train``/``txl finetune`` flags and the paths they name, checked before torch
    is imported (the config they become is checked in full when it is built).

    Raises:
        TxlError: a number out of range, or a missing DATA, ``--config`` or ``--resume`` path.
    """
    check_range(args, 1, "nproc", "batch_size")  # the span flags: txl.cli.checks.check_shared_flags
    check_range(args, 0, "grad_segments", "max_prompt_tokens")
    if getattr(args, "out", None) is not None and not args.out.strip():
        raise TxlError(f"{flag_name(args, 'out')} must name a folder, got an empty name")
    check_exists(data, "corpus path")
    check_exists(args.config, "config file", kind="file")
    check_exists(args.resume, "--resume", kind="folder")


def _launch(args: argparse.Namespace, run) -> int:
    """``txl train --nproc N ...`` (``--nproc`` >= 1, checked by :func:`check_run_args`): check what can be
    checked here, then run the same command in N ranks."""
    run.check()
    t = run.train
    if t.batch_size % (args.nproc * t.grad_accum_steps):
        raise TxlError(f"train.batch_size {t.batch_size} must divide into {args.nproc} ranks × train.grad_accum_steps "
                       f"{t.grad_accum_steps} equal pieces")
    if not args.resume:  # rank 0 checks again once it holds the folder
        from txl.training.runlog import check_new_run_folder

        check_new_run_folder(Path(t.out_dir))
    return launch_ranks(args, t.device)


def launch_ranks(args: argparse.Namespace, device: str | None) -> int:
    """Run this command again in ``--nproc`` processes (torchrun) with every ``--nproc N``/``--nproc=N`` left
    out of its arguments (``args._argv``, else ``sys.argv``); returns the exit status. ``device`` is the
    ranks' (None, ``auto`` or ``cuda``: one GPU each when CUDA is available).

    Raises:
        TxlError: more ranks than the GPUs here.
    """
    import torch

    from txl.distributed import launch

    if device in (None, "auto", "cuda") and torch.cuda.is_available() and args.nproc > torch.cuda.device_count():
        raise TxlError(f"--nproc {args.nproc} exceeds the {torch.cuda.device_count()} GPUs here (one rank per GPU)")
    argv = getattr(args, "_argv", None)
    rest = list(sys.argv[1:] if argv is None else argv)
    keep = [item for i, item in enumerate(rest) if item != "--nproc" and not item.startswith("--nproc=")
            and not (i and rest[i - 1] == "--nproc")]
    return launch(args.nproc, keep)


def _report(result, run) -> int:
    """Print what :func:`txl.training.loop.train` did (rank 0 only): the steps trained (or that a resumed run
    was already complete), the final evaluation of its best checkpoint (``last/`` for a complete run that has
    no ``best/``) and the sample; returns exit status 0."""
    if result.rank:  # torchrun: rank 0 reports for the run
        return 0
    speed = f"({result.tokens_per_s:,.0f} tokens/s including validation)"
    if result.start_step and result.steps <= result.start_step:
        print(f"{run.train.out_dir} is already complete at step {result.start_step} (train.max_steps="
              f"{run.train.max_steps}); nothing was trained")
    elif result.start_step:  # resumed: this call trained only the steps after start_step
        print(f"trained steps {result.start_step + 1}-{result.steps} (resumed after step {result.start_step}); "
              f"in all {result.steps} steps, {result.tokens:,} tokens in {result.wall_s:.0f} s {speed}")
    else:
        print(f"trained {result.steps} steps, {result.tokens:,} tokens in {result.wall_s:.0f} s {speed}")
    split, cap = run.eval.split, run.eval.max_tokens if run.finetune is None else 0
    scope = (f"the first {cap:,} targets of the {split} split (eval.max_tokens)" if cap and result.final.n_tokens >= cap
             else f"the whole {split} split")
    print(f"final, {result.best_dir.name}/ on {scope} at the [eval] span: {split} {result.final}")
    print(f"checkpoint: {result.best_dir}")
    if result.sample:
        print("--- prompt ---")
        print(result.sample_prompt, end="" if result.sample_prompt.endswith("\n") else "\n")
        print("--- sample ---")
        print(result.sample)
    return 0


def resumed_config(resume: str, overrides: list[str], allow_change: bool):
    """The run folder named by ``--resume`` (``RUN/last`` stands for ``RUN``), its saved ``run.json``
    as a dict, and the :class:`~txl.config.RunConfig` it holds with ``overrides`` applied
    and its output folder set to the run.

    Raises:
        TxlError: ``overrides`` without ``allow_change`` (``--allow-config-change``), no run there, an
            unreadable ``run.json``, or a bad override.
    """
    if overrides and not allow_change:
        raise TxlError("--resume continues a run with its saved config; to change it anyway (e.g. "
                       "train.max_steps=...), add --allow-config-change")
    from txl.config import RUN_NAME
    from txl.fileio import continue_command, read_json_object, run_kind
    from txl.training.checkpoint import resume_run_dir
    from txl.config import RunConfig, parse_override

    run_dir = str(resume_run_dir(resume))
    if run_kind(run_dir) == "classifier":
        raise TxlError(f"{run_dir} is a document-classification run: continue it with {continue_command(run_dir)}")
    saved = read_json_object(Path(run_dir) / RUN_NAME)
    changes: dict = {}
    for text in overrides:
        section, key, value = parse_override(text)
        changes.setdefault(section, {})[key] = value
    run_config = RunConfig.from_dict(changes, base=RunConfig.from_dict(saved))
    run_config.train.out_dir = run_dir
    return run_dir, saved, run_config
