"""The token cache: a corpus encoded once into ``<cache_dir>/<fingerprint>.npy`` and read back
memory-mapped (:func:`txl.data.corpus.encode_corpus` and the loaders use it).

- :func:`fingerprint`: the cache key, a sha256 over the cache format, the tokenizer and each file's
  path and content hash (:func:`file_hashes`, kept with each file's size, times and inode);
- :func:`mapped`, :func:`cached`: a cache file read back mapped, or computed in memory and stored;
- :func:`copy_bytes`: byte-level text copied into the cache 16 MiB at a time;
- :func:`streamed`, :func:`streamed_vocabulary`: char, word and BPE text counted (BPE trained) and
  encoded chunk by chunk (:mod:`txl.data.streaming`), the vocabulary kept beside the ids;
- :func:`write_index`, :func:`read_index`: ``<key>.index.json`` beside each array, its sources (files or
  byte ranges of them) and the id each starts at: the document boundaries.

Every file is written atomically or under :func:`~txl.data.streaming.cache_lock`, so processes that
share a cache folder (the ranks of ``--nproc``) make each file once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from txl.data.files import _file_size
from txl.data.streaming import (cache_lock, chunk_text, chunks, encode_to_file, show_bar, span_bytes,
                                unwritable_cache)
from txl.data.tokenizers import ByteTokenizer, CharTokenizer, Tokenizer, WordTokenizer
from txl.data.tokenizers.base import normalize_text
from txl.data.tokenizers.simple import _line_words
from txl.errors import TxlError
from txl.fileio import atomic_write, oserrors_as, sha256_file
from txl.runtime import progress_bar

PathLike = str | os.PathLike[str]
CACHE_FORMAT = "txl-token-cache-v3"  # v3: chunked text decoded file by file, never cut before a U+FEFF

BPE_DEFAULT_VOCAB = 8000
"""Vocabulary size of a new ``"bpe"`` tokenizer when ``max_size`` is not given."""


def fingerprint(tokenizer: Tokenizer, file_hashes: list[tuple[str, str]], extra: dict | None) -> str:
    """sha256 over the cache format, the tokenizer JSON and each file's path and content hash."""
    h = hashlib.sha256()
    h.update(CACHE_FORMAT.encode())
    h.update(b"\0" + json.dumps(tokenizer.to_dict(), sort_keys=True).encode("utf-8"))
    for name, digest in file_hashes:
        h.update(b"\0" + name.encode("utf-8", "surrogateescape") + b"\0" + digest.encode())
    if extra:
        h.update(b"\0extra\0" + json.dumps(extra, sort_keys=True).encode("utf-8"))
    return h.hexdigest()


def mapped(path: Path, dtype: np.dtype) -> np.ndarray | None:
    """The token array of the cache file ``path`` memory-mapped read-only, or None when there is none or it
    is broken (wrong shape, dtype, a cut file): such a file is then written again."""
    if not path.is_file():
        return None
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return arr if arr.ndim == 1 and arr.dtype == dtype else None


def _store(path: Path, write: Callable[[str], None]) -> None:
    try:
        atomic_write(path, write)
    except OSError as e:
        raise unwritable_cache(path, e) from None


def cached(cache_dir: PathLike, key: str, dtype: np.dtype, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """``<cache_dir>/<key>.npy`` memory-mapped when valid, else ``compute()`` stored there (atomically) and
    mapped."""
    path = Path(cache_dir) / f"{key}.npy"
    arr = mapped(path, dtype)
    if arr is None:
        computed = compute()

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.save(f, computed, allow_pickle=False)

        _store(path, write)
        del computed
        arr = mapped(path, dtype)
    return arr


HASHES_NAME = "file-hashes.json"
"""The cache folder's record of each corpus file's sha256 with the size, mtime and inode it was taken at."""


def file_hashes(paths: Sequence[Path], cache_dir: PathLike) -> list[tuple[str, str]]:
    """``(path, sha256)`` of each corpus file, in order.

    Each digest is kept in the cache folder's ``file-hashes.json`` with the file's size,
    modification and change times (ns) and inode, and taken from there while all four are unchanged
    (a file written anew, even with its old size and modification time, gets a new change time): a
    cached corpus of many GB or many thousand files opens in seconds. The record is read once and
    written once per call; processes sharing the cache folder (the ranks of ``--nproc``) hash a new
    file once: one hashes under a lock while the others wait, then read its record.
    """
    record = Path(cache_dir) / HASHES_NAME
    names = [str(Path(path).resolve()) for path in paths]
    stamps = [_stamp(path) for path in paths]
    known = _read_record(record)
    if all(_known(known, name, stamp) for name, stamp in zip(names, stamps)):
        return [(str(path), known[name][4]) for path, name in zip(paths, names)]
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(cache_lock(record))  # the ranks of --nproc: one hashes, the others read its record
        except TxlError:
            pass  # an unwritable cache folder: hash, keep nothing
        known = _read_record(record)
        found, changed = [], False
        for path, name, stamp in zip(paths, names, stamps):
            if not _known(known, name, stamp):
                known[name], changed = [*stamp, sha256_file(path, "corpus file ")], True
            found.append((str(path), known[name][4]))
        if changed:
            try:
                atomic_write(record, lambda tmp: Path(tmp).write_text(json.dumps(known), encoding="utf-8"))
            except (OSError, TxlError):
                pass  # a record that cannot be written costs the next run a reading, nothing else
        return found


def _stamp(path: Path) -> list[int]:
    """The size, modification and change times (ns) and inode of a file."""
    with oserrors_as(f"cannot read corpus file {path}"):
        st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_record(record: Path) -> dict:
    try:
        known = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _known(known: dict, name: str, stamp: list[int]) -> bool:
    """Whether the record holds a digest of the file ``name`` (resolved) taken when it had ``stamp``."""
    entry = known.get(name)
    return isinstance(entry, list) and len(entry) == 5 and entry[:4] == stamp and isinstance(entry[4], str)


def index_path(path: Path) -> Path:
    """The index of the cache file ``<key>.npy``: ``<key>.index.json``."""
    return Path(path).with_suffix(".index.json")


def write_index(path: Path, tokenizer: Tokenizer, dtype: np.dtype, n_tokens: int, span: Sequence,
                first_tokens: Sequence[int | None]) -> None:
    """Write the index of the cache file ``path``: its fingerprint (the cache key: :func:`fingerprint`), the
    tokenizer, dtype and length of its array, and each
    source (a file, or the byte range of one that a split takes) with the id it starts at (None where its
    first line goes on from the previous source's: no id starts it). One file is one document (a book of
    PG-19), so the starts are the document boundaries. An index that cannot be written is left out."""
    doc = {"format": CACHE_FORMAT, "fingerprint": Path(path).stem, "tokenizer": tokenizer.kind,
           "vocab_size": tokenizer.vocab_size,
           "dtype": np.dtype(dtype).name, "tokens": int(n_tokens),
           "sources": [{"path": os.path.abspath(p), "bytes": [int(lo), int(hi)],
                        "first_token": None if first is None else int(first)}
                       for (p, lo, hi), first in zip(span, first_tokens)]}
    try:
        atomic_write(index_path(path), lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=1), encoding="utf-8"))
    except (OSError, TxlError):
        pass


def read_index(path: PathLike) -> dict | None:
    """The index of the cache file ``path`` (:func:`write_index`), or None when it has none or it is unreadable."""
    def count(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    try:
        doc = json.loads(index_path(Path(path)).read_text(encoding="utf-8"))
        dtype = np.dtype(doc["dtype"])
        ok = (doc["format"] == CACHE_FORMAT and dtype.kind == "u" and dtype.itemsize in (1, 2, 4)
              and count(doc["tokens"]) and all(
                  (s["first_token"] is None or count(s["first_token"])) and isinstance(s["bytes"], list)
                  and len(s["bytes"]) == 2 and all(count(b) for b in s["bytes"]) for s in doc["sources"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return doc if ok else None


def copied(cache_dir: PathLike, key: str, paths: list[Path], hashes: list[tuple[str, str]]) -> np.ndarray:
    """``<cache_dir>/<key>.npy`` memory-mapped, the byte tokens of ``paths`` copied there first when missing
    (:func:`copy_bytes`; under --nproc one rank copies, the others find the copy)."""
    path = Path(cache_dir) / f"{key}.npy"
    arr = mapped(path, np.dtype(np.uint8))
    if arr is None:
        with cache_lock(path):
            arr = mapped(path, np.dtype(np.uint8))
            if arr is None:
                copy_bytes(paths, hashes, path)
                arr = mapped(path, np.dtype(np.uint8))
    if arr is not None and read_index(path) is None:  # a byte corpus: each file starts at its byte offset
        sizes = [_file_size(p) for p in paths]
        write_index(path, ByteTokenizer(), np.uint8, len(arr), [(p, 0, n) for p, n in zip(paths, sizes)],
                    np.cumsum([0] + sizes)[:-1].tolist())
    return arr


def copy_bytes(paths: list[Path], hashes: list[tuple[str, str]], path: Path) -> None:
    """Write the byte tokens of ``paths`` (their bytes, concatenated) as the uint8 array file ``path``,
    16 MiB at a time; each file's sha256 is taken again as it is copied and must equal ``hashes``.

    Raises:
        TxlError: a file cannot be read, changed between the two readings, or the cache cannot be written.
    """
    sizes = [_file_size(p) for p in paths]

    def copy(source: Path, out, size: int, digest: str) -> None:
        h = hashlib.sha256()
        copied = 0
        try:
            with open(source, "rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
                    out.write(chunk)
                    copied += len(chunk)
        except OSError as e:
            if e.filename is None or str(e.filename) != str(source):
                raise  # the cache's side: reported as a write failure
            raise TxlError(f"cannot read corpus file {source}: {e.strerror or e}") from None
        if copied != size or h.hexdigest() != digest:
            raise TxlError(f"corpus file {source} changed while it was read; run again when nothing writes it")

    def write(tmp: str) -> None:
        with open(tmp, "wb") as out:
            header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False,
                      "shape": (sum(sizes),)}
            np.lib.format.write_array_header_1_0(out, header)
            for p, size, (_, digest) in zip(paths, sizes, hashes):
                copy(p, out, size, digest)

    _store(path, write)


def streamed(cache_dir: PathLike, key: str, dtype: np.dtype, span, tokenizer: Tokenizer, workers: int,
              progress: bool, hashes: list[tuple[str, str]]) -> np.ndarray:
    """``<cache_dir>/<key>.npy`` memory-mapped, encoded chunk by chunk from ``span`` first when missing; the
    files' ``hashes`` (those of the key) are taken again before the ids are kept: a file that changed while
    it was encoded is refused (TxlError), nothing kept."""
    path = Path(cache_dir) / f"{key}.npy"
    arr = mapped(path, dtype)
    if arr is None:
        try:
            path.unlink(missing_ok=True)  # a broken cache file is written again
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise unwritable_cache(path, e) from None
        def finish(first: list[int | None], n: int) -> None:
            if file_hashes([Path(name) for name, _ in hashes], cache_dir) != hashes:
                raise TxlError(f"a corpus file ({', '.join(name for name, _ in hashes[:3])}"
                               f"{', ...' if len(hashes) > 3 else ''}) changed while it was read; run again when "
                               "nothing writes it")
            write_index(path, tokenizer, dtype, n, span, first)

        encode_to_file(span, tokenizer, path, dtype, workers=workers, progress=progress, finish=finish)
        arr = mapped(path, dtype)
    if arr is None:
        raise TxlError(f"token cache {path} could not be read back; remove it and run again")
    return arr


def streamed_vocabulary(kind: str, span, opts: dict, hashes: list, extra: dict, cache_dir: PathLike,
                         progress: bool) -> Tokenizer:
    """A char, word or BPE vocabulary from the text of ``span``, read chunk by chunk; kept in the cache folder
    (keyed by the files, the options and ``extra``), so that the next run of the same corpus reads it."""
    h = hashlib.sha256(json.dumps({"format": CACHE_FORMAT, "vocabulary": kind, "opts": opts, "files": hashes, **extra},
                                  sort_keys=True).encode())
    path = Path(cache_dir) / f"{h.hexdigest()}.vocab.json"
    kept = _kept_vocabulary(path)
    if kept is not None:  # read without the lock: a read-only cache folder works
        return kept
    with cache_lock(path):  # the ranks of --nproc: one counts, the others read what it kept
        kept = _kept_vocabulary(path)
        return kept if kept is not None else _build_vocabulary(kind, span, opts, path, progress)


def _kept_vocabulary(path: Path) -> Tokenizer | None:
    """The vocabulary kept at ``path``, or None (none, or a damaged file, which is made again)."""
    from txl.data.tokenizers import load_tokenizer

    if not path.is_file():
        return None
    try:
        return load_tokenizer(path)
    except TxlError:
        return None


def _build_vocabulary(kind: str, span, opts: dict, path: Path, progress: bool) -> Tokenizer:
    """:func:`streamed_vocabulary`'s work: the span's characters or word counts (those of the whole text, as
    :meth:`CharTokenizer.build` and :meth:`WordTokenizer.build` find them) or a BPE trained on it, read chunk
    by chunk (a progress bar while characters or words are counted); then keep the vocabulary at ``path``."""
    from txl.data.tokenizers.bpe import BPETokenizer

    label = {"char": "counting characters", "word": "counting words"}.get(kind, "")
    with progress_bar(span_bytes(span), bool(label) and show_bar(span, progress), label, unit="B",
                      unit_scale=True) as bar:
        def texts() -> Iterator[str]:
            for chunk in chunks(span, kind):
                yield chunk_text(chunk, span, kind)
                bar.update(len(chunk.data))

        if kind == "char":
            tok: Tokenizer = CharTokenizer.build(texts())
        elif kind == "word":
            counts: Counter = Counter()
            for text in texts():
                counts.update(_line_words(normalize_text(text), opts["lower"], opts["normalize"]))
            tok = WordTokenizer.from_counts(counts, min_freq=opts["min_freq"], max_size=opts["max_size"],
                                            lower=opts["lower"], normalize=opts["normalize"])
        else:
            tok = BPETokenizer.build(texts(), vocab_size=opts["max_size"] or BPE_DEFAULT_VOCAB,
                                     min_frequency=opts["min_freq"])
    try:
        atomic_write(path, lambda tmp: tok.save(tmp))
    except (OSError, TxlError):
        pass  # not kept: the next run builds it again
    return tok
