"""The guards every command uses before it writes: :func:`claim_folder` (one process per output
folder, see :class:`FolderClaim`) and :func:`check_output_path` (never over an input, never into a
checkpoint or run folder, never over an existing file without ``--force``, only into an existing folder
that takes new files), with the rules behind them: :func:`protected_folder` (a txl checkpoint or run
folder, by :data:`RUN_MARKERS` and :data:`WEIGHTS_MARKERS`) and :func:`refuse_nonempty_folder`.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from txl.config.fields import CHECKSUMS_NAME, CONFIG_NAME, RUN_NAME, WEIGHTS_NAME


# the files that make a folder a txl checkpoint or run folder (txl.training.checkpoint writes them):
# run.json or checksums.json, or config.json beside model.safetensors (LM and classifier checkpoints,
# converted checkpoints)
RUN_MARKERS = (RUN_NAME, CHECKSUMS_NAME)
WEIGHTS_MARKERS = (CONFIG_NAME, WEIGHTS_NAME)
LOCK_SUFFIX = ".txl-lock"


def is_protected_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is a txl checkpoint or run folder (see :data:`RUN_MARKERS`, :data:`WEIGHTS_MARKERS`)."""
    folder = Path(folder)
    try:
        return (any((folder / name).is_file() for name in RUN_MARKERS)
                or all((folder / name).is_file() for name in WEIGHTS_MARKERS))
    except OSError:
        return False


def run_kind(run_dir: str | Path) -> str:
    """The kind of txl run in ``run_dir`` (torch-free, for messages said before anything loads):
    ``"classifier"`` (``classifier.json`` in ``last/`` or ``best/``), ``"fine-tuning"`` (a ``[finetune]``
    section in ``run.json``), else ``"language-model"``."""
    from txl.config.fields import CLASSIFIER_NAME

    run_dir = Path(run_dir)
    if any((run_dir / name / CLASSIFIER_NAME).is_file() for name in ("last", "best")):
        return "classifier"
    try:
        saved = json.loads((run_dir / RUN_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    return "fine-tuning" if isinstance(saved, dict) and saved.get("finetune") is not None else "language-model"


def continue_command(run_dir: str | Path) -> str:
    """The command that continues the txl run in ``run_dir``, by its :func:`run_kind`."""
    return {"classifier": f"txl classify train LM --data DATA --resume {run_dir} (the settings it started with)",
            "fine-tuning": f"txl finetune --resume {run_dir}"}.get(run_kind(run_dir), f"txl train --resume {run_dir}")


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


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it exists as something other than a regular file (a symbolic link, a device,
    a FIFO or a socket), said for a message; None for a regular file or nothing."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")


def check_output_path(path: str | Path, inputs=(), force: bool = False, flag: str = "--out",
                      makes_folder: bool = False) -> Path:
    """Check that a command may write the user-named output file ``path``; return it as a Path.

    Refused, in this order: ``path`` is a folder; its folder does not exist (with ``makes_folder``, for a
    file in a folder the command creates such as ``txl plot --out DIR``: the nearest existing folder above
    it counts) or is a file; it lies inside a txl checkpoint or run folder (:func:`protected_folder`); it is
    (by resolved path, symlink or hard link) one of ``inputs`` or an existing file inside an input folder
    (which is read whole); it exists as anything but a regular file (a symbolic link, a device such as
    ``/dev/null``, a FIFO: a replace would put a file in its place); it exists and ``force`` is false; no
    file can be created in its folder (tried with an empty hidden file, removed at once). ``force`` lifts
    only the existing-file refusal. ``flag`` names the option in the message (``--json``), and every
    message names ``path`` as the user gave it.

    Raises:
        TxlError: one line naming the problem and what to do; nothing is written.
    """
    from txl.errors import TxlError

    path = Path(path)
    other = f"another {flag} folder" if makes_folder else "another file"  # (makes_folder: the flag names a folder)
    if path.is_dir():
        raise TxlError(f"{flag} {path} is a folder; " + (f"remove it, or choose {other}" if makes_folder
                                                         else "give a file name"))
    parent = existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise TxlError(f"{flag} {path}: {existing} is a file, not a folder; choose another place for the output")
    if existing != parent and not makes_folder:
        raise TxlError(f"{flag} {path}: the folder {parent} does not exist; create it first, or choose another file "
                       "(txl creates no folder for an output file)")
    folder = protected_folder(path)  # the resolved path's folders: a symlink into a checkpoint counts
    if folder is not None:
        raise TxlError(f"{flag} {path} is inside the txl checkpoint or run folder {folder}; txl never writes "
                       f"into one: choose {'a folder' if makes_folder else 'a file'} outside it")
    conflict = _input_conflict(path, inputs)
    if conflict:
        raise TxlError(f"{flag} {path} {conflict}; txl never writes over its inputs: choose {other}")
    kind = _special_kind(path)
    if kind:  # a replace would put a regular file in its place (a device such as /dev/null included)
        if makes_folder:
            todo = f"remove it, or choose {other}"
        elif kind == "a symbolic link":
            todo = f"give the path it points to ({os.path.realpath(path)}), or remove the link"
        else:
            todo = "give the path of a regular file, or - for stdout where the flag takes it"
        raise TxlError(f"{flag} {path} is {kind}, not a regular file; txl writes an output file whole and would "
                       f"put a new file in its place: {todo}")
    if os.path.lexists(path) and not force:
        raise TxlError(f"{flag} {path} already exists; add --force to replace it, or choose {other}")
    try:  # the only sure test (permissions, read-only or special file systems, root's exemptions)
        fd, probe = tempfile.mkstemp(prefix=".txl-probe.", dir=existing)
    except OSError as err:
        raise TxlError(f"{flag} {path}: txl cannot create files in {existing} ({err.strerror or err}); choose a "
                       "writable folder") from None
    os.close(fd)
    os.unlink(probe)
    return path


class FolderClaim:
    """This process's exclusive claim on an output folder (see :func:`claim_folder`).

    Attributes:
        path: the folder. created: whether the claim created it.
    """

    def __init__(self, path: Path, lock_path: Path, fd: int, created: bool) -> None:
        self.path, self.lock_path, self.created = path, lock_path, created
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the folder up: remove it if this claim created it and it is empty, then remove the lock file
        and unlock. Safe to call more than once."""
        if self._fd is None:
            return
        try:
            if self.created:
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


def refuse_nonempty_folder(path: Path, subject: str, advice: str) -> None:
    """Refuse an existing folder that holds anything: the one rule behind ``claim_folder(empty=True)``
    and a new training run's folder (:func:`txl.training.runlog.check_new_run_folder`). A missing
    folder, or an empty one, passes.

    Args:
        subject: how the message starts (``DST runs/x already exists and``).
        advice: what the message says after the listing (``"; choose a new or empty folder"``).

    Raises:
        TxlError: ``{subject} is not empty (ENTRIES){advice}``, naming up to four entries (folders with a
            trailing ``/``) and how many more there are.
    """
    from txl.errors import TxlError

    if not path.is_dir():
        return
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    if entries:
        shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
        raise TxlError(f"{subject} is not empty ({shown}){advice}")


def _lock_path(folder: Path) -> Path:
    """The lock file of ``folder``: a hidden file beside it, named after its resolved path."""
    real = Path(os.path.realpath(folder))
    return real.parent / f".{real.name}{LOCK_SUFFIX}"


def _lock_or_refuse(fd: int, mode: int, flag: str, path: Path) -> None:
    """Lock the open lock file ``fd`` of the folder ``path`` (``mode``: shared or exclusive) without waiting.

    Raises:
        TxlError: another process holds the claim (named by the pid its lock file holds).
    """
    import fcntl

    from txl.errors import TxlError

    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip()
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise TxlError(f"{flag} {path} is in use by another txl process{who}; wait for it to finish, "
                       "or choose another folder") from None


def check_output_folder(path: str | Path, *, flag: str = "--out", create: bool = True, empty: bool = False,
                        inputs=()) -> None:
    """The checks of :func:`claim_folder` without the claim, for a command that fails early on a bad
    output folder and claims it later (through the training loop): ``path`` is no file, not inside a
    txl checkpoint or run folder nor one of ``inputs`` (or inside one), exists unless ``create``, is
    new or empty with ``empty``, and no other process holds its claim now. Nothing is created.

    Raises:
        TxlError: naming the problem.
    """
    import fcntl

    from txl.errors import TxlError

    path = Path(path)
    lock = _lock_path(path)
    if lock.is_file() and not lock.is_symlink():  # a claim may be held: try it without waiting, let go at once
        try:
            fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            fd = None
        if fd is not None:
            try:
                _lock_or_refuse(fd, fcntl.LOCK_SH, flag, path)
            finally:
                os.close(fd)
    if os.path.lexists(path) and not path.is_dir():
        kind = "a dangling symbolic link" if not path.exists() else _special_kind(path) or "a file"
        raise TxlError(f"{flag} {path} is {kind}; choose a folder")
    above = next((p for p in path.parents if p.exists()), None)  # the nearest existing path above it
    if above is not None and not above.is_dir():
        raise TxlError(f"{flag} {path} would be inside {above}, which is a file; choose a folder")
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
    if empty and path.is_dir():
        refuse_nonempty_folder(path, f"{flag} {path} already exists and", "; choose a new or empty folder "
                               "(nothing was changed)")


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
    check_output_folder(path, flag=flag, create=create, inputs=inputs)
    for _ in range(100):  # retried only when a releasing holder removed the lock file under us
        lock = _lock_path(path)
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                         0o644)
        except OSError as err:
            raise TxlError(f"cannot claim {flag} {path}: {err.strerror or err} ({lock})") from None
        try:
            _lock_or_refuse(fd, fcntl.LOCK_EX, flag, path)
        except BaseException:
            os.close(fd)
            raise
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
        if empty:
            refuse_nonempty_folder(path, f"{flag} {path} already exists and", "; choose a new or empty folder "
                                   "(nothing was changed)")
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
