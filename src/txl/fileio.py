"""Atomic file writes: a reader never sees a half-written file, and a failed write leaves the old one."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
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


def read_json_object(path: str | Path) -> dict[str, Any]:
    """The JSON object stored at ``path``.

    Raises:
        TxlError: unreadable file, invalid JSON or UTF-8, or JSON that is not an object.
    """
    from txl.errors import TxlError

    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise TxlError(f"cannot read {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TxlError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise TxlError(f"{path} must hold a JSON object")
    return value


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
