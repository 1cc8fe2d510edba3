"""What a checkpoint folder holds and which folders of a run txl may touch: the names txl writes, the
checksums that prove a checkpoint whole, and the search for the newest intact one.

A checkpoint's ``checksums.json`` lists the sha256 of every other file (written last, so a folder with
it is complete); :func:`verify_checkpoint` reads only the folder's own files against it. Checkpoint
rotation renames, replaces and deletes only folders that hold nothing but files txl writes
(:func:`foreign_files`, :func:`check_run_folder`). :mod:`txl.training.checkpoint` writes and loads
checkpoints with these.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable

from txl.config import (CHECKPOINT_NAMES, CHECKSUMS_NAME, CLASSIFIER_NAME, CONFIG_NAME, RUN_NAME, STATE_NAME,
                        VOCAB_NAME, WEIGHTS_NAME)
from txl.fileio import sha256_file
from txl.errors import TxlError
from txl.fileio import path_inside
from txl.fileio import read_json_object as _read_json

# the trainer state of a resumable checkpoint (txl.training.resume writes and reads them)
TRAINER_JSON = "trainer.json"
TRAINER_TENSORS = "trainer.safetensors"


# the files txl writes into a checkpoint folder (the model, the run and the trainer state), and the
# temporary names of :func:`txl.fileio.atomic_write` that a crash can leave beside them
_WRITTEN = {WEIGHTS_NAME, CONFIG_NAME, VOCAB_NAME, RUN_NAME, STATE_NAME, CHECKSUMS_NAME, CLASSIFIER_NAME,
            TRAINER_JSON, TRAINER_TENSORS}
_ATOMIC_TMP = re.compile(r"\..+\.tmp")
# the folders of a run directory that txl renames, replaces or deletes: best/, last/, last.<step>/, and the
# .tmp (being written), .old (being replaced) and .corrupt (set aside) ones
_ROTATED = re.compile(r"(best|last)(\.(\d+|old))?(\.(tmp|corrupt))?")


def foreign_files(folder: str | Path, complete: bool = False) -> list[str]:
    """What in ``folder`` txl did not write, so may never delete or replace; empty when it may.

    A folder txl may delete or replace holds only files (no folders, no links) named as txl names the
    files of a checkpoint (or listed in its ``checksums.json``, or left by an interrupted atomic write);
    it may be empty or partial (a ``.tmp`` folder being written, an older ``last.<step>/`` whose
    deletion was cut short). With ``complete`` (``best/`` and ``last/``, which txl only ever creates
    whole) a non-empty folder must also hold ``state.json`` or ``checksums.json``. A missing folder
    gives an empty list; a file or link where the folder should be is foreign itself.
    """
    folder = Path(folder)
    if not os.path.lexists(folder):
        return []
    if folder.is_symlink() or not folder.is_dir():
        return [f"{folder.name} is not a folder"]
    listed: set[str] = set()
    try:
        listed = set(_read_json(folder / CHECKSUMS_NAME)) if (folder / CHECKSUMS_NAME).is_file() else set()
    except TxlError:
        pass
    entries = sorted(folder.iterdir())
    foreign = [p.name + ("/" if p.is_dir() else "") for p in entries
               if p.is_symlink() or not p.is_file()
               or not (p.name in _WRITTEN or p.name in listed or _ATOMIC_TMP.fullmatch(p.name))]
    if not foreign and entries and complete and not any((folder / n).is_file() for n in (STATE_NAME, CHECKSUMS_NAME)):
        foreign = [p.name for p in entries]  # files named like txl's, but no checkpoint of txl's
    return foreign


def check_replaceable(folder: str | Path, complete: bool = False) -> None:
    """Refuse before a checkpoint write renames, replaces or deletes ``folder`` when it holds anything
    txl did not write (see :func:`foreign_files`).

    Raises:
        TxlError: naming the folder and (up to three of) the foreign files.
    """
    foreign = foreign_files(folder, complete=complete)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise TxlError(f"{folder} is not a txl checkpoint ({shown}); txl never deletes or replaces what it did not "
                       f"write: move it out of {Path(folder).parent}, then start again (or --resume)")


def check_run_folder(run_dir: str | Path) -> None:
    """Check, before a run writes its first checkpoint, every folder of ``run_dir`` that checkpoint
    rotation may rename, replace or delete (``best/``, ``last/``, ``last.<step>/``, ``*.tmp``,
    ``*.old``, ``*.corrupt``) with :func:`check_replaceable`.

    Raises:
        TxlError: one of them holds something txl did not write.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    for path in sorted(run_dir.iterdir()):
        if _ROTATED.fullmatch(path.name):
            check_replaceable(path, complete=path.name in CHECKPOINT_NAMES)


def numbered(run_dir: Path, name: str) -> list[Path]:
    """``NAME.<step>`` folders, newest step first."""
    found = [p for p in run_dir.glob(f"{name}.*") if p.is_dir() and p.suffix[1:].isdigit()]
    return sorted(found, key=lambda p: int(p.suffix[1:]), reverse=True)


def payload(folder: Path) -> list[str]:
    """The files of a checkpoint folder its ``checksums.json`` lists: every plain file but itself and hidden ones."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS_NAME
                  and not p.name.startswith("."))


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk, where the system allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def verify_checkpoint(directory: str | Path) -> bool:
    """Check every file of a checkpoint against its ``checksums.json``.

    Only files of the checkpoint folder itself are read: a listed name with a folder separator,
    ``..`` or an absolute path (a crafted ``checksums.json``), or one that is a symbolic link (it could
    lead anywhere; ``checksums.json`` itself neither), is refused before anything is opened.

    Returns:
        True when verified; False for a checkpoint that holds no checksums (e.g. a folder made by
        hand), which is accepted unverified.

    Raises:
        TxlError: a listed file is missing, truncated or altered, the checksum list is unreadable,
            or it names a file outside the folder or a symbolic link.
    """
    directory = Path(directory)
    _refuse_link(directory, directory / CHECKSUMS_NAME)
    if not (directory / CHECKSUMS_NAME).is_file():
        return False
    listed = _read_json(directory / CHECKSUMS_NAME)
    if not listed:
        return False
    where = str(directory / CHECKSUMS_NAME)
    files = {path_inside(directory, name, where): digest for name, digest in listed.items()}
    for f in files:  # every name is checked before the first file is read
        _refuse_link(directory, f)
    for f, digest in files.items():
        name = f.name
        if not isinstance(digest, str):
            raise TxlError(f"{where} gives {name} a checksum that is not a string; the checksum list is corrupt")
        if not f.is_file():
            raise TxlError(f"checkpoint {directory} is incomplete: {name} is missing")
        if sha256_file(f) != digest:
            raise TxlError(f"checkpoint {directory} is corrupt: {name} does not match its checksum")
    return True


def _refuse_link(directory: Path, path: Path) -> None:
    """Refuse a file of a checkpoint that is a symbolic link: a crafted checkpoint could link to any file."""
    if path.is_symlink():
        raise TxlError(f"checkpoint {directory} holds {path.name} as a symbolic link; txl reads only the checkpoint's "
                       "own files (a link can lead anywhere): replace the link with the file itself")


def checkpoint_candidates(run_dir: str | Path, name: str = "last") -> list[Path]:
    """``last/``, then the older ``last.<step>/`` (newest first) and a ``last.old/`` left by a crash."""
    run_dir = Path(run_dir)
    found = [run_dir / name] if (run_dir / name).is_dir() else []
    found += numbered(run_dir, name)
    if (run_dir / f"{name}.old").is_dir():
        found.append(run_dir / f"{name}.old")
    return found


def first_good_checkpoint(candidates: list[Path], required: str = CONFIG_NAME,
                          warn: Callable[[str], None] | None = None) -> Path:
    """The first of ``candidates`` that holds ``required`` and passes :func:`verify_checkpoint`.

    A skipped (torn or corrupt) candidate is reported through ``warn`` (default: stderr).

    Raises:
        TxlError: none of them is usable (the message lists why).
    """
    warn = warn or (lambda msg: print(f"txl: warning: {msg}", file=sys.stderr, flush=True))
    problems = []
    for path in candidates:
        try:
            if not (path / required).is_file():
                raise TxlError(f"checkpoint {path} is incomplete: {required} is missing")
            verify_checkpoint(path)
        except TxlError as err:
            problems.append(str(err))
            continue
        for problem in problems:
            warn(f"{problem}; using {path} instead")
        return path
    if not candidates:
        raise TxlError("no checkpoint found")
    raise TxlError("; ".join(problems) + " (no intact checkpoint left)")


def checksums(folder: Path) -> dict[str, str]:
    """``{name: sha256}`` of the :func:`payload` of ``folder``: what its ``checksums.json`` holds."""
    return {name: sha256_file(folder / name) for name in payload(folder)}
