"""The output folder of ``txl data prepare``: which folders a prepare may write into, and the staging
folder where archive members wait until every one a dataset needs is found."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from txl.data.files import dataset_info
from txl.errors import TxlError
from txl.fileio import is_protected_folder, oserrors_as
from txl_recipes.datasets.download import is_url


# what a prepare writes: the splits, dataset.json, the downloads, the members being extracted, lm1b's training
# shards (from its archive)
OWN_ENTRIES = ("train.txt", "valid.txt", "test.txt", "dataset.json", ".download", ".staged",
               "training-monolingual.tokenized.shuffled")


def is_own(name: str) -> bool:
    """Whether ``name`` in an output folder is what a prepare writes: one of :data:`OWN_ENTRIES`, or the
    temporary file of one that a killed prepare left (``.train.txt.XXXX.tmp``, see ``atomic_write``)."""
    return name in OWN_ENTRIES or any(name.startswith(f".{own}.") and name.endswith(".tmp") for own in OWN_ENTRIES)


def check_out(dataset: str, source, out: Path) -> None:
    """Refuse an output folder that holds the source, is a txl checkpoint or run folder, holds files
    :func:`~.prepare.prepare_dataset` does not write, or holds another dataset (or split files without the
    ``dataset.json`` that a finished prepare writes last). A new or empty folder, or one this dataset's
    earlier prepare wrote, passes.

    Raises:
        TxlError: naming the folder and what is in the way; nothing is changed.
    """
    real = Path(os.path.realpath(out))
    if not is_url(str(source)):
        src = Path(os.path.realpath(Path(str(source)).expanduser()))
        if real == src or real in src.parents:
            raise TxlError(f"output folder {out} holds the source {source}; choose another folder (nothing was "
                           "changed)")
        if src.is_dir() and src in real.parents:
            raise TxlError(f"output folder {out} is inside the source folder {source}; choose a folder outside it "
                           "(nothing was changed)")
    if not out.is_dir():
        return
    if is_protected_folder(out):
        raise TxlError(f"output folder {out} is a txl checkpoint or run folder; choose another folder")
    others = sorted(p.name for p in out.iterdir() if not is_own(p.name))
    if others:
        shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        raise TxlError(f"output folder {out} holds files txl data prepare does not write ({shown}); choose a new "
                       "or empty folder (nothing was changed)")
    splits = [name for name in OWN_ENTRIES[:3] if (out / name).exists()]
    try:
        info = dataset_info(out)
    except TxlError as err:  # not JSON, or not a txl dataset description
        reason = str(err).removesuffix("; run txl data prepare again")
        raise TxlError(f"output folder {out} holds a dataset.json txl data prepare cannot read ({reason}); remove "
                       "it, or choose another folder (nothing was changed)") from None
    if info is not None and info.get("name") != dataset:
        raise TxlError(f"output folder {out} holds the dataset {info.get('name')!r}; choose another folder to prepare "
                       f"{dataset} (nothing was changed)")
    if splits and info is None:
        raise TxlError(f"output folder {out} holds {', '.join(splits)} but no dataset.json (files txl did not "
                       "write, or a prepare that was stopped): remove them, or choose another folder (nothing was "
                       "changed)")


def staging(out: Path) -> Path:
    """Where archive members are extracted until every one the layout needs is found, inside ``out`` (so
    on its file system): a source that lacks one leaves ``out`` as it was. A prepare empties it first
    (what a killed one left) and removes it after, whatever happens."""
    return out / ".staged"


def move_staged(out: Path) -> None:
    """Move everything extracted into :func:`staging` to its place in ``out``, replacing an earlier
    prepare's files of the same name. Every destination is checked before anything moves, and the old
    ``dataset.json`` goes first, so a half-replaced folder is never described by it.

    Raises:
        TxlError: a destination of another kind (a folder where a file goes, a file or a link where a
            folder goes), before anything moved; a move the file system refuses.
    """
    items = sorted(staging(out).iterdir())
    for item in items:
        dest = out / item.name
        if os.path.lexists(dest) and (dest.is_symlink() or dest.is_dir() != item.is_dir()):
            kind = "a link" if dest.is_symlink() else "a folder" if dest.is_dir() else "a file"
            wanted = "a folder" if item.is_dir() else "a file"
            raise TxlError(f"{dest} is {kind}, where txl data prepare writes {wanted}; remove it, or choose another "
                           "output folder (nothing was changed)")
    with oserrors_as(f"cannot move the extracted files into {out}"):
        (out / "dataset.json").unlink(missing_ok=True)
        for item in items:
            dest = out / item.name
            if dest.is_dir():
                shutil.rmtree(dest)
            os.replace(item, dest)
