"""Standard language-modelling benchmarks: ``txl data prepare NAME --source ... --out DIR``.

:func:`prepare_dataset` turns an official archive (a local file, a folder holding its extracted
files, or an http(s) URL) into a folder with ``train.txt``, ``valid.txt``, ``test.txt`` and
``dataset.json``; :func:`txl.data.files.dataset_info` reads that ``dataset.json`` back, and
:func:`~txl.data.corpus.load_corpus` trains on such a folder directly.

Layouts (member names checked against the public preparation scripts: the Transformer-XL
``getdata.sh``, Salesforce ``prep_enwik8.py``, the Hugging Face ``wikitext`` loader and
TensorFlow's ``lm1b`` checksums):

* enwik8 / text8: ``enwik8.zip`` / ``text8.zip`` hold one file ``enwik8`` / ``text8``; it is cut
  by :func:`standard_split` (bytes for enwik8, characters for text8).
* wikitext-2 / -103: ``wikitext-2/wiki.{train,valid,test}.tokens``; the raw variants
  ``wikitext-2-raw/wiki.*.raw`` (already WikiText-tokenised, without ``<unk>``).
* ptb / ptb-char: ``simple-examples.tgz`` members ``./simple-examples/data/ptb.{train,valid,test}.txt``
  and ``ptb.char.{train,valid,test}.txt``.
* lm1b: ``training-monolingual.tokenized.shuffled/news.en-000NN-of-00100`` (train shards, listed
  one path per line in ``train.txt``, not concatenated) and
  ``heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050``, which the
  Transformer-XL reference uses as both valid and test set (so do we; ``valid.txt == test.txt``).
* pg19: a local copy of PG-19 (the Compressive Transformer's books, ``gs://deepmind-gutenberg``):
  folders ``train/``, ``validation/`` and ``test/`` of ``*.txt`` books, one book a document. They are
  used in place (``dataset.json`` names them; nothing is copied) and read through the token cache
  chunk by chunk, never whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from txl.data.files import FORMAT
from txl.data.splits import SPLITS
from txl.errors import TxlError
from txl.fileio import atomic_write, claim_folder, oserrors_as, read_bytes, sha256_file, write_json
from txl_recipes.datasets.download import check_sha256, download, extract, is_archive, is_url
from txl_recipes.datasets.output import check_out, move_staged, staging

__all__ = ["DATASETS", "DatasetSpec", "prepare_dataset", "standard_split"]

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".gz", ".bz2", ".xz")  # names of the archives extract reads
MAX_FOLDER_FILES = 100_000  # bound on the files searched in a --source folder


@dataclass(frozen=True)
class DatasetSpec:
    """How one benchmark is laid out and prepared.

    Attributes:
        name: the ``txl data prepare`` name. url: the official download URL.
        archive: the official archive file name. tokenizer: recommended tokenizer kind.
        layout: ``"split"`` (one member cut 90/5/5), ``"files"`` (train/valid/test members),
            ``"lm1b"`` (train shards + held-out file) or ``"pg19"`` (folders of books, used in place).
        members: pattern per role (a path suffix; the last part may be a glob).
        unit: ``"bytes"`` or ``"characters"`` for the ``"split"`` layout.
        sha256: published sha256 of ``archive`` (None if no public sha256 is known).
        max_member_bytes: no member of the official archive is larger (with a margin); extraction
            stops at this size, so a damaged or hostile archive cannot fill the disk.
    """

    name: str
    url: str
    archive: str
    tokenizer: str
    layout: str
    members: dict
    unit: str = "bytes"
    sha256: str | None = None
    max_member_bytes: int = 200_000_000


_WT = "https://s3.amazonaws.com/research.metamind.io/wikitext/"
_PTB = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"


def _wikitext(name: str, folder: str, ext: str, zip_name: str, sha: str) -> DatasetSpec:
    members = {s: f"{folder}/wiki.{s}.{ext}" for s in SPLITS}
    largest = 1_000_000_000 if "103" in name else 50_000_000  # train files: 540 MB and 11 MB
    return DatasetSpec(name, _WT + zip_name, zip_name, "word", "files", members, sha256=sha,
                       max_member_bytes=largest)


# sha256 values: only published ones. enwik8 and the four WikiText zips: Hugging Face datasets,
# datasets/enwik8/dataset_infos.json and datasets/wikitext/dataset_infos.json ("download_checksums");
# lm1b: TensorFlow Datasets, tensorflow_datasets/url_checksums/lm1b.txt. No public sha256 was
# found for text8.zip or simple-examples.tgz (only sizes / md5), so those are not verified.
DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in [
        DatasetSpec("enwik8", "http://mattmahoney.net/dc/enwik8.zip", "enwik8.zip", "byte", "split",
                    {"all": "enwik8"}, "bytes",
                    "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
                    max_member_bytes=110_000_000),  # the file is exactly 100,000,000 bytes
        DatasetSpec("text8", "http://mattmahoney.net/dc/text8.zip", "text8.zip", "char", "split",
                    {"all": "text8"}, "characters", max_member_bytes=110_000_000),
        _wikitext("wikitext-2", "wikitext-2", "tokens", "wikitext-2-v1.zip",
                  "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c"),
        _wikitext("wikitext-2-raw", "wikitext-2-raw", "raw", "wikitext-2-raw-v1.zip",
                  "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11"),
        _wikitext("wikitext-103", "wikitext-103", "tokens", "wikitext-103-v1.zip",
                  "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"),
        _wikitext("wikitext-103-raw", "wikitext-103-raw", "raw", "wikitext-103-raw-v1.zip",
                  "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"),
        DatasetSpec("ptb", _PTB, "simple-examples.tgz", "word", "files",
                    {s: f"simple-examples/data/ptb.{s}.txt" for s in SPLITS}, max_member_bytes=50_000_000),
        DatasetSpec("ptb-char", _PTB, "simple-examples.tgz", "char", "files",
                    {s: f"simple-examples/data/ptb.char.{s}.txt" for s in SPLITS}, max_member_bytes=50_000_000),
        DatasetSpec("lm1b", "http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz",
                    "1-billion-word-language-modeling-benchmark-r13output.tar.gz", "word", "lm1b",
                    {"train": "training-monolingual.tokenized.shuffled/news.en-?????-of-00100",
                     "heldout": "heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050"},
                    sha256="01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e"),
        DatasetSpec("pg19", "gs://deepmind-gutenberg (https://github.com/google-deepmind/pg19)",
                    "a local copy of the pg19 folders", "bpe", "pg19",
                    {"train": "train", "valid": "validation", "test": "test"}),
    ]
}


def standard_split(total: int, unit: str = "units") -> tuple[int, int]:
    """End offsets ``(train_end, valid_end)`` of the 90% / 5% / 5% split of ``total`` units.

    ``train = [0, total*9//10)``, ``valid = [train_end, total*19//20)``, ``test = [valid_end,
    total)`` (floor rounding). For the real 100,000,000-unit enwik8/text8 files this is exactly
    the reference split: the first 90M train, the next 5M valid, the last 5M test; smaller files
    (e.g. test fixtures) get the same fractions. Raises :class:`TxlError` if ``total < 20``
    (a split would be empty); its message counts in ``unit`` ("bytes", "characters").
    """
    if total < 20:
        raise TxlError(f"the file has {total} {unit}; at least 20 are needed for a 90/5/5 split")
    return total * 9 // 10, total * 19 // 20


def _matches(parts: tuple[str, ...], pattern: str) -> bool:
    """Whether a path (its parts) ends with ``pattern`` (the last pattern part may be a glob)."""
    pat = pattern.split("/")
    if len(parts) < len(pat):
        return False
    tail = parts[len(parts) - len(pat):]
    return tuple(tail[:-1]) == tuple(pat[:-1]) and fnmatch.fnmatchcase(tail[-1], pat[-1])


def _write_file(dest: Path, data: bytes | Path) -> None:
    """Write ``data`` to ``dest`` atomically: bytes, or a copy of the file at the path ``data``."""
    if isinstance(data, Path):
        with oserrors_as(f"cannot copy {data} to {dest}"):
            atomic_write(dest, lambda tmp: shutil.copyfile(data, tmp))
    else:
        with oserrors_as(f"cannot write {dest}"):
            atomic_write(dest, lambda tmp: Path(tmp).write_bytes(data))


def _find_in_folder(folder: Path, patterns: dict[str, str]) -> dict[str, list[Path]]:
    """Files under ``folder`` per role; a non-glob pattern may also match a unique base name."""
    found: dict[str, list[Path]] = {role: [] for role in patterns}
    by_name: dict[str, list[Path]] = {}
    seen = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for fn in sorted(filenames):
            seen += 1
            if seen > MAX_FOLDER_FILES:
                raise TxlError(f"{folder} holds more than {MAX_FOLDER_FILES} files; give the dataset's own folder")
            full = Path(dirpath) / fn
            by_name.setdefault(fn, []).append(full)
            for role, pat in patterns.items():
                if _matches(full.resolve().parts, pat):
                    found[role].append(full)
    for role, pat in patterns.items():
        base = pat.split("/")[-1]
        if not found[role] and not any(c in base for c in "*?[") and len(by_name.get(base, [])) == 1:
            found[role] = by_name[base]
    return found


def _one(found: dict[str, list], role: str, spec: DatasetSpec, where: str) -> object:
    hits = found.get(role, [])
    if len(hits) != 1:
        what = "no file" if not hits else f"{len(hits)} files"
        pattern = spec.members[role]
        base = pattern.split("/")[-1]
        alone = "" if base == pattern or any(c in base for c in "*?[") else f", or one {base} anywhere in it"
        raise TxlError(f"{where} has {what} matching {pattern!r}{alone} for {spec.name}; "
                       f"give the official {spec.archive} or its extracted folder")
    return hits[0]


def _extract_roles(archive: Path, spec: DatasetSpec, dests: Callable[[str, str], list[Path]]) -> dict[str, list[str]]:
    """Extract the members matching each role; ``dests(role, member)`` gives their destinations."""
    hits: dict[str, list[str]] = {role: [] for role in spec.members}

    def select(name: str) -> list[Path]:
        parts = tuple(name.split("/"))
        for role, pat in spec.members.items():
            if _matches(parts, pat):
                hits[role].append(name)
                if len(hits[role]) > 1 and not any(c in pat for c in "*?["):
                    raise TxlError(f"{archive} has several members matching {pat!r}: {hits[role][0]!r}, {name!r}")
                return dests(role, name)
        return []

    extract(archive, select, max_member_bytes=spec.max_member_bytes)
    for role, pat in spec.members.items():
        if not hits[role]:
            raise TxlError(f"{archive} has no member matching {pat!r}; is it the official {spec.archive}?")
    return hits


def _prepare_split(spec: DatasetSpec, src: Path, out: Path) -> dict:
    """enwik8/text8: cut one file into the 90/5/5 splits (bytes or characters)."""
    member = spec.members["all"]
    if src.is_dir():
        data_file = _one(_find_in_folder(src, spec.members), "all", spec, str(src))
        data = read_bytes(Path(data_file))
    elif is_archive(src):
        tmp = out / ".download" / f"{spec.name}.member"
        _extract_roles(src, spec, lambda role, name: [tmp])
        data = read_bytes(tmp)
        tmp.unlink()
    else:
        data = read_bytes(src)  # the already-extracted file itself
    if spec.unit == "characters":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TxlError(f"{spec.name} data is not UTF-8 text (byte offset {e.start})") from None
        b1, b2 = standard_split(len(text), spec.unit)
        parts = [text[:b1].encode(), text[b1:b2].encode(), text[b2:].encode()]
        total = len(text)
    else:
        b1, b2 = standard_split(len(data), spec.unit)
        parts = [data[:b1], data[b1:b2], data[b2:]]
        total = len(data)
    for name, part in zip(SPLITS, parts):
        _write_file(out / f"{name}.txt", part)
    return {"members": {"all": member},
            "split": {"unit": spec.unit, "train": [0, b1], "valid": [b1, b2], "test": [b2, total]}}


def _prepare_files(spec: DatasetSpec, src: Path, out: Path) -> dict:
    """WikiText / PTB: copy the train/valid/test members."""
    if src.is_dir():
        found = _find_in_folder(src, spec.members)
        files = {role: Path(_one(found, role, spec, str(src))) for role in SPLITS}  # every one before any write
        for role, f in files.items():
            _write_file(out / f"{role}.txt", f)
        members = {role: str(f) for role, f in files.items()}
    elif is_archive(src):
        hits = _extract_roles(src, spec, lambda role, name: [staging(out) / f"{role}.txt"])
        move_staged(out)
        members = {role: hits[role][0] for role in SPLITS}
    else:
        raise TxlError(f"{src} is neither a zip/tar archive nor a folder; give the official {spec.archive}")
    return {"members": members, "split": "the official train/valid/test files"}


def _prepare_lm1b(spec: DatasetSpec, src: Path, out: Path) -> dict:
    """lm1b: train shards (listed in train.txt), held-out shard 0 as valid.txt and test.txt."""
    shard_dir = "training-monolingual.tokenized.shuffled"
    if src.is_dir():
        found = _find_in_folder(src, spec.members)
        heldout = Path(_one(found, "heldout", spec, str(src)))
        shards = sorted(str(p.resolve()) for p in found["train"])  # used in place: absolute paths
        if not shards:
            raise TxlError(f"no lm1b training shards matching {spec.members['train']!r} in {src}")
        for role in ("valid", "test"):
            _write_file(out / f"{role}.txt", heldout)
        heldout_name = str(heldout)
    elif is_archive(src):
        def dests(role: str, name: str) -> list[Path]:
            if role == "heldout":
                return [staging(out) / "valid.txt", staging(out) / "test.txt"]
            return [staging(out) / shard_dir / name.split("/")[-1]]

        hits = _extract_roles(src, spec, dests)  # (every role found, the training shards included)
        move_staged(out)
        shards = sorted(f"{shard_dir}/{n.split('/')[-1]}" for n in hits["train"])
        heldout_name = hits["heldout"][0]
    else:
        raise TxlError(f"{src} is neither a tar archive nor a folder; give the official {spec.archive}")
    _write_file(out / "train.txt", "".join(s + "\n" for s in shards).encode("utf-8"))
    train_bytes = sum((out / s if not Path(s).is_absolute() else Path(s)).stat().st_size for s in shards)
    return {"members": {"train": spec.members["train"], "valid": heldout_name, "test": heldout_name},
            "split": "official training shards; held-out shard 00000 as both valid and test (as the reference)",
            "shuffled": True, "train_is_list": True, "train_shards": shards, "train_bytes": train_bytes}


def _prepare_pg19(spec: DatasetSpec, src: Path, out: Path) -> dict:
    """PG-19: the folders of books of a local copy (``src``, a folder: :func:`prepare_dataset` checks it), named
    in place (absolute paths), one book a document."""
    files, sizes, books = {}, {}, {}
    for role, folder in spec.members.items():
        where = src / folder
        found = sorted(where.glob("*.txt")) if where.is_dir() else []
        if not found:
            raise TxlError(f"{where} holds no *.txt books; a pg19 copy has train/, validation/ and test/ folders of "
                           "books (--source is the folder above them)")
        files[role], sizes[role], books[role] = str(where.resolve()), sum(f.stat().st_size for f in found), len(found)
    return {"files": files, "sizes": sizes, "in_place": True, "pattern": "*.txt", "documents": books,
            "members": {role: f"{folder}/*.txt" for role, folder in spec.members.items()},
            "split": "the official train/validation/test folders, one book a document"}


def _resolve_source(spec: DatasetSpec, source: str, out: Path, sha256: str | None, progress: bool,
                    timeout: float, log: Callable[[str], None]) -> tuple[Path, str | None, bool]:
    """Download or locate the source; returns (path, sha256 or None for a folder, verified)."""
    expected = sha256 or spec.sha256
    what = "given with --sha256" if sha256 else f"the published checksum of {spec.archive}"
    if is_url(source):
        base = source.rstrip("/").rsplit("/", 1)[-1].split("?")[0]
        name = base if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", base or "") else spec.archive
        dest = out / ".download" / name
        if dest.is_file():
            log(f"using the earlier download {dest}")
        else:
            log(f"downloading {source}")
            download(source, dest, progress=progress, timeout=timeout, log=log)
        digest, ok = check_sha256(dest, expected, what=what, keep_aside=True, log=log)
        return dest, digest, ok
    path = Path(source).expanduser()
    if not path.exists():
        raise TxlError(f"source {source} does not exist; give the {spec.archive} archive, its extracted folder "
                       f"or a URL (official: {spec.url})")
    if path.is_dir():
        log(f"using the extracted files in {path} (no checksum: a folder is not verified)")
        return path, None, False
    if not sha256 and not is_archive(path):  # the published checksum is the archive's, not an extracted file's
        if path.name.lower().endswith(ARCHIVE_SUFFIXES):
            raise TxlError(f"source {source} is named as an archive but is not a zip or tar archive (a damaged or "
                           f"unfinished download?); give the {spec.archive} archive or its extracted file")
        digest = sha256_file(path)
        log(f"sha256 of {path.name}: {digest} (not verified: an extracted file, while the published checksum is "
            f"that of {spec.archive}; pass --sha256 to check it)")
        return path, digest, False
    digest, ok = check_sha256(path, expected, what=what, keep_aside=False, log=log)
    return path, digest, ok


def prepare_dataset(
    name: str,
    source: str | os.PathLike[str] | None,
    out: str | os.PathLike[str],
    *,
    sha256: str | None = None,
    progress: bool = True,
    timeout: float = 60.0,
    log: Callable[[str], None] = print,
    max_member_bytes: int | None = None,
) -> dict:
    """Prepare benchmark ``name`` from ``source`` into the folder ``out``; returns its dataset.json.

    Args:
        name: one of :data:`DATASETS` (enwik8, text8, wikitext-2, wikitext-103, wikitext-2-raw,
            wikitext-103-raw, ptb, ptb-char, lm1b).
        source: the official archive (path), a folder with its extracted files, the already
            extracted enwik8/text8 file, or an http(s) URL (downloaded to ``out/.download``,
            resumable).
        out: output folder; gets ``train.txt``, ``valid.txt``, ``test.txt`` and, last,
            ``dataset.json``.
        sha256: expected sha256 of the archive (hex); overrides the published one. A file with
            neither is used, and its computed sha256 is logged as not verified.
        progress: show a download progress bar. timeout: seconds per network operation.
        log: receives one-line progress messages.
        max_member_bytes: refuse archive members larger than this (None: the dataset's known
            size with a margin, :attr:`DatasetSpec.max_member_bytes`).

    Raises :class:`TxlError` for an unknown name, a missing source, a checksum mismatch (a bad
    download is kept aside as ``.bad``), an unsafe or unexpected archive, unwritable output, or an
    ``out`` that another process is preparing (or that lies inside a checkpoint or run folder).
    """
    spec = DATASETS.get(name)
    if spec is None:
        raise TxlError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if max_member_bytes is not None:
        if max_member_bytes < 1:
            raise TxlError(f"max_member_bytes must be >= 1, got {max_member_bytes}")
        spec = dataclasses.replace(spec, max_member_bytes=max_member_bytes)
    if source is None or str(source) == "":
        if spec.layout == "pg19":
            raise TxlError(f"give --source: {spec.archive}, holding train/, validation/ and test/ ({spec.url})")
        raise TxlError(f"give --source: the {spec.archive} archive, its extracted folder, or a URL "
                       f"(official: {spec.url})")
    if spec.layout == "pg19" and not Path(str(source)).expanduser().is_dir():
        raise TxlError(f"pg19 is prepared from {spec.archive} (train/, validation/ and test/ folders of books, "
                       f"{spec.url}); give that folder as --source, not {source}")
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise TxlError(f"--sha256 must be 64 hexadecimal digits, got {sha256!r}")
    out = Path(out)
    check_out(spec.name, source, out)
    # one process per output folder (a second prepare on it is refused while this one runs)
    with claim_folder(out, flag="output folder"):
        return _prepare(spec, source, out, sha256, progress, timeout, log)


def _prepare(spec: DatasetSpec, source, out: Path, sha256: str | None, progress: bool, timeout: float,
             log: Callable[[str], None]) -> dict:
    """:func:`prepare_dataset` once ``out`` is claimed (and created)."""
    src, digest, verified = _resolve_source(spec, str(source), out, sha256, progress, timeout, log)
    build = {"split": _prepare_split, "files": _prepare_files, "lm1b": _prepare_lm1b, "pg19": _prepare_pg19}[spec.layout]
    try:
        shutil.rmtree(staging(out), ignore_errors=True)  # what a killed prepare left there
        details = build(spec, src, out)
    finally:
        shutil.rmtree(staging(out), ignore_errors=True)
        with contextlib.suppress(OSError):  # an empty .download (enwik8/text8's member passes through it)
            (out / ".download").rmdir()
    info = {
        "format": FORMAT,
        "name": spec.name,
        "tokenizer": spec.tokenizer,
        "files": {s: f"{s}.txt" for s in SPLITS},
        "sizes": details.get("sizes") or {s: (out / f"{s}.txt").stat().st_size for s in SPLITS},
        "source": str(source),
        "archive": None if src.is_dir() else str(src.resolve()),
        "sha256": digest,
        "sha256_verified": verified,
        **details,
    }
    with oserrors_as(f"cannot write {out / 'dataset.json'}"):
        write_json(out / "dataset.json", info)
    if info.get("in_place"):
        sizes = ", ".join(f"{s} {info['files'][s]} ({n:,} bytes)" for s, n in info["sizes"].items())
        log(f"{spec.name}: wrote dataset.json to {out}, naming in place {sizes}")
    else:
        sizes = ", ".join(f"{s}.txt ({n:,} bytes)" for s, n in info["sizes"].items())
        log(f"{spec.name}: wrote {sizes} and dataset.json to {out}")
    return info
