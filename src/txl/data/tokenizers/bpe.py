"""Byte-level BPE tokenizer (the Hugging Face ``tokenizers`` library) for users' own corpora."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from txl.data.tokenizers.base import (TextStream, Tokenizer, Utf8TextStream, _ids_array, check_vocabulary_entry,
                                      normalize_text)
from txl.errors import TxlError


def _import_tokenizers():
    """The ``tokenizers`` package, or a TxlError saying how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise TxlError(
            "the bpe tokenizer needs the 'tokenizers' package: pip install tokenizers"
        ) from None
    return tokenizers


class BPETokenizer(Tokenizer):
    """Byte-level BPE tokenizer (GPT-2 style) from the Hugging Face ``tokenizers`` library.

    Any text round-trips: ``decode(encode(s)) == s`` for every valid Unicode string, because
    the base alphabet is the 256 bytes. No ``<eos>`` or other special tokens are added; newlines
    are ordinary tokens. ``tokenizers`` is imported lazily.

    Args:
        tokenizer_json: the tokenizer as serialised by ``tokenizers.Tokenizer.to_str()``.

    Raises :class:`TxlError` if ``tokenizers`` is not installed or the JSON is not a tokenizer.
    """

    kind = "bpe"

    def __init__(self, tokenizer_json: str) -> None:
        tk = _import_tokenizers()
        if not isinstance(tokenizer_json, str):
            raise TxlError("bpe tokenizer description needs a 'tokenizer' JSON string")
        check_vocabulary_entry(tokenizer_json, "bpe")
        try:
            self._tok = tk.Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # the Rust side raises plain Exception subclasses
            raise TxlError(f"bpe tokenizer JSON is not valid: {e}") from None
        self._json = tokenizer_json
        self._byte_lengths: np.ndarray | None = None  # by id, made when encode_marked first needs it

    @classmethod
    def build(cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> BPETokenizer:
        """Train a byte-level BPE vocabulary of at most ``vocab_size`` tokens on ``texts``.

        ``texts`` is an iterable of strings (e.g. the train split); they are fed line by line.
        Merges of pairs seen fewer than ``min_frequency`` times are not learned.

        Raises :class:`TxlError` if ``vocab_size < 256`` (the byte alphabet), ``min_frequency < 1``,
        the texts are empty or a single string (pass a list of texts), or ``tokenizers`` is missing.
        Texts are :func:`normalize_text`-ed first (no leading byte-order mark, ``"\\n"`` line ends).
        """
        if isinstance(texts, (str, bytes)):
            raise TxlError("BPETokenizer.build takes a list of texts, got a single string; wrap it in a list")
        tk = _import_tokenizers()
        if vocab_size < 256:
            raise TxlError(f"bpe vocab_size must be at least 256 (the byte alphabet), got {vocab_size}")
        if min_frequency < 1:
            raise TxlError(f"bpe min_frequency must be at least 1, got {min_frequency}")
        seen = []

        def lines():  # the texts one by one, never all held: a corpus read in chunks trains in bounded memory
            for text in texts:
                text = normalize_text(text)
                if text:
                    seen.append(True)
                    yield from text.splitlines(keepends=True)

        tok = tk.Tokenizer(tk.models.BPE())
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
        )
        tok.train_from_iterator(lines(), trainer=trainer)
        if not seen:
            raise TxlError("cannot build a bpe vocabulary from empty text; give a non-empty corpus")
        return cls(tok.to_str())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        """BPE ids of ``text``, ``int64``, shape ``[n_tokens]``.

        Long texts are encoded in pieces (cut at a single newline between non-space
        characters), which gives the same ids as one call. Raises :class:`TxlError` for text that
        is not valid Unicode (lone surrogates). The text is :func:`normalize_text`-ed first.
        """
        text = normalize_text(text)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TxlError(f"text contains a lone surrogate at character {e.start}; remove it") from None
        pieces = _chunks(text, 1 << 18)
        out = [np.zeros(0, dtype=np.int64)]
        for i in range(0, len(pieces), 8):  # 8 pieces at a time: the library's encodings (ids, offsets, token
            group = pieces[i:i + 8]  # strings) of a long text would take ~100 bytes per token at once
            encs = self._tok.encode_batch(group, add_special_tokens=False) if len(group) > 1 else [
                self._tok.encode(group[0], add_special_tokens=False)]
            out += [np.asarray(e.ids, dtype=np.int64) for e in encs]
        return np.concatenate(out)

    def encode_marked(self, text: str, marks: Sequence[int]) -> tuple[np.ndarray, list[int | None]]:
        """:meth:`encode`, and for each character position in ``marks`` (ascending, of the
        :func:`normalize_text`-ed text) the index of the token that starts there: None where a token spans
        the position (a token may end inside a character: positions are compared in bytes). A position at
        or past the end gives the number of tokens.

        Raises:
            TxlError: as :meth:`encode`.
        """
        ids = self.encode(text)
        text = normalize_text(text)
        if self._byte_lengths is None:  # the bytes each token stands for, by id
            self._byte_lengths = np.array([len(self.token_bytes(i)) for i in range(self.vocab_size)], dtype=np.int64)
        starts = np.cumsum(self._byte_lengths[ids]) - self._byte_lengths[ids]  # each token's first byte
        found: list[int | None] = []
        at, last = 0, 0
        for mark in marks:
            mark = min(max(mark, 0), len(text))
            at += len(text[last:mark].encode("utf-8"))
            last = mark
            i = int(np.searchsorted(starts, at))
            found.append(len(ids) if mark == len(text) else i if i < len(ids) and starts[i] == at else None)
        return ids, found

    def decode(self, ids: Any) -> str:
        """Text of the ids; an incomplete UTF-8 sequence decodes to U+FFFD."""
        arr = _ids_array(ids, self.vocab_size, self.kind)
        return self._tok.decode(arr.tolist(), skip_special_tokens=False)

    def text_stream(self) -> TextStream:
        """Streaming text: each token's bytes through an incremental UTF-8 decoder, so that a character
        split over two tokens waits for its last byte (see :class:`Utf8TextStream`)."""
        return Utf8TextStream(self, self.token_bytes)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (its byte-level symbols mapped back to bytes).

        A token that is not made of byte-level symbols (an added special token) gives the UTF-8
        of its decoded text.
        """
        (i,) = _ids_array([token_id], self.vocab_size, self.kind).tolist()
        symbols = self._tok.id_to_token(i) or ""
        to_byte = _unicode_to_byte()
        if all(c in to_byte for c in symbols):
            return bytes(to_byte[c] for c in symbols)
        return self._tok.decode([i], skip_special_tokens=False).encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "bpe", "tokenizer": self._json}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tokenizer):
            return NotImplemented
        return isinstance(other, BPETokenizer) and json.loads(self._json) == json.loads(other._json)

    __hash__ = None  # type: ignore[assignment]


def _chunks(text: str, size: int) -> list[str]:
    """Cut ``text`` into pieces of about ``size`` characters, only between ``X\\n`` and ``Y``.

    X and Y are non-space characters: there byte-level pre-tokenisation (GPT-2 pattern) makes the
    lone newline a token of its own whether or not the text continues, so the cuts do not change
    the tokens.
    """
    pieces: list[str] = []
    start = 0
    while len(text) - start > size:
        m = _LINE_START.search(text, start + size)
        if m is None:
            break
        pieces.append(text[start:m.start()])
        start = m.start()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


_LINE_START = re.compile(r"(?<=\S\n)(?=\S)")


_UNICODE_TO_BYTE: dict[str, int] = {}


def _unicode_to_byte() -> dict[str, int]:
    """The byte-level alphabet (GPT-2's ``bytes_to_unicode``) inverted: symbol -> byte.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes map, in order, to
    U+0100 onwards.
    """
    if not _UNICODE_TO_BYTE:
        direct = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                  *range(ord("\u00ae"), ord("\u00ff") + 1)]
        extra = 0
        for b in range(256):
            if b in direct:
                _UNICODE_TO_BYTE[chr(b)] = b
            else:
                _UNICODE_TO_BYTE[chr(256 + extra)] = b
                extra += 1
    return _UNICODE_TO_BYTE
