"""Text corpora larger than memory: read in line-aligned chunks, counted and encoded chunk by chunk.

A corpus is the concatenation of its files, in order; a :data:`Span` is a byte range of that
concatenation (a split cut at a line start). :func:`chunks` reads a span in pieces of about
:data:`CHUNK_BYTES`, each cut just after a newline, where the word tokenizer's lines and the
byte-level BPE's pre-tokens end anyway (for BPE, only after ``X\\n`` or ``X\\r\\n`` before ``Y``, X
and Y characters that are not white space: see :func:`txl.data.tokenizers.bpe._chunks`), and never
before a byte-order mark, so encoding the pieces one by one gives the ids of encoding the whole text
(each file's leading byte-order mark is dropped, as when a file is read whole). :func:`encode_to_file`
writes those ids into a ``.npy`` file as they come, from one process or several (``workers``), and picks
up after a kill where it stopped; :func:`txl.data.token_cache.streamed_vocabulary` counts a vocabulary
the same way. What is held at any time is a few chunks.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import multiprocessing
import os
import struct
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple
from pathlib import Path

import numpy as np

from txl.data.tokenizers import Tokenizer, decode_utf8, tokenizer_from_dict
from txl.errors import TxlError
from txl.fileio import oserrors_as
from txl.runtime import progress_bar

CHUNK_BYTES = 1 << 24  # 16 MiB of text per chunk
HEADER_BYTES = 128  # the .npy header, written first with room for any length and rewritten at the end

Span = list[tuple[Path, int, int]]  # (file, start, end) pieces of the concatenated files, in order

BOM = b"\xef\xbb\xbf"

def span_of(files: Sequence[Path], start: int, end: int) -> Span:
    """The pieces of the files' concatenation from byte ``start`` to ``end``."""
    pieces, offset = [], 0
    for path in files:
        size = os.path.getsize(path)
        lo, hi = max(start, offset), min(end, offset + size)
        if lo < hi:
            pieces.append((Path(path), lo - offset, hi - offset))
        offset += size
    return pieces


def read_range(files: Sequence[Path], start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` of the files' concatenation."""
    return b"".join(block for block, _, _ in _blocks(span_of(files, start, end), CHUNK_BYTES))


def unwritable_cache(path: Path, err: OSError) -> TxlError:
    """The one error of a token cache file that cannot be written."""
    return TxlError(f"cannot write token cache {path}: {err.strerror or err}; choose a writable cache_dir")


def span_bytes(span: Span) -> int:
    return sum(end - start for _, start, end in span)


def locate(span: Span, n: int) -> tuple[Path, int]:
    """The file and its byte offset where byte ``n`` of the span lies."""
    for path, start, end in span:
        if n < end - start:
            return path, start + n
        n -= end - start
    return (span[-1][0], span[-1][2]) if span else (Path("?"), 0)


def _blocks(span: Span, size: int) -> Iterator[tuple[bytes, bool, bool]]:
    """The span's bytes in blocks of at most ``size``, each with whether it opens one of the span's pieces
    and whether it opens a file."""
    for path, start, end in span:
        with oserrors_as(f"cannot read corpus file {path}"), open(path, "rb") as f:
            f.seek(start)
            at = start
            while at < end:
                block = f.read(min(size, end - at))
                if not block:
                    raise TxlError(f"corpus file {path} ends at byte {at:,}: it changed while it was read")
                yield block, at == start, at == 0
                at += len(block)


def _char_before(data: bytes, end: int) -> str:
    """The character whose UTF-8 bytes end at ``end`` ("" at the start or for bytes that do not decode)."""
    start = end - 1
    while start > 0 and end - start < 4 and 0x80 <= data[start] < 0xC0:
        start -= 1
    try:
        return data[start:end].decode("utf-8") if start >= 0 else ""
    except UnicodeDecodeError:
        return ""


def _char_after(data: bytes, start: int) -> str:
    """The character whose UTF-8 bytes start at ``start`` ("" at the end or for bytes that do not decode)."""
    for width in (1, 2, 3, 4):
        try:
            return data[start:start + width].decode("utf-8") if start < len(data) else ""
        except UnicodeDecodeError:
            continue
    return ""


def _may_cut_at(data: bytes, after: int, kind: str, file_end: bool = False) -> bool:
    """Whether ``kind``'s chunks may end at ``after``: just after a newline (or, at the end of a file, a lone
    CR: each file's line ends are read on their own), with at least the length of a byte-order mark seen
    after it and none there (a text's leading U+FEFF is dropped: a chunk must not start with one), and for
    BPE with a non-space character before the newline (a CR aside) and one after it."""
    pos = after - 1
    ends = (0x0A, 0x0D) if file_end else (0x0A,)
    if pos < 0 or data[pos] not in ends or after + len(BOM) > len(data) or data.startswith(BOM, after):
        return False
    if kind != "bpe":
        return True
    before = pos - 1 if data[pos] == 0x0A and pos > 0 and data[pos - 1] == 0x0D else pos  # a CRLF's CR aside
    prev, nxt = _char_before(data, before), _char_after(data, after)
    # (a U+FEFF before it may be a file's mark, which is no text: what comes before that is not known here)
    return bool(prev and nxt and not prev.isspace() and not nxt.isspace() and prev != "\ufeff")


def _cut(data: bytes, kind: str, lowest: int) -> int | None:
    """The last place at or after ``lowest`` where ``kind``'s chunks may end (:func:`_may_cut_at`)."""
    end = len(data)
    while (pos := data.rfind(b"\n", lowest, end)) >= 0:
        end = pos
        if _may_cut_at(data, pos + 1, kind):
            return pos + 1
    return None


class Chunk(NamedTuple):
    """A piece of a span's text: its bytes, the byte of the span it starts at, and where in it files start."""

    data: bytes
    at: int
    file_starts: list[int]


def chunks(span: Span, kind: str, size: int | None = None) -> Iterator[Chunk]:
    """The span's text in chunks of about ``size`` bytes (default :data:`CHUNK_BYTES`) cut where ``kind``'s
    tokenizer allows (see the module docstring). A stretch with no such place goes on into the next chunk
    (a text with none comes whole). Where a piece of the span (a file) starts at such a place, a chunk
    starts there too, so the ids of each file are known."""
    size = size or CHUNK_BYTES
    held, at, opened = b"", 0, []  # opened: where files start in ``held``
    for block, opens, opens_file in _blocks(span, size):
        after = block[len(BOM):] if opens_file and block.startswith(BOM) else block  # a file's BOM is no text
        if opens and held and _may_cut_at(held[-8:] + after[:8], len(held[-8:]), kind, file_end=opens_file):
            yield Chunk(held, at, opened)
            held, at, opened = b"", at + len(held), []
        if opens_file:
            opened.append(len(held))
        held += block
        if len(held) < size:
            continue
        last = _cut(held, kind, len(held) // 2)
        if not last:
            continue
        yield Chunk(held[:last], at, [p for p in opened if p < last])
        held, at, opened = held[last:], at + last, [p - last for p in opened if p >= last]
    if held:
        yield Chunk(held, at, opened)


def file_parts(chunk: Chunk) -> list[tuple[int, bytes, bool]]:
    """The chunk cut where its files start, each part with its position in the chunk and whether it opens
    a file: a file's text is decoded and normalised on its own (:func:`decode_part`), as when the files are
    read whole."""
    cuts = sorted({0, *chunk.file_starts, len(chunk.data)})
    return [(lo, chunk.data[lo:hi], lo in chunk.file_starts) for lo, hi in zip(cuts, cuts[1:])] or [(0, b"", False)]


def decode_part(data: bytes, opens_file: bool, kind: str, source: str = "", offset: int = 0) -> str:
    """A part's text: strict UTF-8 with CRLF and CR line ends as LF, and, for a part that opens a file, without
    the file's byte-order mark (a part inside a file keeps a U+FEFF it starts with, as the whole text does).
    A byte that is not UTF-8 is named with ``source`` and its offset there, the part starting at ``offset``."""
    if opens_file:
        return decode_utf8(data, source, kind, offset)
    return decode_utf8(b"\n" + data, source, kind, offset - 1)[1:]


def chunk_text(chunk: Chunk, span: Span, kind: str) -> str:
    """A chunk's text (:func:`file_parts`, decoded); a byte that is not UTF-8 is named by its file and
    offset there."""
    texts = []
    for lo, part, opens_file in file_parts(chunk):
        try:
            texts.append(decode_part(part, opens_file, kind))
        except TxlError:  # decoded again, naming the file (found only now: a chunk may hold many files)
            path, offset = locate(span, chunk.at + lo)
            decode_part(part, opens_file, kind, f"corpus file {path}", offset)  # raises, naming the byte
            raise
    return "".join(texts)


def show_bar(span: Span, progress: bool) -> bool:
    """Whether to show a progress bar over the span: asked for, and text of more than a few chunks (a small
    corpus is read at once; a bar would only add a line before its result)."""
    return progress and span_bytes(span) > 4 * CHUNK_BYTES


def _header(dtype: np.dtype, length: int) -> bytes:
    """A version-1.0 .npy header of exactly :data:`HEADER_BYTES` for a 1-D array of ``length``."""
    text = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (length,)})
    body = text.encode("latin1").ljust(HEADER_BYTES - 10 - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


_WORKER: dict = {}


def _start_worker(tokenizer: dict) -> None:
    _WORKER["tokenizer"] = tokenizer_from_dict(tokenizer)


def _encode_chunk(job: tuple[list[tuple[bytes, bool]], str]) -> tuple[bytes, list[int | None]] | tuple[str, str]:
    """A chunk's ids (its :func:`file_parts`, each decoded on its own) as bytes of ``dtype``, with the id
    each part after the first starts at (None where no token starts there, or where the part's first line
    goes on from the text before it); or ``("error", message)`` for the parent to place in its file."""
    parts, dtype = job
    tokenizer = _WORKER["tokenizer"]
    try:
        texts = [decode_part(part, opens_file, tokenizer.kind) for part, opens_file in parts]
        text = "".join(texts)
        lead = 1 if text.startswith("\ufeff") else 0  # what encoding's normalising drops of the chunk's text
        marks = np.cumsum([len(t) for t in texts])[:-1].tolist()
        opens = [not text[:m] or text[:m].endswith("\n") for m in marks]  # a part after a line's end
        if tokenizer.kind == "bpe":
            ids, found = tokenizer.encode_marked(text, [max(m - lead, 0) for m in marks])
        elif tokenizer.kind == "char":
            ids, found = tokenizer.encode(text), [max(m - lead, 0) for m in marks]
        else:  # word: line by line, so the ids of the pieces between starts, one after another (not before a
            # U+FEFF, which normalising would take for a text's first character: counted on its own)
            cuts = [0] + [m for m, o in zip(marks, opens) if o and not text.startswith("\ufeff", m)] + [len(text)]
            pieces = [tokenizer.encode(text[a:b]) for a, b in zip(cuts, cuts[1:])]
            ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
            before = np.cumsum([0] + [len(p) for p in pieces]).tolist()  # ids before each cut
            found = []
            for m, o in zip(marks, opens):
                k = bisect.bisect_right(cuts, m) - 1  # the last cut at or before m
                found.append(None if not o else before[k] + (len(tokenizer.encode(text[cuts[k]:m])) if m > cuts[k]
                                                             else 0))
        found = [f if o else None for f, o in zip(found, opens)]
        return ids.astype(dtype).tobytes(), found
    except TxlError as err:
        return "error", str(err)


@contextlib.contextmanager
def cache_lock(path: Path):
    """Hold an exclusive lock on ``PATH.lock`` for the block: of several processes making the same cache file
    (the ranks of ``--nproc``), one makes it while the others wait, then find it made (check for the file
    inside the block).

    Raises:
        TxlError: the lock file cannot be written (an unwritable cache folder).
    """
    import fcntl

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{path}.lock", "a")
    except OSError as err:
        raise unwritable_cache(path, err) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def encode_to_file(span: Span, tokenizer: Tokenizer, path: Path, dtype: np.dtype, *, workers: int = 1,
                   progress: bool = False, finish: Callable[[list[int | None], int], None] | None = None) -> None:
    """Encode the span with ``tokenizer`` (char, word or BPE) into the 1-D ``.npy`` array file ``path``, under
    :func:`cache_lock`: of several processes one encodes, the others find the file written.

    The ids go into ``PATH.part`` as each chunk is encoded (by ``workers`` processes, at most two chunks
    each in flight, kept in order); ``PATH.part.json`` records after each chunk how far the text and the
    ids have got, so a run killed midway starts again from there (``PATH.part.starts`` the pieces' first ids
    found so far, one line each); a record that does not fit the span or the ids written is ignored. Before
    the finished file is renamed into place, ``finish(first_ids, n_ids)`` is called with the id each of the
    span's pieces starts at (None for a piece whose first line goes on from the previous one's: no chunk
    starts there); it writes the index and may refuse the ids (a TxlError: the partial files are removed).

    Raises:
        TxlError: a file that cannot be read or is not UTF-8 (named with the file and byte), a character
            the tokenizer cannot encode, or a cache that cannot be written.
    """
    path = Path(path)
    with cache_lock(path):
        if path.is_file():
            return
        dtype = np.dtype(dtype)
        part, record, found = Path(f"{path}.part"), Path(f"{path}.part.json"), Path(f"{path}.part.starts")
        starts = {int(b): i for i, b in enumerate(np.cumsum([0] + [end - start for _, start, end in span])[:-1])}
        done_bytes, done_ids, first_ids = _resume_state(span, part, record, found, dtype, starts, tokenizer.kind)
        out = _open_part(part, found, dtype, done_bytes, done_ids)
        rest, skipped = _skip(span, done_bytes), done_bytes
        pool = None
        if workers > 1:
            pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_start_worker, initargs=(tokenizer.to_dict(),))
        else:
            _start_worker(tokenizer.to_dict())
        source = chunks(rest, tokenizer.kind)
        pending: deque = deque()

        def submit() -> bool:
            item = next(source, None)
            if item is None:
                return False
            job = ([(part, opens_file) for _, part, opens_file in file_parts(item)], dtype.str)
            chunk = item._replace(at=skipped + item.at)
            pending.append((chunk, pool.submit(_encode_chunk, job) if pool else job))
            return True

        try:
            with out, open(found, "a", encoding="utf-8") as noted, \
                    open(record, "w", encoding="utf-8") as progress_record, \
                    progress_bar(span_bytes(span), show_bar(span, progress), f"encoding ({tokenizer.kind})", unit="B",
                                   unit_scale=True, initial=done_bytes) as bar:
                progress_record.write(json.dumps({"text_bytes": done_bytes, "ids": done_ids}))  # (opened empty)
                progress_record.flush()
                while len(pending) < 2 * max(workers, 1) and submit():
                    pass
                while pending:
                    chunk, job = pending.popleft()
                    data, at = chunk.data, chunk.at
                    try:
                        ids, inside = job.result() if pool else _encode_chunk(job)
                    except BrokenProcessPool:
                        raise TxlError("a tokenizing worker process died (killed, or out of memory?); run again (the "
                                       "chunks encoded so far are kept), with fewer data.workers") from None
                    if ids == "error":
                        chunk_text(chunk, span, tokenizer.kind)  # names the file and byte of a UTF-8 error
                        where, offset = locate(span, at)
                        raise TxlError(f"corpus file {where} (the text from byte {offset:,}): {inside}")
                    submit()
                    out.write(ids)
                    out.flush()
                    # the pieces (files) that start with this chunk or inside it: noted in a file that only grows
                    opened = [(at, 0)] + [(at + lo, first) for (lo, _, _), first in zip(file_parts(chunk)[1:], inside)]
                    for where, first in opened:
                        if where in starts and first is not None:
                            first_ids[starts[where]] = done_ids + first
                            noted.write(f"{starts[where]}:{done_ids + first}\n")
                    noted.flush()
                    done_bytes += len(data)
                    done_ids += len(ids) // dtype.itemsize
                    progress_record.seek(0)
                    progress_record.write(json.dumps({"text_bytes": done_bytes, "ids": done_ids}))
                    progress_record.truncate()
                    progress_record.flush()
                    bar.update(len(data))
                out.seek(0)
                out.write(_header(dtype, done_ids))
                out.flush()
                os.fsync(out.fileno())
        except OSError as err:
            raise unwritable_cache(part, err) from None
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        _publish(path, finish, first_ids, done_ids)


def _publish(path: Path, finish: Callable[[list[int | None], int], None] | None, first_ids: list[int | None],
             n_ids: int) -> None:
    """:func:`encode_to_file`'s end: ``finish(first_ids, n_ids)``, then ``PATH.part`` renamed to ``path``; the
    partial file removed if ``finish`` refuses the ids (its TxlError raised), the notes removed either way."""
    part, record, found = Path(f"{path}.part"), Path(f"{path}.part.json"), Path(f"{path}.part.starts")
    try:
        if finish is not None:
            finish(first_ids, n_ids)
        os.replace(part, path)
    except TxlError:
        part.unlink(missing_ok=True)
        raise
    finally:
        record.unlink(missing_ok=True)
        found.unlink(missing_ok=True)


def _open_part(part: Path, found: Path, dtype: np.dtype, done_bytes: int, done_ids: int):
    """The partial ids file, open for writing after its first ``done_ids`` ids (a new one when nothing is
    resumed: an earlier attempt's notes are removed)."""
    try:
        if not done_bytes:
            found.unlink(missing_ok=True)
        out = open(part, "r+b" if done_bytes else "wb")
        out.write(_header(dtype, 0))
        out.truncate(HEADER_BYTES + done_ids * dtype.itemsize)
        out.seek(HEADER_BYTES + done_ids * dtype.itemsize)
        return out
    except OSError as err:
        raise unwritable_cache(part, err) from None


def _resume_state(span: Span, part: Path, record: Path, found: Path, dtype: np.dtype, starts: dict,
                  kind: str) -> tuple[int, int, list[int | None]]:
    """The text bytes and ids a killed encoding had written and the first ids of the pieces it had noted;
    nothing (0, 0, none) when there is no such encoding or its record does not fit (:func:`_resumable`)."""
    first_ids: list[int | None] = [None] * len(span)
    if not (part.is_file() and record.is_file()):
        return 0, 0, first_ids
    try:
        state = json.loads(record.read_text(encoding="utf-8"))
        done_bytes, done_ids = int(state["text_bytes"]), int(state["ids"])
        for line in found.read_text(encoding="utf-8").split() if found.is_file() else []:
            piece, first = map(int, line.split(":"))
            if 0 <= piece < len(span) and first <= done_ids:
                first_ids[piece] = first
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0, [None] * len(span)
    if not _resumable(span, done_bytes, done_ids, part, dtype, starts, found, kind):
        return 0, 0, [None] * len(span)  # start again
    return done_bytes, done_ids, first_ids


def _resumable(span: Span, done_bytes: int, done_ids: int, part: Path, dtype: np.dtype, starts: dict,
               found: Path, kind: str) -> bool:
    """Whether a resume record fits: its text ends where a chunk may end, within the span, its ids are in the
    partial file, and the files' first ids were noted (a record from before they were is not resumed)."""
    if not (0 < done_bytes <= span_bytes(span) and done_ids >= 0 and found.is_file()):
        return False
    if part.stat().st_size < HEADER_BYTES + done_ids * dtype.itemsize:
        return False
    if done_bytes in starts or done_bytes == span_bytes(span):
        return True
    lo = max(0, done_bytes - 8)
    window = b"".join(block for block, _, _ in _blocks(_skip(span, lo), 16))[:done_bytes + 8 - lo]
    return _may_cut_at(window, done_bytes - lo, kind)


def _skip(span: Span, n: int) -> Span:
    """The span without its first ``n`` bytes."""
    rest = []
    for path, start, end in span:
        if n >= end - start:
            n -= end - start
            continue
        rest.append((path, start + n, end))
        n = 0
    return rest
