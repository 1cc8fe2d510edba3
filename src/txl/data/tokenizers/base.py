"""The tokenizer interface and the helpers every tokenizer shares."""

from __future__ import annotations

import codecs
import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from txl.config import NORMALIZE, TOKENIZERS
from txl.errors import TxlError
from txl.fileio import atomic_write, oserrors_as


TOKENIZER_KINDS, WORD_NORMALIZERS = TOKENIZERS, NORMALIZE  # the choices of data.tokenizer, data.normalize


BOM = "\ufeff"


def normalize_text(text: str) -> str:
    """``text`` as the text tokenizers (char, word, BPE) see it: without a leading byte-order mark
    (U+FEFF) and with every line ending (CRLF, lone CR) written as ``"\n"``.

    Byte tokenizers keep bytes as they are and never call this.
    """
    if text.startswith(BOM):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def check_vocabulary_entry(entry: Any, kind: str) -> str:
    """Return ``entry`` if it is a string that is valid Unicode (encodable as UTF-8).

    Raises:
        TxlError: a non-string entry or one holding a lone surrogate such as ``"\\ud800"``.
    """
    if not isinstance(entry, str):
        raise TxlError(f"{kind} vocabulary entry {entry!r} is not a string")
    try:
        entry.encode("utf-8")
    except UnicodeEncodeError:
        raise TxlError(f"{kind} vocabulary entry {entry!r} is not valid Unicode (a lone surrogate); "
                       "the vocabulary file is damaged") from None
    return entry


def decode_utf8(data: bytes, source: str = "input", kind: str = "char", offset: int = 0) -> str:
    """Decode ``data`` as strict UTF-8 for the ``kind`` tokenizer, then :func:`normalize_text` it
    (a file's leading byte-order mark and its CRLF/CR line endings are not text).

    Raises :class:`TxlError` naming ``source``, the invalid byte and its byte offset (counted from
    ``offset``, where ``data`` starts in ``source``), and suggesting ``tokenizer=byte``, if ``data``
    is not valid UTF-8.
    """
    try:
        return normalize_text(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        bad = data[e.start]
        raise TxlError(
            f"{source} is not UTF-8 text (invalid byte 0x{bad:02x} at byte offset {offset + e.start}); "
            f"the {kind} tokenizer needs UTF-8 text: use tokenizer=byte for arbitrary bytes"
        ) from None


def decode_file_text(data: bytes, kind: str, source: str = "input") -> str:
    """The text of a file's raw bytes as a ``kind`` tokenizer reads it.

    For ``"byte"`` any bytes: those that are not UTF-8 become lone surrogates (``surrogateescape``),
    which :meth:`ByteTokenizer.encode` turns back into the same bytes. For char, word and BPE strict
    UTF-8 (:func:`decode_utf8`).

    Raises:
        TxlError: for a text tokenizer, ``data`` that is not UTF-8 (naming ``source``, the byte and its
            offset, as every command reports it).
    """
    if kind == "byte":
        return data.decode("utf-8", errors="surrogateescape")
    return decode_utf8(data, source, kind)


def _ids_array(ids: Any, vocab_size: int, kind: str) -> np.ndarray:
    """Turn a sequence / ndarray / 1-D tensor of ids into a 1-D int64 ndarray, range-checked."""
    if hasattr(ids, "detach"):  # torch tensor, on any device
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise TxlError(f"decode expects a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TxlError(f"decode expects integer token ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise TxlError(
            f"token id {bad} is out of range for the {kind} tokenizer (vocab_size {vocab_size}); "
            "the model and the tokenizer do not match"
        )
    return arr


class Tokenizer(ABC):
    """Common interface of all tokenizers.

    Attributes:
        kind: ``"byte"``, ``"char"``, ``"word"`` or ``"bpe"``.
    """

    kind: str = ""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct token ids; ids are ``0 .. vocab_size - 1``."""

    @abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Encode ``text`` to a 1-D ``int64`` array of token ids (shape ``[n_tokens]``)."""

    @abstractmethod
    def decode(self, ids: Any) -> str:
        """Decode token ids (list, 1-D ndarray or 1-D tensor of ints) back to text.

        Raises ``ValueError`` if ``ids`` is not 1-D integer data, :class:`TxlError` if an id is
        outside ``0 .. vocab_size - 1``.
        """

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description of the tokenizer, including ``"kind"``."""

    def encode_file_bytes(self, data: bytes, source: str = "input") -> np.ndarray:
        """Encode the raw bytes of a file to a 1-D ``int64`` id array: :meth:`encode` of the text
        :func:`decode_file_text` reads in them.

        Raises:
            TxlError: for char, word and BPE tokenizers, ``data`` that is not UTF-8 text (naming
                ``source`` and the byte offset).
        """
        return self.encode(decode_file_text(data, self.kind, source))

    def text_stream(self) -> TextStream:
        """A :class:`TextStream` that turns ids given one at a time into the text of :meth:`decode`.

        The default decodes each id on its own, which is exact for tokenizers whose text is the
        concatenation of their tokens' texts (char); byte, word and BPE tokenizers override it.
        """
        return TextStream(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` as JSON to ``path`` (atomically; parent folders are created).

        Raises :class:`TxlError` if the file cannot be written.
        """
        payload = json.dumps(self.to_dict(), ensure_ascii=False, indent=1).encode("utf-8")
        with oserrors_as(f"cannot write tokenizer vocabulary to {path}"):
            atomic_write(path, lambda tmp: Path(tmp).write_bytes(payload))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tokenizer):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class TextStream:
    """Incremental decoding: :meth:`push` ids one at a time, then :meth:`finish`.

    The texts returned, concatenated, equal ``tokenizer.decode(all ids pushed)`` for every id
    sequence; a piece of text is returned as soon as later ids can no longer change it. This base
    class decodes each id on its own (exact when the text of a sequence is the concatenation of
    its tokens' texts).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def push(self, token_id: int) -> str:
        """The new text that ``token_id`` completes ("" when it waits for more ids)."""
        return self.tokenizer.decode([token_id])

    def finish(self) -> str:
        """The text still held back at the end (e.g. U+FFFD for an incomplete UTF-8 sequence)."""
        return ""


class Utf8TextStream(TextStream):
    """Streaming text of tokens that stand for bytes (byte tokenizer, byte-level BPE).

    The bytes go through an incremental UTF-8 decoder with ``errors="replace"``, which gives the
    same characters and U+FFFD replacements as decoding all the bytes at once: a valid character
    right after an invalid byte is not swallowed, and a character split over tokens waits for its
    last byte.

    Args:
        tokenizer: the tokenizer (its ids are checked by ``token_bytes``).
        token_bytes: the bytes of one token id.
    """

    def __init__(self, tokenizer: Tokenizer, token_bytes) -> None:
        super().__init__(tokenizer)
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The characters completed by the bytes of ``token_id``."""
        return self._decoder.decode(self._bytes(token_id))

    def finish(self) -> str:
        """U+FFFD for an incomplete sequence left at the end, else ""."""
        return self._decoder.decode(b"", final=True)
