"""``txl data docstrings``: the summaries study's pairs (a docstring's first sentence and its function's
source, split by module) and its pre-training corpus without the held-out modules."""

from __future__ import annotations

import argparse

from txl.cli.checks import check_range
from txl.cli.common import Command
from txl.errors import TxlError
from txl_studies.flags import check_every_split, finite_floats, package_names


def _add_docstrings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", "-o", default="data/docstrings", help="output folder, new or empty (default data/docstrings)")
    p.add_argument("--seed", type=int, default=0, help="seeds the shuffle of the modules (default 0)")
    p.add_argument("--split", type=finite_floats(3), default="0.8,0.1,0.1", metavar="TRAIN,VALID,TEST",
                   help="fractions of the modules per split (default 0.8,0.1,0.1)")
    p.add_argument("--min-bytes", type=int, default=512, metavar="N", help="shortest document kept (default 512)")
    p.add_argument("--short-train", action="store_true",
                   help="also write train-with-short.jsonl: the train pairs and the shorter documents of the same "
                        "modules (more fine-tuning examples; the split is unchanged)")
    p.add_argument("--package-train", action="store_true",
                   help="also write train-with-packages.jsonl: the train pairs (with --short-train, train-with-short's) "
                        "and every pair of the standard library's packages, less those with a valid or test pair's "
                        "document or summary (valid and test unchanged)")
    p.add_argument("--package-pretrain", action="store_true",
                   help="also copy into pretrain/ every standard-library package file with a docstring pair (a larger "
                        "pre-training corpus), less those holding a valid or test pair's document or summary")
    p.add_argument("--installed-train", type=package_names,
                   default=[], metavar="PACKAGE[,PACKAGE...]",
                   help="also write train-with-installed.jsonl: the most train pairs written above and every pair of "
                        "these installed packages' source (import names, e.g. torch,numpy: txl's own dependencies; no "
                        "test code), less those with a valid or test pair's document or summary")
    p.add_argument("--max-bytes", type=int, default=4096, metavar="N", help="longest document kept (default 4096)")


def _docstrings(args: argparse.Namespace) -> int:
    """``txl data docstrings``: write the standard-library docstring pairs and the pre-training corpus without
    the held-out modules."""
    from txl.config import check_split

    check_split(args.split, "--split", train_needed=True)  # before torch is imported (txl.data needs it)
    check_every_split(args)
    check_range(args, 1, "min_bytes")
    if args.max_bytes < args.min_bytes:
        raise TxlError(f"--max-bytes must be >= --min-bytes ({args.min_bytes}), got {args.max_bytes}")
    from txl_studies.summaries.data import prepare_docstrings

    info = prepare_docstrings(args.out, seed=args.seed, fractions=tuple(args.split), min_bytes=args.min_bytes,
                              max_bytes=args.max_bytes, short_train=args.short_train, package_train=args.package_train,
                              package_pretrain=args.package_pretrain, installed_train=args.installed_train)
    n = info["pairs"]
    m = info["modules"]
    print(f"pairs train/valid/test {n['train']}/{n['valid']}/{n['test']} from {len(m['train'])}/{len(m['valid'])}/"
          f"{len(m['test'])} modules; {args.out}/pretrain holds the {info['pretrain_files']} modules of the default "
          f"corpus outside valid and test (pre-train on it: txl train {args.out}/pretrain)")
    if info["pretrain_near_copies"] or sum(info["near_copy_pairs_left_out"].values()):
        print(f"left out as near-copies of a valid or test pair's document or summary: "
              f"{sum(info['near_copy_pairs_left_out'].values())} fine-tuning pairs, "
              f"{len(info['pretrain_near_copies'])} pre-training files ({', '.join(info['pretrain_near_copies'])})")
    if "pretrain_package_files" in info:
        print(f"{args.out}/pretrain also holds {info['pretrain_package_files']} package files")
    if "train_with_short" in n:
        print(f"train-with-short.jsonl: {n['train_with_short']} pairs (the {n['train']} train pairs, then the shorter "
              "documents of the train modules)")
    if "train_with_packages" in n:
        print(f"train-with-packages.jsonl: {n['train_with_packages']} pairs (those, then every pair of the standard "
              "library's packages)")
    if "train_with_installed" in n:
        versions = ", ".join(f"{k} {v['version'] or '(no version)'}" for k, v in info["installed_train"].items())
        print(f"train-with-installed.jsonl: {n['train_with_installed']} pairs (those, then every pair of {versions})")
    return 0


COMMAND = Command("docstrings", "standard-library functions/classes and their first docstring sentence, split by module",
                  "txl data docstrings --out data/docstrings --split 0.7,0.1,0.2 --short-train --package-train",
                  _add_docstrings, _docstrings)
