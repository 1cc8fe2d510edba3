"""Atomic file writes (a reader never sees a half-written file, and a failed write leaves the old one),
and the JSON / JSON Lines readers of every command, whose only exception is :class:`~txl.errors.TxlError`."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    Raises:
        OSError: when the write fails (disk full, permissions); ``path`` is left as it was.
        TxlError: ``path`` is a folder, or a file stands where its folder should be.
    """
    from txl.errors import TxlError

    path = Path(path)
    if path.is_dir():
        raise TxlError(f"cannot write {path}: it is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise TxlError(f"cannot write {path}: {path.parent} or a folder above it is a file") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # writers that replace the file (safetensors) would leave 0600
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``; TxlError naming ``what`` and the file otherwise."""
    from txl.errors import TxlError

    try:
        data = path.read_bytes()
    except (OSError, MemoryError) as err:
        raise TxlError(f"cannot read {what}{path}: {getattr(err, 'strerror', None) or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TxlError(f"{what}{path} is not valid JSON: not UTF-8 (invalid byte at offset {err.start})") from None


def _parse(text: str, where: str) -> Any:
    """``json.loads(text)``; any failure becomes one TxlError starting with ``where``."""
    from txl.errors import TxlError

    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise TxlError(f"{where} is not valid JSON ({err.msg}: line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise TxlError(f"{where} is not valid JSON for txl: nested too deeply") from None
    except (ValueError, OverflowError, MemoryError) as err:  # e.g. integers past Python's digit limit
        reason = str(err).split(";")[0] or type(err).__name__
        raise TxlError(f"{where} is not valid JSON for txl ({reason})") from None


def _label(what: str | None) -> str:
    return f"{what} " if what else ""


def read_json(path: str | Path, what: str | None = None) -> Any:
    """The JSON value stored at ``path`` (any type), read as strict UTF-8.

    ``what`` (e.g. ``"tokenizer file"``) prefixes the file name in error messages.

    Raises:
        TxlError: the only exception, for an unreadable file, bytes that are not UTF-8, invalid
            JSON, nesting too deep for the parser (RecursionError) or numbers Python refuses
            (ValueError/MemoryError); the message names the file.
    """
    path = Path(path)
    label = _label(what)
    return _parse(_read_text(path, label), f"{label}{path}")


def read_json_object(path: str | Path, what: str | None = None) -> dict[str, Any]:
    """The JSON object stored at ``path`` (see :func:`read_json`).

    Raises:
        TxlError: as :func:`read_json`, or JSON that is not an object.
    """
    from txl.errors import TxlError

    value = read_json(path, what)
    if not isinstance(value, dict):
        raise TxlError(f"{_label(what)}{path} must hold a JSON object, not {type(value).__name__}")
    return value


def read_jsonl(path: str | Path, what: str | None = None) -> Iterator[tuple[int, Any]]:
    """``(line_number, value)`` for every non-blank line of a JSON Lines file, in order (1-based).

    Lines are separated by ``\\n`` (a trailing ``\\r`` is JSON whitespace); the whole file is read
    and decoded as strict UTF-8 before the first line is yielded.

    Raises:
        TxlError: the only exception, as :func:`read_json`; parse errors name the file and line
            (``PATH line N is not valid JSON ...``).
    """
    path = Path(path)
    label = _label(what)
    for number, line in enumerate(_read_text(path, label).split("\n"), 1):
        if line.strip():
            yield number, _parse(line, f"{label}{path} line {number}")


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
