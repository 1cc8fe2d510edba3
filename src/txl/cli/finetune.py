"""``txl finetune``: fine-tune a language model on prompt/completion pairs, or continue a stopped run.

The run is a ``txl train`` run with a ``[finetune]`` section (see :mod:`txl.training.finetune`): the
same run folder, checkpoints, ``--resume``, progress bar, ``metrics.csv``, ``--nproc`` and errors.
"""

from __future__ import annotations

import argparse

from txl.cli.checks import check_exists
from txl.cli.common import add_batch_size, add_data, add_device, add_dtype, add_option, add_seed, add_span, underscore
from txl.cli.train import (add_run_flags, check_resume_flags, check_run_args, refuse_twice, resumed_config,
                            run_training)
from txl.errors import TxlError

NAME = "finetune"
HELP = "fine-tune a language model on prompt/completion pairs (the prompt read with memory)"
EXAMPLE = "txl finetune --init runs/default --data pairs.jsonl --out runs/pairs train.max_steps=500"
DETAILS = ("--data is a JSON Lines file of {\"prompt\": ..., \"completion\": ...} objects, cut into train/valid/test "
           "by data.split (default 0.9/0.1/0), or give data.train=... data.valid=... [data.test=...]. Each example is "
           "prompt + separator + completion + end marker; the loss counts the completion and the end marker only "
           "(docs/finetuning.md).")

# flags that are config overrides here: flag destination -> config field
_OVERRIDES = {"device": "train.device", "dtype": "train.dtype", "seed": "train.seed", "batch_size": "train.batch_size",
              "grad_segments": "finetune.grad_segments", "tgt_len": "model.tgt_len", "mem_len": "model.mem_len",
              "max_prompt_tokens": "finetune.max_prompt_tokens"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``finetune`` flags (no torch import here)."""
    p.set_defaults(_more="overrides")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides such as train.max_steps=500 finetune.grad_segments=2 lr=1e-4")
    p.add_argument("--init", metavar="LM_RUN", help="the language-model checkpoint or run directory to start from")
    add_data(p, "JSON Lines file of {\"prompt\", \"completion\"} pairs")
    p.add_argument("--config", "-c", help="TOML run config (sections model, data, train, eval, finetune)")
    p.add_argument("--out", "-o", help="run directory to write")
    add_option(p, "--grad-segments", aliases=underscore("--grad-segments"), type=int, default=None, metavar="K",
               help="back-propagate through the last K segments of each example (0: all; default 1)")
    add_option(p, "--max-prompt-tokens", aliases=underscore("--max-prompt-tokens"), type=int, default=None,
               metavar="N", help="keep only the last N tokens of each prompt (default 0: whole prompts)")
    add_span(p, ("tgt_len", "mem_len"), default_text="the language model's")
    add_device(p, threads_text="train.threads, 0: automatic")
    p.set_defaults(device=None)
    add_dtype(p, default=None)
    add_batch_size(p, text="examples per step", default_text="train.batch_size of the config, else 8")
    add_seed(p, text="train.seed", unset="1234")
    add_run_flags(p, "continue a stopped fine-tuning run from its last/ checkpoint")


def run(args: argparse.Namespace) -> int:
    """Run ``txl finetune``; returns the exit status (user errors raise :class:`TxlError`)."""
    check_resume_flags(args)
    for item in args.overrides:
        if "=" not in item:
            raise TxlError(f"unexpected argument {item!r}: give the pairs with --data and overrides as KEY=VALUE")
    check_run_args(args, None)  # before torch is imported
    refuse_twice(args, args.overrides, {**_OVERRIDES, "out": "train.out_dir"})
    check_exists(args.init, "--init", kind="folder")
    check_exists(args.data, "--data", kind="file")
    flags = [f"{field}={getattr(args, dest)}" for dest, field in _OVERRIDES.items() if getattr(args, dest) is not None]
    overrides = [*args.overrides, *flags]
    if args.resume:
        if args.init or args.data or args.config or args.out:
            raise TxlError("--resume continues a run with its saved config: give no --init, --data, --config or --out")
        args.resume, saved, run_config = resumed_config(args.resume, overrides, args.allow_config_change)
        if "finetune" not in saved:
            raise TxlError(f"{args.resume} is a language-model run, not a fine-tuning run; continue it with "
                           f"txl train --resume {args.resume}")
    else:
        if not args.init:
            raise TxlError("give the language model to start from: --init LM_RUN")
        if not args.out:
            raise TxlError("give the run directory to write: --out RUN")
        if args.data is None and not any(o.split("=", 1)[0].strip() in ("data.train", "train") for o in args.overrides):
            raise TxlError("give the pairs: --data PAIRS.jsonl (or data.train=... data.valid=...)")
        from txl.training.finetune import finetune_config

        run_config = finetune_config(args.init, args.data, out_dir=args.out, config=args.config,
                                     overrides=overrides)
    return run_training(args, run_config, NAME, changed=bool(overrides))
