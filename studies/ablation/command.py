"""``txl ablate``: the paper's Table 6 ablation (recurrence x positional encoding) at small scale."""

from __future__ import annotations

import argparse

from txl.cli.checks import check_exists, check_range, finite_float, parse_ints
from txl.cli.common import add_data, add_threads
from txl.errors import TxlError

NAME = "ablate"
HELP = "train and compare the paper's Table 6 variants (recurrence, relative/Shaw/absolute encoding) and rotary"
EXAMPLE = "txl ablate --data data/tinyshakespeare.txt --budget-minutes 20 --out runs/ablate"
DETAILS = ("Train full Transformer-XL, relative encoding without recurrence, recurrence with Shaw et al. (2018) "
           "encoding, a vanilla absolute-position Transformer and recurrence with rotary positions (Su et al. 2021) "
           "at equal parameter count and budget, score them "
           "at several attention lengths, and write ablation.md, results.json and ablation.png into --out. "
           "Needs matplotlib: in the txl folder, .venv/bin/python -m pip install -e '.[plot]'.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``ablate`` flags (no torch import here)."""
    add_data(p, "corpus file or folder (default: the built-in default corpus, as for txl train)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--budget-tokens", type=int, default=None, metavar="N",
                        help="training tokens per variant (equal for all; default: the base train.max_steps)")
    budget.add_argument("--budget-minutes", type=finite_float, default=None, metavar="N",
                        help="total training wall-clock minutes, split equally between the variants")
    p.add_argument("--config", "-c", help="base TOML run config (default: a 4-layer d_model 128 char model; "
                                           "data.tokenizer defaults to char)")
    p.add_argument("--out", "-o", default="runs/ablate", help="output folder, new or empty (default runs/ablate)")
    p.add_argument("--lengths", default="64,128,256", help="attention lengths L for evaluation (default 64,128,256)")
    p.add_argument("--eval-tokens", type=int, default=4000, help="targets scored per length (default 4000)")
    p.add_argument("--compressive", action="store_true",
                   help="add a compressive-memory variant (Rae et al. 2019) at equal attention span: memory and "
                        "compressed memory of mem_len/2 each")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    add_threads(p, "the base config's train.threads, 0: automatic")


def run(args: argparse.Namespace) -> int:
    """Run the ablation and print the table; returns the exit status (0)."""
    import sys
    from pathlib import Path

    lengths = parse_ints(args.lengths, "--lengths", 1)
    check_range(args, 1, "budget_tokens", "eval_tokens")  # all before torch is imported
    if args.budget_minutes is not None and not args.budget_minutes > 0:
        raise TxlError(f"--budget-minutes must be > 0, got {args.budget_minutes:g}")
    check_exists(args.data, "--data")
    check_exists(args.config, "config file", kind="file")
    from txl.analysis.plots import pyplot

    pyplot()  # the table ends in ablation.png: a missing matplotlib fails now, not after training every variant
    from txl_studies.ablation.table import TABLE_NAME, default_base, describe, run_ablation
    from txl.config import load_run_config

    if args.config:
        base = load_run_config(args.config)
        if base.data.tokenizer is None:  # the built-in base is character-level
            base.data.tokenizer = default_base().data.tokenizer
    else:
        base = default_base()
    if args.threads is not None:
        base.train.threads = args.threads
    if not base.train.threads:  # chosen once from the machine now: every variant trains on the same count
        from txl.runtime import set_threads
        import torch

        set_threads(None)  # each variant's "model:" line says it: threads N (train.threads; ...)
        base.train.threads = torch.get_num_threads()
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    results = run_ablation(base, args.data, args.out, budget_tokens=args.budget_tokens,
                           budget_minutes=args.budget_minutes, lengths=lengths, eval_tokens=args.eval_tokens,
                           progress=not args.quiet, log=log, compressive=args.compressive)
    print((Path(args.out) / TABLE_NAME).read_text(encoding="utf-8"))
    print(describe(results))
    print(f"wrote {Path(args.out) / TABLE_NAME}, results.json and ablation.png")
    return 0
