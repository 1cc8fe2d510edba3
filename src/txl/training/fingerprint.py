"""Fingerprints of the data a run trains on, so that ``--resume`` notices data that changed.

A fingerprint is a dict from a part of the data (``"train split"``, ``"data.path"``, ...) to its size
and sha256: ``{"tokens": N, "sha256": HEX}`` for a token array, ``{"bytes": N, "sha256": HEX}`` for a
file. Each checkpoint's ``state.json`` (and ``trainer.json``) records the fingerprint of the data it
was trained on as ``data_fingerprint``; a resumed run compares it with the data it reads now
(:func:`check_resumed_data`). Checkpoints written before fingerprints existed record none and are
not checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from txl.data.download import sha256_file
from txl.errors import TxlError

STATE_KEY = "data_fingerprint"
"""The key of the fingerprint in a checkpoint's state."""

FLAG = "--allow-data-change"
"""The command-line flag that accepts resuming on changed data."""


def array_digest(tokens: np.ndarray) -> dict:
    """``{"tokens": N, "sha256": HEX}`` of a 1-D token array (its bytes in their stored dtype, which
    the vocabulary size fixes; read in place, not copied when contiguous)."""
    array = np.ascontiguousarray(tokens)
    return {"tokens": int(array.size), "sha256": hashlib.sha256(memoryview(array).cast("B")).hexdigest()}


def file_digest(path: str | Path) -> dict:
    """``{"bytes": N, "sha256": HEX}`` of the file at ``path``.

    Raises:
        TxlError: the file cannot be read.
    """
    digest = sha256_file(path)
    try:
        return {"bytes": Path(path).stat().st_size, "sha256": digest}
    except OSError as err:
        raise TxlError(f"cannot read {path}: {err.strerror or err}") from None


def files_digest(paths: list[Path]) -> dict:
    """``{"bytes": N, "files": K, "sha256": HEX}`` of several files in order (e.g. training shards):
    the sha256 over their names and contents' sha256.

    Raises:
        TxlError: one of the files cannot be read (:func:`file_digest`).
    """
    h = hashlib.sha256()
    total = 0
    for path in paths:
        digest = file_digest(path)
        h.update(Path(path).name.encode("utf-8", "surrogateescape") + b"\0" + digest["sha256"].encode() + b"\0")
        total += digest["bytes"]
    return {"bytes": total, "files": len(paths), "sha256": h.hexdigest()}


def _show(digest: dict | None) -> str:
    if not isinstance(digest, dict):
        return "absent"
    size = (f"{digest['tokens']:,} tokens" if "tokens" in digest else f"{digest.get('bytes', 0):,} bytes"
            + (f" in {digest['files']} files" if "files" in digest else ""))
    return f"{size}, sha256 {str(digest.get('sha256', ''))[:12]}"


def describe_changes(saved: dict, now: dict) -> list[str]:
    """One phrase per part whose size or hash differs between the fingerprints ``saved`` and ``now``
    (a part present in one only counts as changed): ``"train split: 13,733 tokens, sha256 ... then,
    now 13,700 tokens, sha256 ..."``."""
    return [f"{part}: {_show(saved.get(part))} then, now {_show(now.get(part))}"
            for part in sorted(set(saved) | set(now)) if saved.get(part) != now.get(part)]


def check_resumed_data(saved: dict | None, now: dict, *, checkpoint: str | Path, allow: bool,
                       warn: Callable[[str], None]) -> None:
    """Compare the fingerprint ``saved`` in ``checkpoint`` with that of the data read now.

    Nothing happens when they agree or when the checkpoint records none (older txl versions). With
    ``allow`` a difference is reported through ``warn`` (one line) and the run goes on.

    Raises:
        TxlError: the data differ and ``allow`` is false; the line names the parts that changed and
            the flag that accepts them (:data:`FLAG`).
    """
    if not isinstance(saved, dict) or not saved:
        return
    changes = describe_changes(saved, now)
    if not changes:
        return
    what = f"the data differ from those {checkpoint} was trained on ({'; '.join(changes)})"
    if not allow:
        raise TxlError(f"{what}; resuming would continue on other data: add {FLAG} to continue on the new data, "
                       "or start a new run")
    warn(f"{what}; continuing on the new data ({FLAG})")
