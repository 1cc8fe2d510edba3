"""Flags that the studies' commands share (``txl recl``, ``txl data docstrings``, ``txl data packages``)."""

from __future__ import annotations

import argparse
from typing import Callable

from txl.cli.checks import finite_float
from txl.errors import TxlError


def finite_floats(count: int | None = None) -> Callable[[str], list[float]]:
    """An argparse ``type`` for comma-separated finite numbers (``0.8,0.1,0.1``), exactly ``count`` of
    them when given; each is read by :func:`~txl.cli.checks.finite_float`.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) another count of items, or an item that is
            not a finite number (naming the whole text; argparse reports it as one ``txl: error:`` line).
    """

    def parse(text: str) -> list[float]:
        items = [item.strip() for item in text.split(",")]
        if count is not None and len(items) != count:
            raise argparse.ArgumentTypeError(f"must be {count} comma-separated numbers, got {text!r}")
        try:
            return [finite_float(item) for item in items]
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} in {text!r}") from None

    parse.__name__ = "finite_floats"
    return parse


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
