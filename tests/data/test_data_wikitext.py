"""Tests for WikiText-style tokenisation, the word tokenizer's normalize option and the BPE tokenizer."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txl.data.corpus import load_corpus
from txl.data.tokenizers.bpe import BPETokenizer, _chunks
from txl.data.tokenizers import (
    TOKENIZER_KINDS,
    WordTokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)
from txl.data.tokenizers.wikitext import wikitext_detokenize, wikitext_tokenize
from txl.data.tokenizers.base import normalize_text
from txl.errors import TxlError

# Raw sentences in the style of Wikipedia articles, and their WikiText-103 tokenisation
# (conventions as in the published files: " = = Gameplay = = ", "role @-@ playing",
# "0 @.@ 7 – 2 @.@ 2 kg ( 1 @.@ 5 lb )", '" lobster red "', "H. americanus", "lit . Valkyria").
CASES = [
    ("== Critical reception ==", "= = Critical reception = ="),
    (" = Valkyria Chronicles III = ", "= Valkyria Chronicles III ="),
    ("The game's well-known battle system sold 1,250,000 copies by 2011.",
     "The game 's well @-@ known battle system sold 1 @,@ 250 @,@ 000 copies by 2011 ."),
    ("The lobster weighs 0.7–2.2 kg (1.5–4.9 lb) and is blue.",
     "The lobster weighs 0 @.@ 7 – 2 @.@ 2 kg ( 1 @.@ 5 – 4 @.@ 9 lb ) and is blue ."),
    ('Its shell turns "lobster red" on cooking; the claw is the "crusher".',
     'Its shell turns " lobster red " on cooking ; the claw is the " crusher " .'),
    ("H. gammarus lives in the Black Sea. It is closely related to H. americanus.",
     "H. gammarus lives in the Black Sea . It is closely related to H. americanus ."),
    ("Senjō no Valkyria 3 (Japanese: 戦場のヴァルキュリア3, lit. Valkyria of the Battlefield 3) is a role-playing game.",
     "Senjō no Valkyria 3 ( Japanese : 戦場のヴァルキュリア3 , lit . Valkyria of the Battlefield 3 ) is a role @-@ playing game ."),
    ("I don't think it's the players' fault, he said in the 1990's.",
     "I don 't think it 's the players ' fault , he said in the 1990 's ."),
    ("The U.S. Army sent Dr. Smith, e.g. to Fort No. 5 in 1944–45.",
     "The U.S. Army sent Dr. Smith , e.g. to Fort No. 5 in 1944 – 45 ."),
    ("It scored 2-1 against the 3rd Division, a 50% rise from $4.5 million...",
     "It scored 2 @-@ 1 against the 3rd Division , a 50 % rise from $ 4 @.@ 5 million ..."),
    ("The <unk> was found at 5 @-@ 6 m depth.", "The <unk> was found at 5 @-@ 6 m depth ."),
    ("", ""),
]


@pytest.mark.parametrize("raw, expected", CASES)
def test_wikitext_tokenize_cases(raw: str, expected: str) -> None:
    assert wikitext_tokenize(raw) == expected.split()


@pytest.mark.parametrize("raw, expected", CASES)
def test_wikitext_tokenize_is_stable_on_tokenized_text(raw: str, expected: str) -> None:
    assert wikitext_tokenize(expected) == expected.split()


@pytest.mark.parametrize("raw", [
    "The game's well-known battle system sold 1,250,000 copies by 2011.",
    'Its shell turns "lobster red" on cooking; the claw is the "crusher".',
    "H. gammarus lives in the Black Sea. It is closely related to H. americanus.",
    "I don't think it's the players' fault, he said in the 1990's.",
    "== Critical reception ==",
    "It weighs 3.5 kg (7.7 lb), she said.",
])
def test_wikitext_detokenize_inverts_simple_text(raw: str) -> None:
    toks = wikitext_tokenize(raw)
    assert wikitext_detokenize(toks) == raw
    assert wikitext_detokenize(" ".join(toks)) == raw


def test_wikitext_detokenize_documented_limits() -> None:
    # an en dash written without spaces comes back with spaces (the spacing is not recorded)
    assert wikitext_detokenize(wikitext_tokenize("in 1944–45.")) == "in 1944 – 45."


def test_word_tokenizer_wikitext_normalize_matches_pretokenized_corpus() -> None:
    raw = "\n".join(r for r, _ in CASES) + "\n"
    pre = "\n".join(" " + e + " " for _, e in CASES) + "\n"  # WikiText files pad lines with spaces
    tok_raw = WordTokenizer.build([raw], normalize="wikitext")
    tok_pre = WordTokenizer.build([pre])
    assert tok_raw.words == tok_pre.words
    ids_raw, ids_pre = tok_raw.encode(raw), tok_pre.encode(pre)
    np.testing.assert_array_equal(ids_raw, ids_pre)
    # a WikiText vocabulary used on raw text: the same ids as the pre-tokenised line
    line = "The lobster's well-known claw weighs 2.5 kg."
    pre_line = "The lobster 's well @-@ known claw weighs 2 @.@ 5 kg ."
    w = WordTokenizer(tok_pre.words, normalize="wikitext")
    np.testing.assert_array_equal(w.encode(line), tok_pre.encode(pre_line))
    assert tok_pre.decode(tok_pre.encode(pre_line)) == pre_line + "\n"


def test_word_tokenizer_normalize_lower_and_decode_detokenize() -> None:
    tok = WordTokenizer.build(["H. Gammarus is well-known.\n"], normalize="wikitext", lower=True)
    assert tok.tokens("H. Gammarus is well-known.") == ["h.", "gammarus", "is", "well", "@-@", "known", ".", "<eos>"]
    ids = tok.encode("H. Gammarus is well-known.\nIs it?")
    assert tok.decode(ids) == "h. gammarus is well @-@ known .\nis <unk> <unk>\n"
    assert tok.decode(ids, detokenize=True) == "h. gammarus is well-known.\nis <unk> <unk>\n"


def test_word_tokenizer_normalize_json_round_trip(tmp_path: Path) -> None:
    tok = WordTokenizer.build(["It's a well-known fact.\n"], normalize="wikitext")
    path = tmp_path / "vocab.json"
    tok.save(path)
    loaded = load_tokenizer(path)
    assert loaded == tok and loaded.normalize == "wikitext" and loaded.words == tok.words
    np.testing.assert_array_equal(loaded.encode("It's well-known."), tok.encode("It's well-known."))
    assert loaded.decode([0, 1, 2]) == tok.decode([0, 1, 2])
    assert loaded.words[:2] == ["<unk>", "<eos>"]
    # old vocabularies (no "normalize" key) still load, as plain whitespace splitting
    old = {"kind": "word", "lower": False, "words": ["<unk>", "<eos>", "a"]}
    assert tokenizer_from_dict(old).normalize == "none"
    with pytest.raises(TxlError, match="normalize"):
        tokenizer_from_dict({**old, "normalize": "moses"})
    with pytest.raises(TxlError, match="normalize"):
        WordTokenizer.build(["a"], normalize="ptb")


def test_bpe_kind_registered() -> None:
    assert "bpe" in TOKENIZER_KINDS


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    text = ("The lobster is blue. The lobster is red after cooking.\n" * 20
            + "Ünïcödé tëxt and émojis 🙂 are fine.\n\tTabs too.\n")
    return BPETokenizer.build([text], vocab_size=300, min_frequency=2)


def test_bpe_build_round_trip_and_json(bpe: BPETokenizer, tmp_path: Path) -> None:
    assert 256 <= bpe.vocab_size <= 300
    for s in ["The lobster is blue.", "never seen: ж Ω 漢字 \x00 \r\n  spaces  ", "", "\n\n"]:
        ids = bpe.encode(s)
        assert ids.dtype == np.int64 and ids.ndim == 1
        assert bpe.decode(ids) == normalize_text(s)  # CRLF reads as LF
    assert len(bpe.encode("The lobster is blue.")) < len("The lobster is blue.".encode())  # merges were learned
    path = tmp_path / "bpe.json"
    bpe.save(path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, BPETokenizer) and loaded == bpe
    np.testing.assert_array_equal(loaded.encode("The red lobster."), bpe.encode("The red lobster."))
    with pytest.raises(TxlError, match="out of range"):
        bpe.decode([bpe.vocab_size])


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_bpe_round_trips_any_text(s: str) -> None:
    tok = _SHARED_BPE()
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(TxlError, match="surrogate"):
            tok.encode(s)
        return
    assert tok.decode(tok.encode(s)) == normalize_text(s)


_cache: dict = {}


def _SHARED_BPE() -> BPETokenizer:
    if "tok" not in _cache:
        _cache["tok"] = BPETokenizer.build(["abc abd abe\n" * 10], vocab_size=270)
    return _cache["tok"]


def test_bpe_long_text_chunks_give_same_ids(bpe: BPETokenizer) -> None:
    text = "".join(f"line {i} lobster {'blue' if i % 3 else 'red'}\n  indented {i} \n\nx\ty\n" for i in range(300))
    pieces = _chunks(text, 200)
    assert len(pieces) > 5 and "".join(pieces) == text
    assert all(p[-2:-1].strip() and p.endswith("\n") for p in pieces[:-1])  # cut only after "X\n"
    whole = bpe._tok.encode(text, add_special_tokens=False).ids
    chunked = [i for p in pieces for i in bpe._tok.encode(p, add_special_tokens=False).ids]
    assert whole == chunked
    assert bpe.encode(text).tolist() == whole


def test_bpe_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TxlError, match="at least 256"):
        BPETokenizer.build(["abc"], vocab_size=100)
    with pytest.raises(TxlError, match="empty"):
        BPETokenizer.build([""], vocab_size=300)
    with pytest.raises(TxlError, match="not valid"):
        tokenizer_from_dict({"kind": "bpe", "tokenizer": "{not json"})
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if the package were not installed
    with pytest.raises(TxlError, match="pip install tokenizers"):
        BPETokenizer.build(["abc"], vocab_size=300)


def test_bpe_build_and_load_corpus_with_bpe(tmp_path: Path) -> None:
    lines = [f"The lobster number {i} is {'blue' if i % 2 else 'red'}.\n" for i in range(200)]
    f = tmp_path / "corpus.txt"
    f.write_text("".join(lines), encoding="utf-8")
    tok = BPETokenizer.build(["".join(lines)], vocab_size=300, min_frequency=2)
    assert isinstance(tok, BPETokenizer) and tok.vocab_size <= 300
    c = load_corpus(f, "bpe", max_size=300)
    assert c.tokenizer.kind == "bpe" and c.train.dtype == np.uint16
    assert len(c.train) > len(c.valid) > 0 and len(c.test) > 0
    # the valid split holds whole lines (cut at line starts, like word level)
    assert c.tokenizer.decode(c.valid).endswith("\n")
    sep = load_corpus(train=f, valid=f, tokenizer="bpe", max_size=280)
    assert sep.tokenizer.vocab_size <= 280 and sep.tokenizer.decode(sep.valid) == f.read_text()


def test_load_corpus_word_normalize(tmp_path: Path) -> None:
    f = tmp_path / "raw.txt"
    f.write_text("The lobster's claw is well-known.\n" * 30, encoding="utf-8")
    c = load_corpus(f, "word", normalize="wikitext")
    assert "@-@" in c.tokenizer.words and "'s" in c.tokenizer.words
