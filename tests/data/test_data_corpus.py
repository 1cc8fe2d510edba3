"""Tests for txl.data.corpus: file discovery, caching, dtypes, splits and errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from txl.data import corpus as corpus_mod
from txl.data.corpus import (
    default_corpus_files,
    encode_corpus,
    load_bytes,
    load_corpus,
    read_corpus_files,
    split_tokens,
    token_dtype,
)
from txl.data.tokenizers import ByteTokenizer, CharTokenizer, WordTokenizer
from txl.errors import TxlError


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def test_read_corpus_files_sorted_and_filtered(tmp_path: Path) -> None:
    _write(tmp_path / "b.txt", "b")
    _write(tmp_path / "a" / "z.txt", "z")
    _write(tmp_path / "a" / "y.md", "y")
    _write(tmp_path / ".hidden" / "h.txt", "h")
    _write(tmp_path / ".dot.txt", "d")
    _write(tmp_path / "__pycache__" / "c.txt", "c")
    files = read_corpus_files(tmp_path)
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["a/y.md", "a/z.txt", "b.txt"]
    txt = read_corpus_files(tmp_path, pattern="*.txt")
    assert [f.relative_to(tmp_path).as_posix() for f in txt] == ["a/z.txt", "b.txt"]
    assert read_corpus_files(tmp_path / "b.txt") == [tmp_path / "b.txt"]
    assert load_bytes(files) == b"yzb"


def test_read_corpus_files_errors(tmp_path: Path) -> None:
    with pytest.raises(TxlError, match="does not exist"):
        read_corpus_files(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TxlError, match="no corpus files"):
        read_corpus_files(tmp_path / "empty")
    _write(tmp_path / "zero" / "a.txt", b"")
    with pytest.raises(TxlError, match="empty"):
        read_corpus_files(tmp_path / "zero")
    with pytest.raises(TxlError, match="does not exist"):
        load_corpus(tmp_path / "nope")


def test_default_corpus_files() -> None:
    files = default_corpus_files()
    assert len(files) > 50
    assert files == sorted(files)
    assert all(f.suffix == ".py" and f.is_file() for f in files)
    assert any(f.name == "os.py" for f in files)


def test_token_dtype() -> None:
    assert token_dtype(256) == np.uint8
    assert token_dtype(257) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.int32


def test_encode_corpus_dtypes(tmp_path: Path) -> None:
    f = _write(tmp_path / "c.txt", "abc\nab\n")
    assert encode_corpus([f], ByteTokenizer()).dtype == np.uint8
    char = encode_corpus([f], CharTokenizer.build("abc\n"))
    assert char.dtype == np.uint8 and char.tolist() == [1, 2, 3, 0, 1, 2, 0]
    words = ["<unk>", "<eos>", "abc", "ab"] + [f"w{i}" for i in range(300)]
    mid = encode_corpus([f], WordTokenizer(words))
    assert mid.dtype == np.uint16 and mid.tolist() == [2, 1, 3, 1]
    big = encode_corpus([f], WordTokenizer(["<unk>", "<eos>"] + [f"w{i}" for i in range(70000)]))
    assert big.dtype == np.int32 and big.tolist() == [0, 1, 0, 1]


def test_cache_reuse_and_invalidation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _write(tmp_path / "data" / "c.txt", "hello world\n")
    cache = tmp_path / "cache"
    tok = CharTokenizer.build("hello world\nX")
    first = encode_corpus([f], tok, cache_dir=cache)
    cached = list(cache.glob("*.npy"))
    assert len(cached) == 1 and len(cached[0].stem) == 64
    assert np.load(cached[0], allow_pickle=False).tolist() == first.tolist()

    calls = []
    real_encode = CharTokenizer.encode
    monkeypatch.setattr(CharTokenizer, "encode", lambda self, t: calls.append(t) or real_encode(self, t))
    again = encode_corpus([f], tok, cache_dir=cache)
    assert calls == [] and again.tolist() == first.tolist()  # loaded from cache, not re-encoded

    _write(f, "hello world\nX\n")  # changed corpus -> re-encoded, new cache file
    changed = encode_corpus([f], tok, cache_dir=cache)
    assert calls == ["hello world\nX\n"]
    assert changed.tolist() == [5, 4, 6, 6, 7, 1, 9, 7, 8, 6, 3, 0, 2, 0]  # "hello world\nX\n"
    assert len(list(cache.glob("*.npy"))) == 2

    encode_corpus([f], CharTokenizer.build("hello world\nXY"), cache_dir=cache)  # changed tokenizer
    assert len(calls) == 2 and len(list(cache.glob("*.npy"))) == 3


def test_broken_cache_is_rewritten(tmp_path: Path) -> None:
    f = _write(tmp_path / "c.txt", "abcabc")
    cache = tmp_path / "cache"
    tokens = encode_corpus([f], ByteTokenizer(), cache_dir=cache).tolist()  # (the cache is mapped: read it first)
    (path,) = cache.glob("*.npy")
    path.write_bytes(b"garbage")
    again = encode_corpus([f], ByteTokenizer(), cache_dir=cache)
    assert again.tolist() == tokens == list(b"abcabc")
    assert np.load(path, allow_pickle=False).tolist() == tokens


def test_split_tokens_exact_lengths() -> None:
    tokens = np.arange(1000)
    parts = split_tokens(tokens)
    assert [len(parts[k]) for k in ("train", "valid", "test")] == [900, 50, 50]
    assert parts["train"][-1] == 899 and parts["valid"][0] == 900 and parts["test"][0] == 950
    parts = split_tokens(np.arange(10), (0.5, 0.5, 0.0))
    assert parts["train"].tolist() == [0, 1, 2, 3, 4] and len(parts["test"]) == 0
    parts = split_tokens(np.arange(7), (1.0, 0.0, 0.0))
    assert len(parts["train"]) == 7 and len(parts["valid"]) == len(parts["test"]) == 0


@pytest.mark.parametrize("fractions", [(0.9, 0.05), (0.9, 0.2, 0.05), (1.1, -0.05, -0.05), (0.5, 0.5, "x")])
def test_split_tokens_bad_fractions(fractions) -> None:
    with pytest.raises(TxlError, match="fractions"):
        split_tokens(np.arange(100), fractions)


@pytest.mark.parametrize("fractions, shown", [((0.9, 0.05), "0.9,0.05"), ((0.5, float("nan"), 0.5), "0.5,nan,0.5"),
                                              ((0.5, 0.5, "0.0"), "0.5,0.5,'0.0'"), (0.5, "0.5")])
def test_split_fractions_have_one_check_from_config_to_data(tmp_path: Path, fractions, shown) -> None:
    from txl.config import check_split  # the config's check: the data layer calls it

    message = f"split fractions must be three finite fractions >= 0 summing to 1 (train, valid, test), got {shown}"
    for check in (lambda: check_split(fractions, "split fractions"), lambda: split_tokens(np.arange(100), fractions),
                  lambda: load_corpus(_write(tmp_path / "c.txt", "abc " * 50), split=fractions)):
        with pytest.raises(TxlError) as err:
            check()
        assert str(err.value) == message
    assert check_split(np.array([0.5, 0.25, 0.25], dtype=np.float32), "x") == (0.5, 0.25, 0.25)


def test_split_tokens_empty_nonzero_split_errors() -> None:
    with pytest.raises(TxlError, match="valid split would be empty"):
        split_tokens(np.arange(5), (0.9, 0.05, 0.05))


def test_non_utf8_file_with_char_tokenizer(tmp_path: Path) -> None:
    _write(tmp_path / "a.txt", "fine text\n" * 5)
    _write(tmp_path / "b.txt", b"ok\n\xc3\x28 broken\n")
    with pytest.raises(TxlError) as exc:
        load_corpus(tmp_path, "char")
    msg = str(exc.value)
    assert "b.txt is not UTF-8 text" in msg and "byte offset 3" in msg and "tokenizer=byte" in msg
    # the byte tokenizer accepts it
    assert len(load_corpus(tmp_path, "byte").train) > 0


def test_load_corpus_fractions_byte_and_char(tmp_path: Path) -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    f = _write(tmp_path / "c.txt", text)
    splits = load_corpus(f, "byte", cache_dir=tmp_path / "cache")
    n = len(text.encode())
    assert len(splits.train) + len(splits.valid) + len(splits.test) == n
    assert len(splits.train) == round(0.9 * n)
    assert bytes(splits.train).decode() + bytes(splits.valid).decode() + bytes(splits.test).decode() == text
    assert splits.files == [str(f)] and "c.txt" in splits.source
    char = load_corpus(f, "char", split=(0.8, 0.2, 0.0))
    assert char.tokenizer.vocab_size == len(set(text))
    assert char.tokenizer.decode(np.concatenate([char.train, char.valid])) == text
    assert len(char.test) == 0


def test_load_corpus_word_splits_at_lines(tmp_path: Path) -> None:
    lines = [f"w{i % 7} common w{i % 3}" for i in range(200)]
    text = "\n".join(lines) + "\n"
    f = _write(tmp_path / "c.txt", text)
    splits = load_corpus(f, "word", cache_dir=tmp_path / "cache")
    tok = splits.tokenizer
    assert isinstance(tok, WordTokenizer)
    parts = [tok.decode(splits.train), tok.decode(splits.valid), tok.decode(splits.test)]
    assert all(p.endswith("\n") for p in parts)  # every split is whole lines
    assert "".join(parts) == text
    assert splits.train.dtype == np.uint8
    again = load_corpus(f, "word", cache_dir=tmp_path / "cache")
    assert again.valid.tolist() == splits.valid.tolist()
    # the vocabulary comes from the train text only
    train_text = _write(tmp_path / "t.txt", "a b\na\n")
    valid_text = _write(tmp_path / "v.txt", "a c\n")
    sep = load_corpus(None, "word", train=train_text, valid=valid_text)
    assert sep.tokenizer.words == ["<unk>", "<eos>", "a", "b"]
    assert sep.valid.tolist() == [2, 0, 1] and len(sep.test) == 0


def test_load_corpus_separate_files_and_tokenizer_obj(tmp_path: Path) -> None:
    tr = _write(tmp_path / "train.txt", "abcabc\n")
    va = _write(tmp_path / "valid.txt", "cab\n")
    te = _write(tmp_path / "test.txt", "bca\n")
    s = load_corpus(None, "char", train=tr, valid=va, test=te)
    assert s.tokenizer.decode(s.valid) == "cab\n" and s.tokenizer.decode(s.test) == "bca\n"
    assert s.files == [str(tr), str(va), str(te)]
    new = _write(tmp_path / "new.txt", "cccbbbaaa\n")
    e = load_corpus(new, tokenizer_obj=s.tokenizer, split=(0.5, 0.5, 0.0))
    assert e.tokenizer is s.tokenizer and e.train.tolist() == s.tokenizer.encode("cccbb").tolist()
    unknown = _write(tmp_path / "unknown.txt", "abcd\n")
    with pytest.raises(TxlError, match="not in the char vocabulary"):
        load_corpus(unknown, tokenizer_obj=s.tokenizer, split=(1, 0, 0))
    with pytest.raises(TxlError, match="both a train and a valid"):
        load_corpus(None, train=tr)
    with pytest.raises(TxlError, match="not both"):
        load_corpus(tmp_path, train=tr, valid=va)


def test_load_corpus_too_short_and_bad_kind(tmp_path: Path) -> None:
    f = _write(tmp_path / "tiny.txt", "a")
    with pytest.raises(TxlError, match="train split .* at least 2"):
        load_corpus(f, split=(1, 0, 0))
    with pytest.raises(TxlError, match="unknown tokenizer 'unigram'"):
        load_corpus(f, "unigram")
    with pytest.raises(TxlError, match="fractions"):
        load_corpus(f, split=(0.5, 0.4, 0.0))


def test_load_corpus_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = [_write(tmp_path / "m1.py", "x = 1\n" * 40), _write(tmp_path / "m2.py", "y = 2\n" * 40)]
    monkeypatch.setattr(corpus_mod, "default_corpus_files", lambda: files)
    s = load_corpus()
    assert s.files == [str(p) for p in files] and "default corpus" in s.source
    assert len(s.train) + len(s.valid) + len(s.test) == sum(os.path.getsize(p) for p in files)


def test_a_cached_corpus_is_memory_mapped_and_its_splits_located_in_the_file(tmp_path: Path) -> None:
    from txl.training.fingerprint import array_digest, stored_digest

    text = bytes(range(256)) * 40 + b"tail"
    f = tmp_path / "c.txt"
    f.write_bytes(text)
    fresh = load_corpus(f, "byte", cache_dir=tmp_path / "cache", split=(0.8, 0.1, 0.1))
    again = load_corpus(f, "byte", cache_dir=tmp_path / "cache", split=(0.8, 0.1, 0.1))
    for corpus in (fresh, again):  # written in chunks, then read back mapped: the same tokens
        assert isinstance(corpus.train, np.memmap)
        assert np.concatenate([corpus.train, corpus.valid, corpus.test]).tobytes() == text
        for name in ("train", "valid", "test"):
            part = getattr(corpus, name)
            path, offset, nbytes = corpus.on_disk[name]
            assert nbytes == part.nbytes and Path(path).read_bytes()[offset:offset + nbytes] == part.tobytes()
            assert stored_digest(path, offset, nbytes, part.itemsize) == array_digest(np.asarray(part))
    assert load_corpus(f, "byte", split=(0.8, 0.1, 0.1)).on_disk == {}  # no cache: held in memory


def test_a_corpus_file_that_changes_while_it_is_copied_is_refused(tmp_path: Path, monkeypatch) -> None:
    from txl.data import token_cache as corpus_module

    f = _write(tmp_path / "c.txt", "abcabc")
    monkeypatch.setattr(corpus_module, "sha256_file", lambda path, what="": "0" * 64)  # the first reading saw other bytes
    with pytest.raises(TxlError, match="changed while it was read"):
        encode_corpus([f], ByteTokenizer(), cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.npy"))  # nothing half-written left behind


def test_a_corpus_file_is_hashed_again_only_when_its_size_times_or_inode_change(tmp_path: Path) -> None:
    import json

    from txl.data.token_cache import HASHES_NAME, file_hashes as _file_hashes
    from txl.fileio import sha256_file

    f = _write(tmp_path / "c.txt", "abcabc")
    cache = tmp_path / "cache"
    [(_, real)] = _file_hashes([f], cache)
    record = cache / HASHES_NAME
    known = json.loads(record.read_text())
    known[str(f.resolve())][4] = "f" * 64  # what the record says is what a run takes while the file is unchanged
    record.write_text(json.dumps(known))
    assert _file_hashes([f], cache) == [(str(f), "f" * 64)]
    st = f.stat()
    f.write_text("xyzxyz")  # new text of the same size, its modification time put back: the change time moved
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size
    assert _file_hashes([f], cache) == [(str(f), sha256_file(f))] and sha256_file(f) != real
    record.write_text("not json")  # a damaged record is read past
    assert _file_hashes([f], cache) == [(str(f), sha256_file(f))]


def test_a_split_digest_is_kept_beside_its_cache_file(tmp_path: Path) -> None:
    import json

    from txl.training.fingerprint import stored_digest

    path = tmp_path / "k.npy"
    path.write_bytes(bytes(range(200)))
    first = stored_digest(path, 10, 100, 1)
    memo = Path(f"{path}.digests.json")
    assert json.loads(memo.read_text()) == {"10+100": first}
    memo.write_text(json.dumps({"10+100": {"tokens": 100, "sha256": "kept"}}))
    assert stored_digest(path, 10, 100, 1)["sha256"] == "kept"  # the file is content-addressed: not read again
    assert stored_digest(path, 10, 50, 2)["tokens"] == 25  # another range is read
    with pytest.raises(TxlError, match="ends 50 bytes before"):
        stored_digest(path, 150, 100, 1)


@pytest.mark.parametrize("kind", ["byte", "word"])
def test_split_by_file_keeps_every_file_whole(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "books"
    folder.mkdir()
    texts = {f"{i:02d}.txt": f"book {'abc'[i % 3]} " + " ".join(["word"] * (40 + 7 * i)) + "\n" for i in range(12)}
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    corpus = load_corpus(folder, kind, split=(0.7, 0.15, 0.15), split_by="file", cache_dir=tmp_path / "cache")
    decoded = {name: corpus.tokenizer.decode(np.asarray(getattr(corpus, name))) for name in ("train", "valid", "test")}
    order = [texts[name] for name in sorted(texts)]
    whole = decoded["train"] + decoded["valid"] + decoded["test"]
    assert whole == "".join(order)  # every file once, in order
    for name in ("train", "valid", "test"):  # ... and each split a run of whole files
        assert any(decoded[name] == "".join(order[i:j]) for i in range(13) for j in range(i + 1, 13)), name
    if kind == "byte":  # the default still cuts the text inside a file (word level: at a line start, here a file's)
        by_text = load_corpus(folder, kind, split=(0.7, 0.15, 0.15), cache_dir=tmp_path / "cache")
        assert not np.array_equal(np.asarray(by_text.valid), np.asarray(corpus.valid))


def test_split_by_file_needs_a_file_for_each_split(tmp_path: Path) -> None:
    from txl.config import DataConfig

    folder = tmp_path / "two"
    folder.mkdir()
    for i in range(2):
        (folder / f"{i}.txt").write_text("x" * 100, encoding="utf-8")
    with pytest.raises(TxlError, match=r"no file falls in the valid and test split \(2 files, split 0.9/0.05/0.05\)"):
        load_corpus(folder, "byte", split_by="file")
    with pytest.raises(TxlError, match="data.split_by must be one of text, file, got 'book'"):
        DataConfig(split_by="book").check()


def test_a_prepared_dataset_folder_is_not_read_as_one_text(tmp_path):
    import json

    from txl.data import read_corpus_files
    from txl.errors import TxlError

    (tmp_path / "train.txt").write_text("some text\n", encoding="utf-8")
    (tmp_path / "dataset.json").write_text(json.dumps({"format": "txl-dataset-1", "name": "x",
                                                       "files": {"train": "train.txt"}}))
    with pytest.raises(TxlError, match="prepared by txl data prepare, not one text"):
        read_corpus_files(tmp_path)
    (tmp_path / "dataset.json").write_text(json.dumps({"name": "y", "files": {}}))  # someone else's: read as text
    assert [f.name for f in read_corpus_files(tmp_path)] == ["dataset.json", "train.txt"]


def test_a_tokenizer_of_the_callers_own_kind_is_encoded_in_memory_and_cached(tmp_path: Path) -> None:
    from txl.data.tokenizers import Tokenizer

    class Pairs(Tokenizer):  # ids across line ends: what the chunked encoders of the built-in kinds never see
        kind = "pairs"
        vocab_size = 65536

        def encode(self, text):
            data = text.encode()
            return np.array([data[i] * 256 + (data[i + 1] if i + 1 < len(data) else 0)
                             for i in range(0, len(data), 2)], dtype=np.int64)

        def decode(self, ids):
            return b"".join(int(i).to_bytes(2, "big") for i in ids).rstrip(b"\0").decode()

        def to_dict(self):
            return {"kind": "pairs"}

    f = _write(tmp_path / "c.txt", "ab\ncd\nefg\n")
    want = Pairs().encode("ab\ncd\nefg\n")
    first = encode_corpus([f], Pairs(), cache_dir=tmp_path / "cache")
    assert isinstance(first, np.memmap) and first.tolist() == want.tolist()
    assert encode_corpus([f], Pairs(), cache_dir=tmp_path / "cache").tolist() == want.tolist()  # read back
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1
