"""Tokenizers: byte (enwik8 style), char, word (WikiText style) and byte-level BPE.

All tokenizers share the :class:`Tokenizer` interface: ``encode(text)`` gives a 1-D ``int64``
numpy array of token ids, ``decode(ids)`` turns ids back into text, and ``to_dict()`` /
``save(path)`` / :func:`load_tokenizer` store the vocabulary as JSON (never pickle).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from txl.data.tokenizers.base import TOKENIZER_KINDS, Tokenizer, decode_file_text, decode_utf8
from txl.data.tokenizers.bpe import BPETokenizer
from txl.data.tokenizers.simple import ByteTokenizer, CharTokenizer, WordTokenizer
from txl.errors import TxlError
from txl.fileio import read_json

__all__ = [
    "Tokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "tokenizer_from_dict",
    "load_tokenizer",
    "decode_utf8",
    "decode_file_text",
    "TOKENIZER_KINDS",
]


def tokenizer_from_dict(d: Any) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict` output.

    Raises :class:`TxlError` for a non-dict, an unknown ``"kind"`` or malformed content.
    """
    if not isinstance(d, dict):
        raise TxlError(f"tokenizer description must be a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        chars = d.get("chars")
        if not isinstance(chars, list):
            raise TxlError("char tokenizer description needs a 'chars' list")
        return CharTokenizer(chars)
    if kind == "word":
        words = d.get("words")
        if not isinstance(words, list):
            raise TxlError("word tokenizer description needs a 'words' list")
        return WordTokenizer(words, lower=d.get("lower", False), normalize=d.get("normalize", "none"))
    if kind == "bpe":
        return BPETokenizer(d.get("tokenizer"))
    raise TxlError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(TOKENIZER_KINDS)}")


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Load a tokenizer saved with :meth:`Tokenizer.save`.

    Raises :class:`TxlError` if the file is missing or unreadable, is not valid JSON, or does
    not describe a tokenizer.
    """
    p = Path(path)
    if not p.is_file():
        raise TxlError(f"tokenizer file {p} not found; give the path of a saved vocabulary JSON")
    try:
        d = read_json(p, "tokenizer file")
    except TxlError as e:
        raise TxlError(f"{e}; re-save the vocabulary") from None
    try:
        return tokenizer_from_dict(d)
    except TxlError as e:
        raise TxlError(f"tokenizer file {p}: {e}") from None
