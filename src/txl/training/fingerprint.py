"""Fingerprints of the data a run trains on, so that ``--resume`` notices data that changed.

A fingerprint is a dict from a part of the data (``"train split"``, ``"data.path"``, ...) to its size
and sha256: ``{"tokens": N, "sha256": HEX}`` for a token array, ``{"bytes": N, "sha256": HEX}`` for a
file. Each checkpoint's ``state.json`` (and ``trainer.json``) records the fingerprint of the data it
was trained on as ``data_fingerprint``; a resumed run compares it with the data it reads now
(:func:`check_resumed_data`). A checkpoint that records none is not checked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from txl.fileio import sha256_file
from txl.errors import TxlError
from txl.fileio import atomic_write

STATE_KEY = "data_fingerprint"
"""The key of the fingerprint in a checkpoint's state."""

FLAG = "--allow-data-change"
"""The command-line flag that accepts resuming on changed data."""


def array_digest(tokens: np.ndarray) -> dict:
    """``{"tokens": N, "sha256": HEX}`` of a 1-D token array (its bytes in their stored dtype, which
    the vocabulary size fixes; read in place, not copied when contiguous)."""
    array = np.ascontiguousarray(tokens)
    return {"tokens": int(array.size), "sha256": hashlib.sha256(memoryview(array).cast("B")).hexdigest()}


def stored_digest(path: str | Path, offset: int, nbytes: int, itemsize: int) -> dict:
    """:func:`array_digest` of a token array stored at byte ``offset`` of the token cache file ``path``
    (``nbytes`` bytes of ``itemsize`` each), read from the file 16 MiB at a time rather than through a
    memory mapping, which would bring the whole array into the process's memory.

    A cache file's name is the hash of what it holds (:func:`txl.data.corpus.encode_corpus`), so the
    digest of a range never changes: it is kept in ``PATH.digests.json`` and read from there next time.

    Raises:
        TxlError: the file cannot be read or is shorter than the range.
    """
    memo = Path(f"{path}.digests.json")
    key = f"{offset}+{nbytes}"
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    entry = known.get(key)
    if isinstance(entry, dict) and entry.get("tokens") == nbytes // itemsize and isinstance(entry.get("sha256"), str):
        return entry
    h = hashlib.sha256()
    left = nbytes
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while left and (chunk := f.read(min(left, 1 << 24))):
                h.update(chunk)
                left -= len(chunk)
    except OSError as err:
        raise TxlError(f"cannot read {path}: {err.strerror or err}") from None
    if left:
        raise TxlError(f"cannot read {path}: it ends {left:,} bytes before the tokens it should hold")
    known[key] = {"tokens": nbytes // itemsize, "sha256": h.hexdigest()}
    try:
        atomic_write(memo, lambda tmp: Path(tmp).write_text(json.dumps(known), encoding="utf-8"))
    except (OSError, TxlError):
        pass  # not kept: the next run reads the range again
    return known[key]


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


def split_digest(corpus, name: str) -> dict:
    """The fingerprint part of ``corpus``'s split ``name`` ("train", "valid" or "test"): read from its
    token cache file when the split is memory-mapped (:func:`stored_digest`), else from the array."""
    tokens, where = getattr(corpus, name), corpus.on_disk.get(name)
    return stored_digest(*where, tokens.itemsize) if where else array_digest(tokens)


def changed_since_training(state: dict, now: dict) -> list[str]:
    """:func:`describe_changes` of the parts of ``now`` that a checkpoint's ``state`` recorded (an
    evaluation reads one split, not all the data); empty when the checkpoint records none."""
    saved = state.get(STATE_KEY)
    if not isinstance(saved, dict):
        return []
    return describe_changes({k: saved[k] for k in now if k in saved}, {k: now[k] for k in now if k in saved})


def check_resumed_data(saved: dict | None, now: dict, *, checkpoint: str | Path, allow: bool,
                       warn: Callable[[str], None]) -> None:
    """Compare the fingerprint ``saved`` in ``checkpoint`` with that of the data read now.

    Nothing happens when they agree or when the checkpoint records none. With
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
