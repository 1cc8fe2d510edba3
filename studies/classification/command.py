"""``txl data packages``: the long-document classification study's data, standard-library source cut into
documents labelled by package, split by file."""

from __future__ import annotations

import argparse

from txl.cli.checks import check_range
from txl.cli.common import Command, add_seed
from txl.errors import TxlError
from txl_studies.flags import check_every_split, finite_floats


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
    from txl_studies.classification.data import prepare_packages

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


COMMAND = Command("packages", "standard-library source cut into ~2 KB documents labelled by package, split by file",
                  "txl data packages --out data/packages", _add_packages, _packages)
