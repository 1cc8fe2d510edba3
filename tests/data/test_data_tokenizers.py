"""Tests for txl.data.tokenizers: round trips, word rules, vocabulary JSON and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from txl.data.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    WordTokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)
from txl.data.tokenizers.base import normalize_text
from txl.errors import TxlError


def test_byte_round_trip_non_ascii_and_emoji() -> None:
    tok = ByteTokenizer()
    text = "héllo wörld — 日本語 😀🎉\n"
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ids.ndim == 1
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.vocab_size == 256
    assert tok.decode(ids) == text
    assert tok.decode(ids.tolist()) == text
    assert tok.decode(torch.from_numpy(ids)) == text


def test_byte_decode_invalid_utf8_replaces() -> None:
    assert ByteTokenizer().decode([0x61, 0xFF, 0x62]) == "a\ufffdb"


def test_byte_encode_file_bytes_is_raw() -> None:
    data = bytes([0, 255, 128, 10])
    assert ByteTokenizer().encode_file_bytes(data).tolist() == [0, 255, 128, 10]


def test_decode_out_of_range_id_is_txl_error() -> None:
    with pytest.raises(TxlError, match="out of range"):
        ByteTokenizer().decode([1, 256])
    with pytest.raises(TxlError, match="out of range"):
        CharTokenizer.build("ab").decode([-1])


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_round_trip_property(text: str) -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_char_build_and_round_trip() -> None:
    text = "bca\nèé😀 b"
    tok = CharTokenizer.build(text)
    assert tok.chars == sorted(set(text))
    assert tok.vocab_size == len(set(text))
    ids = tok.encode(text)
    assert ids.dtype == np.int64
    assert [tok.chars[i] for i in ids] == list(text)
    assert tok.decode(ids) == text


def test_char_unsorted_vocabulary_ids_follow_list_order() -> None:
    tok = CharTokenizer(["z", "a", "m"])
    assert tok.encode("amz").tolist() == [1, 2, 0]
    assert tok.decode([0, 1, 2]) == "zam"


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1))
def test_char_round_trip_property(text: str) -> None:
    assume(normalize_text(text))  # a text that is only a byte-order mark builds no vocabulary (refused, tested below)
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    assert len(ids) == len(normalize_text(text))
    assert tok.decode(ids) == normalize_text(text)  # no leading BOM, CRLF/CR read as LF


def test_char_unknown_character_error() -> None:
    tok = CharTokenizer.build("abc")
    with pytest.raises(TxlError) as exc:
        tok.encode("abxcyx")
    msg = str(exc.value)
    assert "3 characters not in the char vocabulary" in msg
    assert "2 distinct" in msg
    assert "'x'" in msg and "character 2" in msg


def test_char_empty_text_cannot_build() -> None:
    with pytest.raises(TxlError, match="empty"):
        CharTokenizer.build("")
    with pytest.raises(TxlError, match="empty"):  # only a byte-order mark: empty once it is dropped
        CharTokenizer.build("\ufeff")


def test_char_encode_file_bytes_rejects_non_utf8() -> None:
    tok = CharTokenizer.build("ab")
    with pytest.raises(TxlError) as exc:
        tok.encode_file_bytes(b"ab\xffa", source="corpus file x.txt")
    msg = str(exc.value)
    assert "x.txt is not UTF-8" in msg and "byte offset 2" in msg and "tokenizer=byte" in msg
    assert tok.encode_file_bytes(b"ba").tolist() == [1, 0]


def test_word_eos_per_line_and_unk() -> None:
    tok = WordTokenizer(["<unk>", "<eos>", "a", "b"])
    # every line gives <eos>, empty lines too; final line without newline as well
    assert tok.encode("a b\n\nb  a\tc").tolist() == [2, 3, 1, 1, 3, 2, 0, 1]
    assert tok.encode("a\n").tolist() == [2, 1]
    assert tok.encode("a").tolist() == [2, 1]
    assert tok.encode("").tolist() == []
    assert tok.encode("\n").tolist() == [1]


def test_word_build_order_min_freq_max_size() -> None:
    text = "c b a\nb a\na x\n"
    tok = WordTokenizer.build([text])
    # a:3, b:2, then c and x tied at 1 -> first appearance order (c before x)
    assert tok.words == ["<unk>", "<eos>", "a", "b", "c", "x"]
    assert WordTokenizer.build([text], min_freq=2).words == ["<unk>", "<eos>", "a", "b"]
    assert WordTokenizer.build([text], max_size=3).words == ["<unk>", "<eos>", "a"]
    assert WordTokenizer.build(["<unk> a <eos>"]).words == ["<unk>", "<eos>", "a"]
    with pytest.raises(TxlError, match="max_size"):
        WordTokenizer.build([text], max_size=1)
    with pytest.raises(TxlError, match="min_freq"):
        WordTokenizer.build([text], min_freq=0)


def test_word_lower() -> None:
    tok = WordTokenizer.build(["The the THE cat\n"], lower=True)
    assert tok.words == ["<unk>", "<eos>", "the", "cat"]
    assert tok.encode("ThE CAT dog\n").tolist() == [2, 3, 0, 1]
    cased = WordTokenizer.build(["The the\n"])
    assert cased.words == ["<unk>", "<eos>", "The", "the"]


def test_word_decode() -> None:
    tok = WordTokenizer(["<unk>", "<eos>", "a", "b"])
    assert tok.decode([2, 3, 1, 1, 3, 0]) == "a b\n\nb <unk>"
    text = "a b a\nb\n\na\n"
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize(
    "tok",
    [
        ByteTokenizer(),
        CharTokenizer.build("hello wörld 😀\n"),
        WordTokenizer.build(["The cat sat\non the mat\n"], lower=True),
    ],
    ids=["byte", "char", "word"],
)
def test_vocab_json_round_trip(tok, tmp_path) -> None:
    path = tmp_path / "sub" / "vocab.json"
    tok.save(path)
    assert json.loads(path.read_text(encoding="utf-8"))["kind"] == tok.kind
    assert not [p for p in path.parent.iterdir() if p.name != "vocab.json"]  # no temp files left
    loaded = load_tokenizer(path)
    assert type(loaded) is type(tok)
    assert loaded == tok and loaded.to_dict() == tok.to_dict()
    assert loaded.vocab_size == tok.vocab_size
    text = "hello wörld 😀\n" if tok.kind != "word" else "the cat sat on the mat\n"
    assert loaded.encode(text).tolist() == tok.encode(text).tolist()
    assert loaded.decode(tok.encode(text)) == tok.decode(tok.encode(text)) == text
    assert tokenizer_from_dict(tok.to_dict()) == tok


def test_load_tokenizer_errors(tmp_path) -> None:
    with pytest.raises(TxlError, match="not found"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(TxlError, match="not valid JSON"):
        load_tokenizer(bad)
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"kind": "unigram"}', encoding="utf-8")
    with pytest.raises(TxlError, match="unknown tokenizer kind 'unigram'"):
        load_tokenizer(unknown)
    malformed = tmp_path / "malformed.json"
    malformed.write_text('{"kind": "word", "words": ["a", "b"]}', encoding="utf-8")
    with pytest.raises(TxlError, match="must contain .<unk>. and .<eos>."):
        load_tokenizer(malformed)
    with pytest.raises(TxlError, match="duplicate"):
        tokenizer_from_dict({"kind": "char", "chars": ["a", "a"]})
    with pytest.raises(TxlError, match="JSON object"):
        tokenizer_from_dict([1, 2])


def test_word_vocabulary_with_specials_anywhere_keeps_ids():
    # e.g. a converted WikiText-103 vocabulary: <eos> first, <unk> later
    tok = WordTokenizer(["<eos>", "the", ",", "<unk>", "cat"])
    ids = tok.encode("the cat ,\nthe dog\n").tolist()
    assert ids == [1, 4, 2, 0, 1, 3, 0]
    assert tok.decode(ids) == "the cat ,\nthe <unk>\n"
    again = tokenizer_from_dict(tok.to_dict())
    assert again.encode("dog cat\n").tolist() == [3, 4, 0]


TEXT_KINDS = ["char", "word", "bpe"]


def _build(kind: str, texts: list[str]):
    if kind == "char":
        return CharTokenizer.build("".join(texts))
    if kind == "word":
        return WordTokenizer.build(texts)
    from txl.data import BPETokenizer

    return BPETokenizer.build(texts, vocab_size=260, min_frequency=1)


@pytest.mark.parametrize("kind", TEXT_KINDS)
def test_bom_and_line_endings_read_the_same_everywhere(kind: str) -> None:
    plain = "Hello world\nLine two\n"
    variants = ["\ufeff" + plain, plain.replace("\n", "\r\n"), plain.replace("\n", "\r"),
                "\ufeffHello world\r\nLine two\r"]
    tok = _build(kind, [plain])
    for text in variants:
        np.testing.assert_array_equal(tok.encode(text), tok.encode(plain))
        # a vocabulary built from the variant is the one built from the plain text
        assert _build(kind, [text]) == tok
    if kind == "word":
        assert tok.tokens("\ufeffHello world\n") == ["Hello", "world", "<eos>"]  # not <unk> for "\ufeffHello"


@pytest.mark.parametrize("kind", TEXT_KINDS)
def test_text_files_with_a_bom_and_crlf_encode_like_plain_ones(kind: str, tmp_path) -> None:
    tok = _build(kind, ["Hello world\nLine two\n"])
    plain = tok.encode_file_bytes(b"Hello world\nLine two\n")
    np.testing.assert_array_equal(tok.encode_file_bytes(b"\xef\xbb\xbfHello world\r\nLine two\r\n"), plain)


def test_byte_tokenizer_keeps_bom_and_crlf() -> None:
    assert ByteTokenizer().encode("\ufeffa\r\n").tolist() == [0xEF, 0xBB, 0xBF, 0x61, 0x0D, 0x0A]


@pytest.mark.parametrize("build", [lambda t: WordTokenizer.build(t), lambda t: __import__("txl.data").data.BPETokenizer.build(t)])
def test_build_refuses_a_single_string(build) -> None:
    with pytest.raises(TxlError, match="single string"):
        build("some text")


@pytest.mark.parametrize("entries", [{"kind": "char", "chars": ["a", "\ud800"]},
                                     {"kind": "word", "words": ["<unk>", "<eos>", "x\udfff"]},
                                     {"kind": "word", "words": ["<unk>", "<eos>", 3]},
                                     {"kind": "char", "chars": ["a", "a"]}])
def test_vocabulary_files_with_bad_entries_are_refused(entries, tmp_path) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(entries))  # json.dumps writes a lone surrogate as a \\ud800 escape
    with pytest.raises(TxlError, match=str(path)):
        load_tokenizer(path)


def test_bpe_vocabulary_with_a_lone_surrogate_is_refused(tmp_path) -> None:
    from txl.data import BPETokenizer

    good = BPETokenizer.build(["abc abc\n"], vocab_size=260, min_frequency=1).to_dict()
    good["tokenizer"] = good["tokenizer"].replace('"a"', '"\\ud800"', 1)
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(good))
    with pytest.raises(TxlError, match="surrogate|not valid"):
        load_tokenizer(path)
