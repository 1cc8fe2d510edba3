"""Char, word and BPE corpora read chunk by chunk (txl.data.streaming) give the ids of reading them whole."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from txl.data import streaming
from txl.data.corpus import load_corpus
from txl.data.tokenizers import WordTokenizer
from txl.errors import TxlError

LINES = ["The quick brown fox, said he.", "", "  indented line  ", "naïve café — ünïcödé", "a-b c@d 1,000",
         "x" * 40, "end", "no-break\u00a0", "\u3000ideographic space", "trailing space "]


def _corpus(tmp_path: Path, seed: int) -> list[Path]:
    """Three files of random lines (CRLF and a byte-order mark in one, no final newline in another; lines that
    end or start with Unicode spaces)."""
    rng = np.random.default_rng(seed)
    files = []
    for i, ending in enumerate(("\n", "\r\n", "\n")):
        lines = [LINES[j] for j in rng.integers(0, len(LINES), 120)]
        text = ("\ufeff" if i == 1 else "") + ending.join(lines) + (ending if i != 2 else "")
        f = tmp_path / f"part{i}.txt"
        f.write_bytes(text.encode("utf-8"))
        files.append(f)
    return files


def _whole(files: list[Path]) -> str:
    """The files' text read whole, each file's byte-order mark dropped (as txl reads a file)."""
    from txl.data.tokenizers import decode_utf8

    return "".join(decode_utf8(f.read_bytes(), str(f), "word") for f in files)


def _vocabulary(kind: str, text: str, max_size: int | None = None):
    """A new tokenizer of ``kind`` built from ``text`` at once: what counting it chunk by chunk must give."""
    from txl.data.tokenizers import BPETokenizer, CharTokenizer

    if kind == "char":
        return CharTokenizer.build(text)
    if kind == "bpe":
        return BPETokenizer.build([text], vocab_size=max_size or 8000, min_frequency=1)
    return WordTokenizer.build([text], max_size=max_size)


def _split_whole(files: list[Path], kind: str, fr: tuple, max_size: int | None = None) -> tuple:
    """The tokenizer and splits of ``files`` cut by fractions, from the whole text: char ids cut by the
    fractions; word and BPE text cut at the line starts nearest the byte fractions, the vocabulary from the
    train text, each split's text encoded at once (each file's piece decoded on its own)."""
    from txl.data.splits import SPLITS, line_cuts, split_tokens
    from txl.data.tokenizers import decode_utf8

    if kind == "char":
        tok = _vocabulary(kind, _whole(files))
        return tok, split_tokens(tok.encode(_whole(files)), fr)
    data = b"".join(f.read_bytes() for f in files)
    b1, b2 = line_cuts(lambda lo, hi: data[lo:hi], len(data), fr)
    starts = np.cumsum([0] + [f.stat().st_size for f in files]).tolist()  # where each file starts in ``data``

    def piece(lo: int, hi: int, opens_file: bool) -> str:  # a piece inside a file keeps a U+FEFF it starts with
        return decode_utf8(data[lo:hi], "", kind) if opens_file else decode_utf8(b"\n" + data[lo:hi], "", kind)[1:]

    texts = {name: "".join(piece(max(lo, a), min(hi, b), lo <= a) for a, b in zip(starts, starts[1:])
                           if max(lo, a) < min(hi, b))
             for name, (lo, hi) in zip(SPLITS, ((0, b1), (b1, b2), (b2, len(data))))}
    tok = _vocabulary(kind, texts["train"], max_size)
    return tok, {name: tok.encode(text) for name, text in texts.items()}


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
@pytest.mark.parametrize("seed", [0, 1])
def test_chunk_by_chunk_equals_the_whole_text(tmp_path, monkeypatch, kind, seed):
    _corpus(tmp_path, seed)
    folder = tmp_path  # the three files as one corpus
    opts = {"max_size": 300} if kind == "bpe" else {}
    tok, whole = _split_whole(sorted(folder.glob("part*.txt")), kind, (0.8, 0.1, 0.1), opts.get("max_size"))
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 97)  # many chunks, cut inside the files
    streamed = load_corpus(folder, kind, pattern="part*.txt", split=(0.8, 0.1, 0.1), cache_dir=tmp_path / "c", **opts)
    assert streamed.tokenizer == tok
    for name in ("train", "valid", "test"):
        assert isinstance(getattr(streamed, name), np.memmap)
        assert np.array_equal(getattr(streamed, name), whole[name]), name
    again = load_corpus(folder, kind, pattern="part*.txt", split=(0.8, 0.1, 0.1), cache_dir=tmp_path / "c", **opts)
    assert again.tokenizer == tok and np.array_equal(again.train, whole["train"])  # from the cache
    held = load_corpus(folder, kind, pattern="part*.txt", split=(0.8, 0.1, 0.1), **opts)  # no cache folder
    assert held.tokenizer == tok and held.on_disk == {}
    for name in ("train", "valid", "test"):
        assert not isinstance(getattr(held, name), np.memmap) and np.array_equal(getattr(held, name), whole[name])
    assert list((tmp_path / "c").glob("*.vocab.json"))  # the vocabulary is kept with the ids


@pytest.mark.parametrize("kind", ["char", "word"])
def test_separate_split_files_are_counted_and_encoded_in_chunks(tmp_path, monkeypatch, kind):
    train, valid = _corpus(tmp_path, 2)[:2]
    tok = _vocabulary(kind, _whole([train, valid] if kind == "char" else [train]))
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 50)
    streamed = load_corpus(train=train, valid=valid, tokenizer=kind, cache_dir=tmp_path / "c")
    assert streamed.tokenizer == tok
    assert np.array_equal(streamed.train, tok.encode(_whole([train])))
    assert np.array_equal(streamed.valid, tok.encode(_whole([valid])))


def test_two_workers_write_what_one_writes(tmp_path, monkeypatch):
    files = _corpus(tmp_path, 3)
    tok = WordTokenizer.build([f.read_text(encoding="utf-8") for f in files])
    span = streaming.span_of(files, 0, sum(f.stat().st_size for f in files))
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 200)
    streaming.encode_to_file(span, tok, tmp_path / "one.npy", np.dtype(np.uint16), workers=1)
    streaming.encode_to_file(span, tok, tmp_path / "two.npy", np.dtype(np.uint16), workers=2)
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert np.array_equal(one, two) and np.array_equal(one, tok.encode(_whole(files)))


def test_a_killed_encoding_goes_on_from_where_it_stopped(tmp_path, monkeypatch):
    files = _corpus(tmp_path, 4)
    tok = WordTokenizer.build([f.read_text(encoding="utf-8") for f in files])
    span = streaming.span_of(files, 0, sum(f.stat().st_size for f in files))
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 150)
    real, calls = streaming._encode_chunk, []

    def counted(job, die_at=None):
        calls.append(sum(len(part) for part, _ in job[0]))  # the chunk's bytes
        if len(calls) == die_at:
            raise KeyboardInterrupt  # a kill in the middle of the fifth chunk
        return real(job)

    monkeypatch.setattr(streaming, "_encode_chunk", lambda job: counted(job, die_at=5))
    out = tmp_path / "ids.npy"
    with pytest.raises(KeyboardInterrupt):
        streaming.encode_to_file(span, tok, out, np.dtype(np.uint16))
    assert not out.exists()
    done = json.loads(Path(f"{out}.part.json").read_text())
    assert done["text_bytes"] == sum(calls[:4]) < files[0].stat().st_size  # four chunks of the first file recorded
    calls.clear()
    monkeypatch.setattr(streaming, "_encode_chunk", counted)
    resumed, fresh = [], []
    streaming.encode_to_file(span, tok, out, np.dtype(np.uint16), finish=lambda first, n: resumed.append((first, n)))
    assert sum(calls) == streaming.span_bytes(span) - done["text_bytes"]  # only the rest was encoded again
    assert np.array_equal(np.load(out), tok.encode(_whole(files)))
    streaming.encode_to_file(span, tok, tmp_path / "again.npy", np.dtype(np.uint16),
                             finish=lambda first, n: fresh.append((first, n)))
    expected = [len(tok.encode(_whole(files[:i]))) for i in range(3)]
    assert resumed == fresh == [(expected, len(np.load(out)))]  # the first file's start came from the record
    assert not Path(f"{out}.part").exists() and not Path(f"{out}.part.json").exists()


def test_a_worker_that_dies_is_one_line(tmp_path):
    files = _corpus(tmp_path, 5)

    class Broken(WordTokenizer):  # its workers cannot rebuild it: their start fails, the pool breaks
        def to_dict(self):
            return {"kind": "word", "words": []}

    tok = Broken.build([f.read_text(encoding="utf-8") for f in files])
    span = streaming.span_of(files, 0, sum(f.stat().st_size for f in files))
    with pytest.raises(TxlError, match="a tokenizing worker process died"):
        streaming.encode_to_file(span, tok, tmp_path / "ids.npy", np.dtype(np.uint16), workers=2)
    assert not (tmp_path / "ids.npy").exists()


def test_a_byte_that_is_not_utf8_is_named_by_its_file_and_offset(tmp_path, monkeypatch):
    good = tmp_path / "a.txt"
    good.write_text("fine line\n" * 30, encoding="utf-8")
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"ok\n" * 10 + b"broken \xff here\n")
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 64)
    with pytest.raises(TxlError, match=rf"corpus file {bad} is not UTF-8 text \(invalid byte 0xff at byte offset 37\)"):
        load_corpus(train=tmp_path, valid=good, tokenizer="word", pattern="*.txt", cache_dir=tmp_path / "c")


def test_one_process_makes_a_cache_file_while_the_others_wait(tmp_path):
    import threading
    import time

    target = tmp_path / "cache" / "k.npy"
    made, order = [], []

    def maker(name):
        with streaming.cache_lock(target):
            order.append(f"{name} in")
            if not target.is_file():
                time.sleep(0.2)  # the work, while the other waits at the lock
                target.write_bytes(b"x")
                made.append(name)
            order.append(f"{name} out")

    threads = [threading.Thread(target=maker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert made == ["a"] and order == ["a in", "a out", "b in", "b out"]  # b waited, then found it made


def test_processes_sharing_a_cache_hash_each_corpus_file_once(tmp_path, monkeypatch):
    import threading
    import time

    from txl.data import token_cache

    files = _corpus(tmp_path, 4)
    hashed, real = [], token_cache.sha256_file

    def slow_sha256(path, what=""):
        time.sleep(0.1)  # long enough for the other rank to arrive while this one hashes
        hashed.append(path)
        return real(path, what)

    monkeypatch.setattr(token_cache, "sha256_file", slow_sha256)
    results = {}

    def rank(name):
        results[name] = token_cache.file_hashes(files, tmp_path / "cache")

    threads = [threading.Thread(target=rank, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(str, hashed)) == sorted(map(str, files))  # each file once, by one of the two
    assert results["a"] == results["b"] == [(str(f), real(f)) for f in files]
    assert token_cache.file_hashes(files, tmp_path / "cache") == results["a"] and len(hashed) == len(files)


@pytest.mark.parametrize("kind", ["byte", "char", "word", "bpe"])
def test_the_index_says_where_each_file_starts(tmp_path, monkeypatch, kind):
    from txl.data.token_cache import read_index

    parts = tmp_path / "parts"
    parts.mkdir()
    files = _corpus(parts, 5)  # a BOM opens the second file, CRLF lines in it
    (tmp_path / "valid.txt").write_text("a valid line\n" * 20, encoding="utf-8")
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 300)  # files cut into several chunks too
    opts = {"max_size": 300} if kind == "bpe" else {}
    corpus = load_corpus(train=parts, valid=tmp_path / "valid.txt", tokenizer=kind, cache_dir=tmp_path / "c", **opts)
    found = corpus.documents("train")
    if kind == "byte":
        sizes = [f.stat().st_size for f in files]
        assert found == [0, sizes[0], sizes[0] + sizes[1]]
    else:  # (these files allow a BPE cut at each start: no space on either side of it)
        assert found == [len(corpus.tokenizer.encode(_whole(files[:i]))) for i in range(3)]
    index = read_index(corpus.on_disk["train"][0])
    assert index["tokens"] == len(corpus.train) and [s["path"] for s in index["sources"]] == [str(f) for f in files]
    assert index["fingerprint"] == Path(corpus.on_disk["train"][0]).stem and index["tokenizer"] == kind
    assert corpus.documents("valid") == [0]
    assert load_corpus(train=parts, valid=tmp_path / "valid.txt", tokenizer=kind, **opts).documents("train") is None


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_a_file_that_ends_in_a_lone_cr_is_read_as_when_read_whole(tmp_path, monkeypatch, kind):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.txt").write_bytes(b"hello there\nab\r")  # its last line ends in CR, the next file starts with LF
    (parts / "b.txt").write_bytes(b"\ncd ef\n" * 3)
    (tmp_path / "valid.txt").write_text("ab cd\n", encoding="utf-8")
    opts = {"max_size": 270} if kind == "bpe" else {}
    train = sorted(parts.iterdir())
    tok = _vocabulary(kind, _whole(train + [tmp_path / "valid.txt"] if kind == "char" else train), **opts)
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 5)
    streamed = load_corpus(train=parts, valid=tmp_path / "valid.txt", tokenizer=kind, cache_dir=tmp_path / "c", **opts)
    assert streamed.tokenizer == tok and np.array_equal(streamed.train, tok.encode(_whole(train)))


def test_a_split_that_begins_inside_a_file_lists_no_document_there(tmp_path):
    from txl.errors import TxlError

    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} line {i}\n" for i in range(100)), encoding="utf-8")
    corpus = load_corpus(tmp_path, "word", split=(0.25, 0.5, 0.25), cache_dir=tmp_path / "c")
    a_words = len(corpus.tokenizer.encode((tmp_path / "a.txt").read_text()))
    assert corpus.documents("train") == [0]
    assert corpus.documents("valid") == [a_words - len(corpus.train)]  # b.txt starts inside the valid split
    assert corpus.documents("test") == []
    with pytest.raises(TxlError, match="no split 'vaild'"):
        corpus.documents("vaild")


ODD_FILES = {  # byte-order marks, lone CRs and missing newlines where chunks and files meet
    "double BOM first": ["\ufeff\ufeff\ufeffab\n", "de\n"], "double BOM second": ["ab\n", "\ufeff\ufeffcd\n"],
    "BOM only": ["ab\n", "\ufeff", "cd\n"], "lone CR ends a file": ["ab\r", "\ncd\r\n"],
    "U+FEFF after a newline": ["ab\n\ufeffcd\n\ufeff\n", "x\n"], "no newlines": ["ab", "cd", "ef"],
    "an empty file": ["ab\n", "", "cd\n"], "CR only": ["a\rb\rc", "\rd"],
    "a mark between a space and a CR": ["x ", "\ufeff\r", "yz\n" * 3], "two CRs end a file": ["x\r\r", "yz\n" * 3],
    "two marks after a mark-only file": ["ab\n", "\ufeff", "\ufeff\ufeffcd\n"],
}


@pytest.mark.parametrize("case", sorted(ODD_FILES))
def test_ids_do_not_depend_on_where_chunks_are_cut(tmp_path, monkeypatch, case):
    from txl.data.corpus import encode_corpus
    from txl.data.files import _read_text

    paths = []
    for i, text in enumerate(ODD_FILES[case]):
        paths.append(tmp_path / f"f{i}.txt")
        paths[-1].write_bytes(text.encode("utf-8"))
    for kind in ("char", "word", "bpe"):
        tok = _vocabulary(kind, _read_text(paths, kind), max_size=300)
        whole = tok.encode(_read_text(paths, kind))
        assert np.array_equal(encode_corpus(paths, tok), whole), kind  # no cache folder
        for size in (1, 4, 7, 1 << 24):
            monkeypatch.setattr(streaming, "CHUNK_BYTES", size)
            streamed = encode_corpus(paths, tok, tmp_path / f"cache-{kind}-{size}")
            assert np.array_equal(streamed, whole), (kind, size)


def test_a_resume_record_that_does_not_fit_starts_again(tmp_path, monkeypatch):
    files = _corpus(tmp_path, 6)
    tok = WordTokenizer.build([f.read_text(encoding="utf-8") for f in files])
    span = streaming.span_of(files, 0, sum(f.stat().st_size for f in files))
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 150)
    expected = tok.encode(_whole(files))
    real, calls = streaming._encode_chunk, []

    def dies_at_5(job):
        calls.append(job)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(job)

    for damage in ("part cut short", "record past the text", "record off a line end"):
        out, calls[:] = tmp_path / f"{damage}.npy", []
        monkeypatch.setattr(streaming, "_encode_chunk", dies_at_5)
        with pytest.raises(KeyboardInterrupt):
            streaming.encode_to_file(span, tok, out, np.dtype(np.uint16))
        part, record = Path(f"{out}.part"), Path(f"{out}.part.json")
        state = json.loads(record.read_text())
        if damage == "part cut short":  # what a crash before the ids reached the disk can leave
            with open(part, "r+b") as f:
                f.truncate(part.stat().st_size - 20)
        else:
            state["text_bytes"] += 10**9 if damage == "record past the text" else 3
            record.write_text(json.dumps(state))
        monkeypatch.setattr(streaming, "_encode_chunk", real)
        streaming.encode_to_file(span, tok, out, np.dtype(np.uint16))
        assert np.array_equal(np.load(out), expected), damage


def test_a_file_that_changes_while_it_is_encoded_is_refused(tmp_path, monkeypatch):
    from txl.data import token_cache
    from txl.errors import TxlError

    files = _corpus(tmp_path, 7)
    real = streaming._encode_chunk

    def rewrites(job):  # the corpus changes while its chunks are encoded
        files[0].write_text("another text\n", encoding="utf-8")
        return real(job)

    monkeypatch.setattr(streaming, "_encode_chunk", rewrites)
    with pytest.raises(TxlError, match="changed while it was read"):
        load_corpus(train=files[0], valid=files[1], tokenizer="word", cache_dir=tmp_path / "c")
    assert not list((tmp_path / "c").glob("*.npy*")) or all(not p.name.endswith(".npy")
                                                            for p in (tmp_path / "c").iterdir())
    monkeypatch.setattr(streaming, "_encode_chunk", real)
    again = load_corpus(train=files[0], valid=files[1], tokenizer="word", cache_dir=tmp_path / "c")
    assert again.tokenizer.decode(again.train).strip() == "another text"
    monkeypatch.setattr(token_cache, "cache_lock", lambda path: (_ for _ in ()).throw(TxlError("read-only")))
    kept = load_corpus(train=files[0], valid=files[1], tokenizer="word", cache_dir=tmp_path / "c")
    assert np.array_equal(kept.train, again.train)  # a complete cache is read without taking a lock


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_books_that_end_in_blank_lines_still_have_exact_starts(tmp_path, monkeypatch, kind):
    parts = tmp_path / "books"
    parts.mkdir()
    books = ["A first book.\nIt ends in a blank line.\n\n", " A second one opens with a space.\nThen ends.  \n",
             "\ufeffThe third has a mark.\r\nAnd CRLF lines.\r\n\r\n", "the last one\n"]
    for i, text in enumerate(books):
        (parts / f"b{i}.txt").write_bytes(text.encode("utf-8") * 5)
    (tmp_path / "valid.txt").write_text("a valid line\n" * 20, encoding="utf-8")
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 64)
    opts = {"max_size": 280} if kind == "bpe" else {}
    corpus = load_corpus(train=parts, valid=tmp_path / "valid.txt", tokenizer=kind, cache_dir=tmp_path / "c", **opts)
    files = sorted(parts.iterdir())
    found = corpus.documents("train")
    assert len(found) == len(books)  # every book starts on a line of its own: each has its first token
    for i, start in enumerate(found):
        if kind == "word":  # (word ids decode to words, not the text)
            assert start == len(corpus.tokenizer.encode(_whole(files[:i])))
        else:
            assert corpus.tokenizer.decode(corpus.train[:start]) == _whole(files[:i])


def test_a_split_that_begins_with_a_u_feff_keeps_it_as_when_read_whole(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("aa bb\ncc dd\nee ff\n\ufeff\ufeffgg hh\nii jj\nkk ll\n", encoding="utf-8")
    for kind in ("word", "bpe"):
        opts = {"split": (0.375, 0.375, 0.25), "max_size": 300 if kind == "bpe" else None}
        tok, whole = _split_whole([tmp_path / "c" / "a.txt"], kind, opts["split"], opts["max_size"])
        streamed = load_corpus(tmp_path / "c", kind, cache_dir=tmp_path / f"cache-{kind}", **opts)
        assert streamed.tokenizer == tok
        for name in ("train", "valid", "test"):
            assert np.array_equal(getattr(streamed, name), whole[name]), (kind, name)


def test_encode_marked_finds_token_starts_in_bytes():
    import tokenizers as tk

    from txl.data.tokenizers.bpe import BPETokenizer, _unicode_to_byte

    to_symbol = {b: u for u, b in _unicode_to_byte().items()}
    symbols = lambda data: "".join(to_symbol[b] for b in data)  # noqa: E731
    vocab = {c: i for i, c in enumerate(sorted(tk.pre_tokenizers.ByteLevel.alphabet()))}
    vocab[symbols(b"\xa9\xc3")] = len(vocab)  # a token across the two characters of "éè" (c3 a9 | c3 a8)
    model = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[(symbols(b"\xa9"), symbols(b"\xc3"))]))
    model.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = BPETokenizer(model.to_str())
    ids, found = tok.encode_marked("éè", [0, 1, 2])
    assert [tok.token_bytes(int(i)) for i in ids] == [b"\xc3", b"\xa9\xc3", b"\xa8"]
    assert found == [0, None, 3]  # no token starts at "è": the middle one holds its first byte
    assert np.array_equal(tok.encode_marked("ab cd", [])[0], tok.encode("ab cd"))
