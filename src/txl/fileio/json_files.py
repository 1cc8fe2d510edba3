"""The JSON / JSON Lines readers of every command, whose only exception is :class:`~txl.errors.TxlError`
(an unreadable file, bytes that are not UTF-8, invalid JSON, nesting too deep or numbers Python refuses
all become one line naming the file, and the line for JSON Lines), :func:`read_bytes` for other input
files, :func:`oserrors_as` for any file operation's one-line error, and :func:`path_inside`, which keeps a
file name read from such a file (``checksums.json``, ``dataset.json``) inside its folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def oserrors_as(prefix: str) -> Iterator[None]:
    """Run the block; an ``OSError`` in it becomes a :class:`~txl.errors.TxlError` ``{prefix}: reason``
    (``prefix`` as ``cannot write PATH``)."""
    from txl.errors import TxlError

    try:
        yield
    except OSError as err:
        raise TxlError(f"{prefix}: {err.strerror or err}") from None


def read_bytes(path: str | Path, what: str = "") -> bytes:
    """The bytes of the file ``path``.

    Raises:
        TxlError: the file cannot be read (``cannot read {what}{path}: reason``).
    """
    from txl.errors import TxlError

    try:
        return Path(path).read_bytes()
    except (OSError, MemoryError) as err:
        raise TxlError(f"cannot read {what}{path}: {getattr(err, 'strerror', None) or err}") from None


def sha256_file(path: str | Path, what: str = "") -> str:
    """Hex sha256 of the file at ``path``. Raises :class:`TxlError` naming ``what`` (e.g. "corpus file ") and
    the file if it is unreadable."""
    with oserrors_as(f"cannot read {what}{path}"), open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``, without the byte-order mark some editors write first (as a prompt
    file is read); TxlError naming ``what`` and the file otherwise."""
    from txl.errors import TxlError

    data = read_bytes(path, what)
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
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


def json_kind(value: Any) -> str:
    """How JSON names the type of a parsed value ("a number", "an array", "null", ...)."""
    if isinstance(value, bool):
        return "true/false"
    kinds = {int: "a number", float: "a number", str: "a string", list: "an array", dict: "an object",
             type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


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


def path_inside(folder: str | Path, name: Any, where: str, nested: bool = False) -> Path:
    """``folder / name`` for a name read from a file (``checksums.json``, ``dataset.json``), kept inside ``folder``.

    A crafted file could otherwise name ``../../etc/hostname`` or ``/etc/hostname`` and make txl read
    it. ``name`` must be a non-empty string without NUL, ``\\``, ``.``/``..`` parts or a leading
    ``/``; without ``nested`` it must also be a plain file name (no ``/`` at all), with ``nested``
    it may name a file in a subfolder (``shards/part-1.txt``). ``where`` names the file that held
    ``name`` in the error message. Symbolic links are not followed here (the caller opens the path).

    Raises:
        TxlError: ``name`` is not such a string.
    """
    from txl.errors import TxlError

    parts = name.split("/") if isinstance(name, str) else []
    if (not parts or "\\" in name or "\0" in name or name.startswith("/") or (len(parts) > 1 and not nested)
            or any(part in ("", ".", "..") for part in parts)):
        kind = "a relative path inside" if nested else "a file name inside"
        raise TxlError(f"{where} names {name!r}, which is not {kind} {folder}; refusing to read it (the file "
                       "was altered or crafted)")
    return Path(folder) / name
