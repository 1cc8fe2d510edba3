"""Reading corpus files: the files at a path, the built-in default corpus, their bytes and text."""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from txl.data.tokenizers import decode_utf8
from txl.errors import TxlError
from txl.fileio import oserrors_as, read_bytes, read_json

PathLike = str | os.PathLike[str]
FORMAT = "txl-dataset-1"  # the "format" of a dataset.json that txl data prepare writes


def dataset_info(path: PathLike | None) -> dict | None:
    """The parsed ``dataset.json`` of a folder written by ``txl data prepare``, else None.

    Returns None when ``path`` is not a folder holding ``dataset.json``. Keys: ``name``,
    ``tokenizer`` (recommended kind), ``files`` (split -> file name), ``sizes`` (bytes), ``source``,
    ``sha256``, ``sha256_verified``, ``split``, and for lm1b ``shuffled`` and ``train_shards``.
    Raises :class:`TxlError` if the file is unreadable or not a txl dataset description.
    """
    if path is None:
        return None
    f = Path(path) / "dataset.json"
    if not Path(path).is_dir() or not f.is_file():
        return None
    try:
        d = read_json(f)
    except TxlError as e:
        raise TxlError(f"{e}; run txl data prepare again") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise TxlError(f"{f} is not a txl dataset description (format {FORMAT}); run txl data prepare again")
    return d


def _prepared(root: Path) -> bool:
    """Whether ``root`` is a folder written by ``txl data prepare`` (a ``dataset.json`` naming its files)."""
    try:
        info = json.loads((root / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("format") == FORMAT


def read_corpus_files(path: PathLike, pattern: str = "*") -> list[Path]:
    """The corpus files at ``path``.

    A file gives ``[file]`` (``pattern`` is not applied). A directory gives every regular file
    below it, recursively, whose relative path matches the glob ``pattern`` (``PurePath.match``
    rules: ``"*.txt"`` matches at any depth), skipping hidden files and folders (name starting
    with ``"."``) and ``__pycache__``, sorted by relative path.

    Raises :class:`TxlError` if ``path`` does not exist, no file matches, or all are empty, or if it is a
    folder written by ``txl data prepare`` (its ``dataset.json`` names its splits: the folder is not one text).
    """
    root = Path(path)
    if not root.exists():
        raise TxlError(f"corpus path {root} does not exist; give an existing file or folder")
    if root.is_file():
        files = [root]
    elif _prepared(root):
        raise TxlError(f"{root} is a dataset prepared by txl data prepare, not one text: train on it with "
                       f"`txl train {root}`, or give one of its split files or folders here")
    elif root.is_dir():
        found: list[tuple[tuple[str, ...], Path]] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            for name in filenames:
                full = Path(dirpath) / name
                rel = full.relative_to(root)
                if name.startswith(".") or not full.is_file():
                    continue
                if PurePosixPath(rel.as_posix()).match(pattern):
                    found.append((rel.parts, full))
        files = [f for _, f in sorted(found)]
        if not files:
            raise TxlError(f"no corpus files under {root}; check the path" if pattern == "*" else
                           f"no corpus files matching {pattern!r} under {root}; check the path and data.pattern")
    else:
        raise TxlError(f"corpus path {root} is not a regular file or folder")
    if sum(_file_size(f) for f in files) == 0:
        raise TxlError(f"corpus {root} is empty ({len(files)} file(s) of size 0); give a non-empty corpus")
    return files


def default_corpus_files() -> list[Path]:
    """txl's built-in corpus: the running Python's top-level standard-library modules.

    ``sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))``: about 170 files, ~4.7 MB
    of text, present on every machine without network access. Raises :class:`TxlError` if
    none are found.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    if not files:
        raise TxlError(f"default corpus not found: no *.py files in {stdlib}; give a corpus path")
    return files


def _file_size(f: Path) -> int:
    with oserrors_as(f"cannot read corpus file {f}"):
        return f.stat().st_size


def load_bytes(files: Sequence[PathLike]) -> bytes:
    """The files' contents concatenated in order (no separators added).

    Raises :class:`TxlError` if a file cannot be read.
    """
    return b"".join(read_bytes(f, "corpus file ") for f in files)


def _read_text(files: Sequence[PathLike], kind: str) -> str:
    """All files decoded as strict UTF-8 and joined; errors name the offending file."""
    return "".join(decode_utf8(read_bytes(f, "corpus file "), f"corpus file {f}", kind) for f in files)
