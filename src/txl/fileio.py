"""Atomic file writes (a reader never sees a half-written file, and a failed write leaves the old one),
the JSON / JSON Lines readers of every command, whose only exception is :class:`~txl.errors.TxlError`, and the two
guards every command uses before it writes: :func:`claim_folder` (one process per output folder) and
:func:`check_output_path` (never over an input, never into a checkpoint or run folder, never over an
existing file without ``--force``)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def atomic_write(path: str | Path, write: Callable[[str], None], overwrite: bool = True) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    With ``overwrite=False`` the finished file is linked into place only if nothing stands at
    ``path`` by then (no window in which an existing file could be replaced).

    Raises:
        OSError: when the write fails (disk full, permissions); ``path`` is left as it was.
        TxlError: ``path`` is a folder, or a file stands where its folder should be; with
            ``overwrite=False``, a file that exists at ``path`` (it is left as it was).
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
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
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


def write_json(path: str | Path, obj: Any, overwrite: bool = True) -> None:
    """Write ``obj`` as indented JSON, atomically (``overwrite``: as :func:`atomic_write`).

    Raises:
        OSError, TxlError: as :func:`atomic_write`.
    """
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), overwrite=overwrite)


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


# --- output guards --------------------------------------------------------------------------------------------

# the files that make a folder a txl checkpoint or run folder (txl.training.checkpoint writes them; named
# here because this module is the bottom layer): run.json or checksums.json, or config.json beside
# model.safetensors (LM and classifier checkpoints, converted checkpoints)
RUN_MARKERS = ("run.json", "checksums.json")
WEIGHTS_MARKERS = ("config.json", "model.safetensors")
LOCK_SUFFIX = ".txl-lock"


def is_protected_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is a txl checkpoint or run folder (see :data:`RUN_MARKERS`, :data:`WEIGHTS_MARKERS`)."""
    folder = Path(folder)
    try:
        return (any((folder / name).is_file() for name in RUN_MARKERS)
                or all((folder / name).is_file() for name in WEIGHTS_MARKERS))
    except OSError:
        return False


def protected_folder(path: str | Path) -> Path | None:
    """The nearest checkpoint or run folder that ``path`` (resolved through symlinks) is inside, or None.

    ``path`` itself counts when it is a folder; its parents are walked up to the root.
    """
    real = Path(os.path.realpath(path))
    for folder in (real, *real.parents):
        if folder.is_dir() and is_protected_folder(folder):
            return folder
    return None


def _stat(path: str | Path) -> os.stat_result | None:
    """``os.stat`` of ``path`` as the kernel reads it, else of its lexically resolved form, else None.

    The two differ for ``missing/../name``: refusing on either reading is the safe side.
    """
    for candidate in (path, os.path.realpath(path)):
        try:
            return os.stat(candidate)
        except OSError:
            continue
    return None


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same resolved path, or the same inode (hard links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    sa, sb = _stat(a), _stat(b)
    return sa is not None and sb is not None and (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _input_conflict(path: Path, inputs) -> str | None:
    """Why writing ``path`` would touch one of ``inputs`` (files or folders), or None."""
    target = _stat(path)  # follows a symlink: its target is what the name stands for
    for item in inputs:
        if item is None or str(item) == "-":
            continue
        if _same_file(path, item):
            return f"is the input {item}"
        if target is not None and os.path.isdir(item):
            # an input folder is read whole: a file in it (or a link to one) is an input
            for root, _, names in os.walk(item):
                for name in names:
                    try:
                        st = os.stat(os.path.join(root, name))
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                        return f"is the input {os.path.join(root, name)} (read from the input folder {item})"
    return None


def check_output_path(path: str | Path, inputs=(), force: bool = False, flag: str = "--out") -> Path:
    """Check that a command may write the user-named output file ``path``; return it as a Path.

    Refused, in this order: ``path`` is a folder; it lies inside a txl checkpoint or run folder
    (:func:`protected_folder`); it is (by resolved path, symlink or hard link) one of ``inputs`` or an
    existing file inside an input folder (which is read whole); it exists and ``force`` is false.
    ``force`` lifts only the last refusal. ``flag``
    names the option in the message (``--json``).

    Raises:
        TxlError: one line naming the problem and what to do; nothing is written.
    """
    from txl.errors import TxlError

    path = Path(path)
    if path.is_dir():
        raise TxlError(f"{flag} {path} is a folder; give a file name")
    folder = protected_folder(path)  # the resolved path's folders: a symlink into a checkpoint counts
    if folder is not None:
        raise TxlError(f"{flag} {path} is inside the txl checkpoint or run folder {folder}; txl never writes "
                       "into one: choose a file outside it")
    conflict = _input_conflict(path, inputs)
    if conflict:
        raise TxlError(f"{flag} {path} {conflict}; txl never writes over its inputs: choose another file")
    if os.path.lexists(path) and not force:
        raise TxlError(f"{flag} {path} already exists; add --force to replace it, or choose another file")
    return path


class FolderClaim:
    """This process's exclusive claim on an output folder (see :func:`claim_folder`).

    Attributes:
        path: the folder. created: whether the claim created it.
    """

    def __init__(self, path: Path, lock_path: Path, fd: int, created: bool) -> None:
        self.path, self.lock_path, self.created = path, lock_path, created
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether the claim is still held (not yet released)."""
        return self._fd is not None

    def release(self, remove_empty: bool = True) -> None:
        """Give the folder up: with ``remove_empty``, remove it if this claim created it and it is empty;
        then remove the lock file and unlock. Safe to call more than once."""
        if self._fd is None:
            return
        try:
            if remove_empty and self.created:
                try:
                    self.path.rmdir()  # only succeeds when empty
                except OSError:
                    pass
            try:
                self.lock_path.unlink()  # still locked: a waiting claimer re-checks the inode and retries
            except OSError:
                pass
        finally:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> "FolderClaim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _lock_path(folder: Path) -> Path:
    """The lock file of ``folder``: a hidden file beside it, named after its resolved path."""
    real = Path(os.path.realpath(folder))
    return real.parent / f".{real.name}{LOCK_SUFFIX}"


def claim_folder(path: str | Path, *, flag: str = "--out", create: bool = True, empty: bool = False,
                 inputs=()) -> FolderClaim:
    """Claim the output folder ``path`` for this process, before anything is written into it.

    The claim is an ``fcntl.flock`` on a lock file beside the folder (``.NAME.txl-lock``), taken
    without waiting: of several processes started on the same folder exactly one gets it, the
    others fail at once. The kernel drops the lock when its process dies, so a crashed or killed
    run never leaves the folder stuck: the next claim takes the stale lock file over. Once the
    lock is held the folder is created (with ``create``) and checked. Release it with
    :meth:`FolderClaim.release` (or use the claim as a context manager).

    Args:
        flag: how the folder was given, for messages (``--out``, ``train.out_dir``, ``DST``).
        create: create the folder (and its parents) when missing; otherwise it must exist.
        empty: the folder must be new or empty.
        inputs: files and folders the command reads: the folder may not be one of them or lie inside one.

    Raises:
        TxlError: another process holds the folder; ``path`` is a file, inside a txl checkpoint or run
            folder or an input folder, missing (without ``create``), not empty (with ``empty``), or
            cannot be created. Nothing is changed then.
    """
    import fcntl
    import time

    from txl.errors import TxlError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TxlError(f"{flag} {path} is a file; choose a folder")
    folder = protected_folder(Path(os.path.realpath(path)).parent)
    if folder is not None:
        raise TxlError(f"{flag} {path} is inside the txl checkpoint or run folder {folder}; choose a folder "
                       "outside it")
    for item in inputs:
        if item is not None and os.path.isdir(item):
            item_real = Path(os.path.realpath(item))
            real = Path(os.path.realpath(path))
            if real == item_real or item_real in real.parents:
                raise TxlError(f"{flag} {path} is the input folder {item} or inside it; choose another folder")
    if not path.exists() and not create:
        raise TxlError(f"{flag} {path} does not exist")
    for _ in range(100):  # retried only when a releasing holder removed the lock file under us
        lock = _lock_path(path)
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                         0o644)
        except OSError as err:
            raise TxlError(f"cannot claim {flag} {path}: {err.strerror or err} ({lock})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise TxlError(f"{flag} {path} is in use by another txl process{who}; wait for it to finish, "
                           "or choose another folder") from None
        try:
            same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if not same:  # the holder released (and removed) the file between our open and our lock
            os.close(fd)
            time.sleep(0.001)
            continue
        break
    else:
        raise TxlError(f"cannot claim {flag} {path}: its lock file {lock} keeps changing")
    claim = None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        created = False
        if not path.exists():
            if not create:
                raise TxlError(f"{flag} {path} does not exist")
            try:
                path.mkdir(parents=True)
                created = True
            except FileExistsError:
                pass
            except OSError as err:
                raise TxlError(f"cannot create {flag} {path}: {err.strerror or err}") from None
        if not path.is_dir():
            raise TxlError(f"{flag} {path} is a file; choose a folder")
        claim = FolderClaim(path, lock, fd, created)
        if empty and any(path.iterdir()):
            raise TxlError(f"{flag} {path} already exists and is not empty; choose a new folder (nothing was changed)")
        return claim
    except BaseException:
        if claim is not None:
            claim.release()
        else:
            try:
                lock.unlink()
            except OSError:
                pass
            os.close(fd)
        raise
