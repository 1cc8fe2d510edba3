"""TextCursor: text fed in pieces gives exactly the tokens of the whole text, for every tokenizer kind."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from txl.data import BPETokenizer, ByteTokenizer, CharTokenizer, WordTokenizer
from txl_recipes.serve.cursor import TextCursor
from txl.errors import TxlError

ALPHABET = "ab \n\r\t\ufeff.'é"  # spaces, line ends (CR, CRLF), a byte-order mark, a contraction, a 2-byte char
CORPUS = ["ab ba a.b\n", "  a b\n", "b'a é\r\n", "\ufeffab\n", "aa bb ab ba\n\n"] * 20


def tokenizers():
    return {
        "byte": ByteTokenizer(),
        "char": CharTokenizer(list(ALPHABET.replace("\r", ""))),
        "word": WordTokenizer.build(CORPUS),
        "word-wikitext": WordTokenizer.build(CORPUS, normalize="wikitext"),
        "bpe": BPETokenizer.build(CORPUS, vocab_size=270, min_frequency=1),
    }


TOKENIZERS = tokenizers()


def feed_all(tokenizer, pieces):
    cursor = TextCursor(tokenizer)
    ids = []
    for i, piece in enumerate(pieces):
        new, cursor = cursor.feed(piece, final=i == len(pieces) - 1)
        ids.extend(new.tolist())
    return ids, cursor


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=8))
@example(text="a\r\nb", cuts=[2])                 # CRLF split across pieces
@example(text="\ufeff\ufeffab", cuts=[1])         # only the stream's first byte-order mark is dropped
@example(text="ab\nab\n  b", cuts=[3, 7])         # BPE: a newline before spaces is not a cut point
@example(text="a b", cuts=[1, 2])                 # a word split over pieces
def test_pieces_give_the_tokens_of_the_whole_text(name, text, cuts):
    tok = TOKENIZERS[name]
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])] or [""]
    ids, cursor = feed_all(tok, pieces)
    assert ids == tok.encode(text).tolist()
    assert cursor.pending == ""


def test_what_stays_pending():
    cases = {"byte": ("a b\r", ""), "char": ("a b\r", "\r"), "word": ("a b\na", "a"),
             "bpe": ("ab\nab\n  a", "ab\n  a")}
    for name, (text, pending) in cases.items():
        ids, cursor = TextCursor(TOKENIZERS[name]).feed(text)
        assert cursor.pending == pending, name
        # what was decided is the encoding of the text before the pending part
        assert ids.tolist() == TOKENIZERS[name].encode(text[:len(text) - len(pending)]).tolist()


def test_a_refused_piece_leaves_the_cursor_unchanged():
    tok = TOKENIZERS["char"]
    _, cursor = TextCursor(tok).feed("ab")
    with pytest.raises(TxlError, match="not in the char vocabulary"):
        cursor.feed("aZ")
    ids, after = cursor.feed("ba", final=True)
    assert ids.tolist() == tok.encode("ba").tolist() and after.started
    assert isinstance(ids, np.ndarray) and ids.dtype == np.int64
