"""Atomic file writes: a reader never sees a half-written file, and a failed write leaves the old one.

:func:`atomic_write` writes through a temporary file beside the target, fsyncs it and renames it into
place (or, with ``overwrite=False``, links it in only if nothing stands there yet); :func:`write_json`
is the same for an indented JSON file. Every file txl writes goes through one of them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: str | Path, write: Callable[[str], None], overwrite: bool = True,
                 make_parents: bool = True) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    With ``overwrite=False`` the finished file is linked into place only if nothing stands at
    ``path`` by then (no window in which an existing file could be replaced). With ``make_parents``
    missing parent folders are created (not for a file the user named: its folder must exist).

    Raises:
        OSError: when the write fails (disk full, permissions, a missing folder); ``path`` is left as it
            was, and the error names ``path``, never the temporary file.
        TxlError: ``path`` is a folder, or a file stands where its folder should be; with
            ``overwrite=False``, a file that exists at ``path`` (it is left as it was).
    """
    from txl.errors import TxlError

    path = Path(path)
    if path.is_dir():
        raise TxlError(f"cannot write {path}: it is a folder; give a file name")
    if make_parents:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise TxlError(f"cannot write {path}: {path.parent} or a folder above it is a file") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from None  # the user's path, not the temporary name
    try:
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # writers that replace the file (safetensors) would leave 0600
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        if err.errno is not None and (err.filename in (None, tmp) or err.filename2 == tmp):  # about our file
            raise OSError(err.errno, err.strerror, str(path)) from None  # named as the user named it
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _link_new(tmp: str, path: Path) -> None:
    """Move ``tmp`` to ``path`` only if ``path`` does not exist (hard link, then unlink ``tmp``)."""
    from txl.errors import TxlError

    try:
        os.link(tmp, path)
    except FileExistsError:
        raise TxlError(f"{path} already exists (it appeared while txl was running); add --force to replace it, "
                       "or choose another file") from None
    except OSError:  # a file system without hard links: check, then rename (a narrow window remains)
        if os.path.lexists(path):
            raise TxlError(f"{path} already exists; add --force to replace it, or choose another file") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | Path, obj: Any, overwrite: bool = True, make_parents: bool = True) -> None:
    """Write ``obj`` as indented JSON, atomically (``overwrite``, ``make_parents``: as :func:`atomic_write`).

    Raises:
        OSError, TxlError: as :func:`atomic_write`.
    """
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), overwrite=overwrite,
                 make_parents=make_parents)
