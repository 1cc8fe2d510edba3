"""Flags that the studies' data commands share (``txl data docstrings``, ``txl data packages``)."""

from __future__ import annotations

import argparse

from txl.errors import TxlError


def package_names(text: str) -> list[str]:
    """An argparse ``type`` for comma-separated import names of packages (``torch,numpy``).

    Raises:
        argparse.ArgumentTypeError: an empty list or an item that is not a Python identifier.
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    bad = [item for item in items if not item.isidentifier()]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"needs comma-separated import names such as torch,numpy, got {text!r}")
    return items


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
