"""Tokenising text that arrives piece by piece into exactly the tokens of the whole text.

A server session receives its text in pieces (one request each) and must give every token the
score it has in the whole text. Cutting the text and encoding each piece alone is exact only where
no token can straddle the cut: for byte tokens that is everywhere, for the others a piece may end
in the middle of what will be one token (a word, a BPE token, a CRLF line end). A
:class:`TextCursor` therefore encodes only the *decided* part of the text it was given, the
longest prefix whose tokens no later text can change, and keeps the rest pending until more text
decides it, or until the caller declares the text finished (``final=True``):

- byte: every prefix is decided (each byte is a token), nothing is ever pending;
- char: every prefix is decided except a trailing carriage return, which may be the first half of
  a CRLF line end (one ``"\\n"`` token);
- word: complete lines (up to the last ``"\\n"``) are decided; the words of a line that has not
  ended yet are pending (a word may go on, and the line's ``<eos>`` is not due yet);
- bpe (GPT-2 byte-level pre-tokenisation): the text is decided up to the last line start ``Y``
  preceded by ``X\\n``, X and Y non-space characters; there the newline is a token of its own
  whatever follows, so the cut never changes a token (the rule of
  :meth:`txl.data.BPETokenizer.encode`'s own chunking). Text after it is pending.

Invariant (tested for all four kinds): for every text and every way of cutting it into pieces,
the ids returned by feeding the pieces in order, the last one with ``final=True``, equal
``tokenizer.encode(whole text)``. Char, word and BPE tokenizers normalise text (a leading
byte-order mark is dropped, CRLF and CR end lines like LF); the cursor applies that normalisation
to the stream as a whole: only the stream's first byte-order mark is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from txl.data.tokenizers.base import BOM, Tokenizer
from txl.data.tokenizers.bpe import _LINE_START

__all__ = ["TextCursor"]


@dataclass(frozen=True)
class TextCursor:
    """Where a stream of text pieces stands: its undecided text and whether the stream has begun.

    Immutable: :meth:`feed` returns the ids and a new cursor, so a caller can drop the new cursor
    when a later step fails (a server request that is refused leaves the session as it was).

    Attributes:
        tokenizer: the :class:`~txl.data.Tokenizer` of the stream.
        pending: text received but not yet encoded (always "" for byte tokenizers).
        started: some text has been encoded (the stream's leading byte-order mark is behind us).
    """

    tokenizer: Tokenizer
    pending: str = ""
    started: bool = field(default=False)

    def feed(self, text: str, final: bool = False) -> tuple[np.ndarray, "TextCursor"]:
        """Add ``text`` to the stream; returns (int64 ids [n] of the newly decided text, the new cursor).

        With ``final`` the stream is treated as ending after ``text``: all pending text is encoded.

        Raises:
            TxlError: text the tokenizer cannot encode (e.g. a character outside a char vocabulary,
                a lone surrogate); this cursor is unchanged.
        """
        tok = self.tokenizer
        if tok.kind == "byte":
            return tok.encode(text), TextCursor(tok, "", self.started or bool(text))
        raw = self.pending + text
        hold = ""
        if raw.endswith("\r") and not final:  # perhaps the first half of CRLF: one line end
            raw, hold = raw[:-1], "\r"
        if "\r" in raw:
            raw = raw.replace("\r\n", "\n").replace("\r", "\n")
        cut = len(raw) if final else _decided(tok.kind, raw)
        decided, rest = raw[:cut], raw[cut:] + hold
        if not decided:
            return np.zeros(0, dtype=np.int64), TextCursor(tok, rest, self.started)
        # the tokenizer drops one leading byte-order mark: only the stream's first one is not text
        ids = tok.encode(BOM + decided if self.started and decided.startswith(BOM) else decided)
        return np.asarray(ids, dtype=np.int64), TextCursor(tok, rest, True)


def _decided(kind: str, text: str) -> int:
    """Length of the longest prefix of ``text`` (line ends already ``"\\n"``) whose tokens cannot
    change whatever text follows (see the module docstring)."""
    if kind == "char":
        return len(text)
    if kind == "word":
        return text.rfind("\n") + 1
    if kind == "bpe":
        last = 0
        for m in _LINE_START.finditer(text):
            last = m.start()
        return last
    return 0  # an unknown kind: nothing is decided before the stream ends
