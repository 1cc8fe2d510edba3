"""``txl data prepare NAME``: download or unpack a standard benchmark corpus."""

from __future__ import annotations

import argparse

from txl.cli.checks import check_exists, check_range, finite_floats, package_names
from txl.cli.common import Command, add_seed
from txl.errors import TxlError

NAME = "data"
HELP = ("standard datasets (enwik8, text8, wikitext, ptb, lm1b), the standard-library docstring pairs and "
        "package-classification set")
EXAMPLE = "txl data prepare enwik8 --out data/enwik8"


def check_every_split(args: argparse.Namespace) -> None:
    """``--split`` gives each of train, valid and test a share > 0: a zero share would write an empty
    ``SPLIT.jsonl``, which a later command could only fail on.

    Raises:
        TxlError: naming the empty splits and the flag's value.
    """
    empty = [name for name, share in zip(("train", "valid", "test"), args.split) if share <= 0]
    if empty:
        shown = ",".join(f"{f:g}" for f in args.split)
        raise TxlError(f"--split {shown} leaves {' and '.join(name + '.jsonl' for name in empty)} empty: give each "
                       "of train, valid and test a share > 0 (e.g. the default)")


def _add_prepare(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="enwik8, text8, wikitext-2, wikitext-103, wikitext-2-raw, "
                                                "wikitext-103-raw, ptb, ptb-char or lm1b")
    p.add_argument("--source", help="the official archive, a folder with its extracted files, or an http(s) URL")
    p.add_argument("--out", "-o", help="output folder (default: data/NAME)")
    p.add_argument("--sha256", help="expected sha256 of the archive (overrides the published checksum)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _prepare(args: argparse.Namespace) -> int:
    """``txl data prepare``: write train/valid/test.txt and dataset.json, print the recommended tokenizer."""
    if args.source is not None and not args.source.startswith(("http://", "https://")):
        check_exists(args.source, "--source")  # before torch is imported (txl.data needs it)
    from txl.data.datasets import prepare_dataset

    info = prepare_dataset(args.name, args.source, args.out or f"data/{args.name}", sha256=args.sha256,
                           progress=not args.quiet)
    print(f"recommended tokenizer: {info['tokenizer']}")
    return 0


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
    from txl.studies.summaries.data import prepare_docstrings

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


def _add_packages(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", "-o", default="data/packages", help="output folder, new or empty (default data/packages)")
    add_seed(p, default=0, text="seeds the split of the files and the cap's sample")
    p.add_argument("--split", type=finite_floats(3), default="0.7,0.1,0.2", metavar="TRAIN,VALID,TEST",
                   help="shares of each class's documents per split, whole files assigned (default 0.7,0.1,0.2)")
    p.add_argument("--doc-bytes", type=int, default=2048, metavar="N",
                   help="largest document in bytes, cut at line starts (default 2048)")
    p.add_argument("--min-bytes", type=int, default=1024, metavar="N", help="smallest document kept (default 1024)")
    p.add_argument("--max-per-class", type=int, default=250, metavar="N",
                   help="most documents of a class, shared out by the split fractions (0: no cap; default 250)")
    p.add_argument("--min-class-bytes", type=int, default=150_000, metavar="N",
                   help="a package is a class with at least N bytes of source (default 150000)")


def _packages(args: argparse.Namespace) -> int:
    """``txl data packages``: write the standard-library package-classification set (train/valid/test.jsonl)."""
    from txl.config import check_split

    check_split(args.split, "--split", train_needed=True)  # before torch is imported (txl.data needs it)
    check_every_split(args)
    check_range(args, 1, "min_bytes", "min_class_bytes")
    check_range(args, 0, "max_per_class")
    if args.doc_bytes < args.min_bytes:
        raise TxlError(f"--doc-bytes must be >= --min-bytes ({args.min_bytes}), got {args.doc_bytes}")
    from txl.studies.packages.data import prepare_packages

    info = prepare_packages(args.out, seed=args.seed, fractions=tuple(args.split), doc_bytes=args.doc_bytes,
                            min_bytes=args.min_bytes, max_per_class=args.max_per_class,
                            min_class_bytes=args.min_class_bytes)
    n = info["totals"]
    print(f"documents train/valid/test {n['train']}/{n['valid']}/{n['test']} in {len(info['classes'])} classes:")
    for name in info["classes"]:
        counts = "/".join(str(info["documents"][s][name]) for s in ("train", "valid", "test"))
        files = "/".join(str(len(info["files"][s][name])) for s in ("train", "valid", "test"))
        print(f"  {name}: {counts} documents from {files} files")
    print(f"wrote {args.out}/train.jsonl, valid.jsonl, test.jsonl and split.json "
          f"(classify: txl classify train LM --data {args.out}/train.jsonl --valid {args.out}/test.jsonl ...)")
    return 0


SUBCOMMANDS = (
    Command("prepare", "download/unpack a benchmark into train/valid/test.txt + dataset.json",
            "txl data prepare wikitext-103 --source wikitext-103-v1.zip", _add_prepare, _prepare),
    Command("docstrings", "standard-library functions/classes and their first docstring sentence, split by module",
            "txl data docstrings --out data/docstrings --split 0.7,0.1,0.2 --short-train --package-train", _add_docstrings, _docstrings),
    Command("packages", "standard-library source cut into ~2 KB documents labelled by package, split by file",
            "txl data packages --out data/packages", _add_packages, _packages),
)
