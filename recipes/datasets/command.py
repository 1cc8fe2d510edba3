"""``txl data prepare NAME``: download or unpack a standard benchmark corpus into a folder txl trains on."""

from __future__ import annotations

import argparse

from txl.cli.checks import check_exists
from txl.cli.common import Command


def _add_prepare(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="enwik8, text8, wikitext-2, wikitext-103, wikitext-2-raw, "
                                                "wikitext-103-raw, ptb, ptb-char, lm1b or pg19")
    p.add_argument("--source", help="the official archive, a folder with its extracted files, or an http(s) URL "
                                    "(pg19: a local copy's folder, holding train/, validation/ and test/)")
    p.add_argument("--out", "-o", help="output folder (default: data/NAME)")
    p.add_argument("--sha256", help="expected sha256 of the archive (overrides the published checksum)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _prepare(args: argparse.Namespace) -> int:
    """``txl data prepare``: write train/valid/test.txt and dataset.json, print the recommended tokenizer."""
    if args.source is not None and not args.source.startswith(("http://", "https://")):
        check_exists(args.source, "--source")  # before torch is imported (txl.data needs it)
    from txl_recipes.datasets.prepare import prepare_dataset

    info = prepare_dataset(args.name, args.source, args.out or f"data/{args.name}", sha256=args.sha256,
                           progress=not args.quiet)
    print(f"recommended tokenizer: {info['tokenizer']}")
    return 0


COMMAND = Command("prepare", "download/unpack a benchmark into train/valid/test.txt + dataset.json (pg19: in place)",
                  "txl data prepare wikitext-103 --source wikitext-103-v1.zip", _add_prepare, _prepare)
