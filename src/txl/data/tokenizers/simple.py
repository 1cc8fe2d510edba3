"""Byte (enwik8 style), character and word (WikiText style) tokenizers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from txl.config import check_choice
from txl.errors import TxlError, counted
from txl.data.tokenizers.base import (WORD_NORMALIZERS, TextStream, Tokenizer, Utf8TextStream, _ids_array,
                                      check_vocabulary_entry, normalize_text)
from txl.data.tokenizers.wikitext import wikitext_detokenize, wikitext_tokenize


class ByteTokenizer(Tokenizer):
    """enwik8-style tokenizer: the ids are the UTF-8 bytes of the text (vocab_size 256).

    ``decode`` uses ``errors="replace"``, so any id sequence decodes. The round trip
    ``decode(encode(s)) == s`` is lossless for every valid Unicode string.
    """

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> np.ndarray:
        """UTF-8 bytes of ``text`` as ``int64`` ids, shape ``[n_bytes]``.

        Lone surrogates from ``surrogateescape`` decoding (e.g. non-UTF-8 command-line text) map
        back to their original bytes; other lone surrogates raise :class:`TxlError`.
        """
        try:
            data = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError as e:
            raise TxlError(
                f"text contains a lone surrogate {text[e.start]!r} at character {e.start}, "
                "which is not valid Unicode; remove it"
            ) from None
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def encode_file_bytes(self, data: bytes, source: str = "input") -> np.ndarray:
        """The raw bytes of ``data`` as ``int64`` ids (any bytes are fine): the ids of the base rule
        (:func:`~txl.data.tokenizers.base.decode_file_text`, then :meth:`encode`), without the round trip
        through text."""
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Any) -> str:
        arr = _ids_array(ids, 256, self.kind)
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def text_stream(self) -> TextStream:
        """Streaming text through an incremental UTF-8 decoder (see :class:`Utf8TextStream`)."""
        return Utf8TextStream(self, lambda i: _ids_array([i], 256, self.kind).astype(np.uint8).tobytes())

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "byte"}


class CharTokenizer(Tokenizer):
    """Character tokenizer: id ``i`` is the character ``chars[i]``.

    Args:
        chars: distinct single-character strings; :meth:`build` makes them from a corpus,
            sorted by code point.

    Raises :class:`TxlError` if ``chars`` is empty, has duplicates or non-single-char entries.
    """

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if not chars:
            raise TxlError("char vocabulary is empty; build it from a non-empty text")
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise TxlError(f"char vocabulary entry {c!r} is not a single character")
            check_vocabulary_entry(c, "char")
        if len(set(chars)) != len(chars):
            raise TxlError("char vocabulary has duplicate characters")
        self.chars: list[str] = chars
        codes = np.array([ord(c) for c in chars], dtype=np.uint32)
        self._codes_by_id = codes  # [vocab] code point of each id
        self._order = np.argsort(codes, kind="stable").astype(np.int64)  # sorted pos -> id
        self._sorted_codes = codes[self._order]

    @classmethod
    def build(cls, text: str | Iterable[str]) -> CharTokenizer:
        """A vocabulary of the distinct characters of ``text`` (after :func:`normalize_text`), sorted
        by code point. ``text`` may be an iterable of strings instead (a corpus read chunk by chunk, each
        cut after a newline): the vocabulary of their concatenation.

        Raises :class:`TxlError` if ``text`` is empty or not a string (or holds a piece that is not).
        """
        if isinstance(text, (bytes, bytearray)) or not isinstance(text, (str, Iterable)):
            raise TxlError(f"CharTokenizer.build takes a text (a string), got {type(text).__name__}")
        codes = np.zeros(0, dtype=np.uint32)
        for piece in [text] if isinstance(text, str) else text:
            if not isinstance(piece, str):
                raise TxlError(f"CharTokenizer.build takes a text (a string), got {type(piece).__name__}")
            codes = np.union1d(codes, _codepoints(normalize_text(piece)))
        if not codes.size:
            raise TxlError("cannot build a char vocabulary from empty text")
        return cls(_codes_to_str(codes))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Ids of the characters of ``text``, ``int64``, shape ``[n_chars]``.

        The text is :func:`normalize_text`-ed first (no leading byte-order mark, ``"\\n"`` line ends).
        Raises :class:`TxlError` naming the first unknown character and how many there are.
        """
        codes = _codepoints(normalize_text(text))
        pos = np.searchsorted(self._sorted_codes, codes)
        pos_c = np.minimum(pos, len(self._sorted_codes) - 1)
        unknown = self._sorted_codes[pos_c] != codes
        if unknown.any():
            where = np.flatnonzero(unknown)
            first = int(where[0])
            distinct = len(np.unique(codes[where]))
            raise TxlError(
                f"text contains {counted(len(where), 'character')} not in the char vocabulary "
                f"({distinct} distinct; first {chr(int(codes[first]))!r} at character {first}); "
                "build the vocabulary from text that includes them, or use tokenizer=byte"
            )
        return self._order[pos_c]

    def decode(self, ids: Any) -> str:
        arr = _ids_array(ids, self.vocab_size, self.kind)
        return _codes_to_str(self._codes_by_id[arr])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "char", "chars": list(self.chars)}


def _codepoints(text: str) -> np.ndarray:
    """Code points of ``text`` as a ``uint32`` array (lone surrogates kept as-is)."""
    data = text.encode("utf-32-le", errors="surrogatepass")
    return np.frombuffer(data, dtype="<u4")


def _codes_to_str(codes: np.ndarray) -> str:
    return np.asarray(codes, dtype="<u4").tobytes().decode("utf-32-le", errors="surrogatepass")


class WordTokenizer(Tokenizer):
    """WikiText-style word tokenizer.

    Each line (text split at ``"\\n"``) becomes its words followed by ``<eos>``; every line gets
    one ``<eos>``, empty lines included, and so does a final line without a trailing newline
    (``""`` encodes to no tokens). Unknown words become ``<unk>``. A literal ``<unk>`` /
    ``<eos>`` word in the text maps to that special id.

    Args:
        words: the full vocabulary in id order; it must contain ``"<unk>"`` and ``"<eos>"``
            (anywhere: :meth:`build` puts them first, a converted Hugging Face WikiText-103
            vocabulary has ``<eos>`` at 0 and ``<unk>`` at 24); entries are distinct non-empty
            strings without whitespace.
        lower: lower-case the words before lookup (the vocabulary was built lower-cased).
        normalize: how a line becomes words: ``"none"`` splits at whitespace (for pre-tokenised
            corpora such as WikiText ``*.tokens`` and PTB); ``"wikitext"`` tokenises raw text the
            WikiText way first (:func:`~txl.data.tokenizers.wikitext.wikitext_tokenize`), so raw text gets
            the same ids as the pre-tokenised corpus.

    Raises :class:`TxlError` for a malformed vocabulary or an unknown ``normalize``.
    """

    kind = "word"
    UNK = "<unk>"
    EOS = "<eos>"

    def __init__(self, words: Sequence[str], lower: bool = False, normalize: str = "none") -> None:
        words = list(words)
        if self.UNK not in words or self.EOS not in words:
            raise TxlError("word vocabulary must contain '<unk>' and '<eos>'")
        for w in words:
            check_vocabulary_entry(w, "word")
            if not w or w.split() != [w]:
                raise TxlError(f"word vocabulary entry {w!r} is not a non-empty word without spaces")
        if len(set(words)) != len(words):
            raise TxlError("word vocabulary has duplicate words")
        if not isinstance(lower, bool):
            raise TxlError(f"word tokenizer 'lower' must be true or false, got {lower!r}")
        check_choice(normalize, WORD_NORMALIZERS, "word tokenizer 'normalize'")
        self.words: list[str] = words
        self.lower = lower
        self.normalize = normalize
        self._index = {w: i for i, w in enumerate(words)}
        self.unk_id = self._index[self.UNK]
        self.eos_id = self._index[self.EOS]

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        min_freq: int = 1,
        max_size: int | None = None,
        lower: bool = False,
        normalize: str = "none",
    ) -> WordTokenizer:
        """Build a vocabulary from ``texts`` (an iterable of strings, e.g. the train split).

        Order: ``<unk>`` = 0, ``<eos>`` = 1, then words by descending count; equal counts keep
        the order of first appearance in ``texts``. Words seen fewer than ``min_freq`` times are
        dropped; the vocabulary is cut to ``max_size`` entries in total (specials included).
        Literal ``<unk>``/``<eos>`` words are not counted. Words are counted after ``normalize``
        and ``lower`` (see the class docstring).

        Texts are :func:`normalize_text`-ed first (a leading byte-order mark is dropped, CRLF and CR
        end lines like LF).

        Raises :class:`TxlError` if ``texts`` is a single string (pass a list of texts), ``min_freq < 1``,
        ``max_size < 2`` or ``normalize`` is unknown.
        """
        if isinstance(texts, (str, bytes)):
            raise TxlError("WordTokenizer.build takes a list of texts, got a single string; wrap it in a list")
        if min_freq < 1:
            raise TxlError(f"min_freq must be at least 1, got {min_freq}")
        if max_size is not None and max_size < 2:
            raise TxlError(f"max_size must be at least 2 (for <unk> and <eos>), got {max_size}")
        check_choice(normalize, WORD_NORMALIZERS, "word tokenizer 'normalize'")
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(_line_words(normalize_text(text), lower, normalize))
        return cls.from_counts(counts, min_freq=min_freq, max_size=max_size, lower=lower, normalize=normalize)

    @classmethod
    def from_counts(cls, counts: Counter, min_freq: int = 1, max_size: int | None = None, lower: bool = False,
                    normalize: str = "none") -> WordTokenizer:
        """The vocabulary of :meth:`build` from word counts made elsewhere (in the order the words were
        first seen, as a ``Counter`` updated text after text keeps them): a corpus counted chunk by chunk
        (:func:`txl.data.token_cache.streamed_vocabulary`) gets the vocabulary of one :meth:`build` over its text."""
        counts = Counter(counts)
        for special in (cls.UNK, cls.EOS):
            counts.pop(special, None)
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties by first seen
        words = [cls.UNK, cls.EOS] + [w for w, c in ranked if c >= min_freq]
        if max_size is not None:
            words = words[:max_size]
        return cls(words, lower=lower, normalize=normalize)

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def tokens(self, text: str) -> list[str]:
        """The word strings of ``text`` with ``<eos>`` at each line end (before id lookup).

        The text is :func:`normalize_text`-ed first (no leading byte-order mark; CRLF and CR end lines).
        """
        text = normalize_text(text)
        lines = text.split("\n")
        if text.endswith("\n") or not text:
            lines.pop()
        out: list[str] = []
        for line in lines:
            out.extend(_line_words(line, self.lower, self.normalize))
            out.append(self.EOS)
        return out

    def encode(self, text: str) -> np.ndarray:
        """Word ids of ``text`` (``int64``, shape ``[n_words + n_lines]``), ``<unk>`` for OOV."""
        toks = self.tokens(text)
        get = self._index.get
        unk = self.unk_id
        return np.fromiter((get(w, unk) for w in toks), dtype=np.int64, count=len(toks))

    def decode(self, ids: Any, detokenize: bool = False) -> str:
        """Words joined by single spaces; ``<eos>`` becomes ``"\\n"`` (no spaces around it).

        With ``detokenize=True`` each line is passed through
        :func:`~txl.data.tokenizers.wikitext.wikitext_detokenize` (``well @-@ known`` → ``well-known``;
        best effort, see its limits).
        """
        arr = _ids_array(ids, self.vocab_size, self.kind)
        join = wikitext_detokenize if detokenize else " ".join
        pieces: list[str] = []
        line: list[str] = []
        for i in arr.tolist():
            if i == self.eos_id:
                pieces.append(join(line) + "\n")
                line = []
            else:
                line.append(self.words[i])
        if line:
            pieces.append(join(line))
        return "".join(pieces)

    def text_stream(self) -> TextStream:
        """Streaming text: words separated by single spaces, ``<eos>`` as ``"\\n"`` (as :meth:`decode`)."""
        return _WordTextStream(self)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "word", "lower": self.lower, "normalize": self.normalize, "words": list(self.words)}


def _line_words(line: str, lower: bool, normalize: str) -> list[str]:
    """The words of one line (or of a whole text, for ``"none"``): split or WikiText-tokenised."""
    if normalize == "wikitext":
        words = [w for ln in line.split("\n") for w in wikitext_tokenize(ln)]
        return [w.lower() for w in words] if lower else words
    return (line.lower() if lower else line).split()


class _WordTextStream(TextStream):
    """Words as :meth:`WordTokenizer.decode` joins them: a space before every word but the first of a line."""

    def __init__(self, tokenizer: WordTokenizer) -> None:
        super().__init__(tokenizer)
        self._line_start = True

    def push(self, token_id: int) -> str:
        """The word (with its separating space) or ``"\\n"`` for ``<eos>``."""
        tok = self.tokenizer
        (i,) = _ids_array([token_id], tok.vocab_size, tok.kind).tolist()
        if i == tok.eos_id:
            self._line_start = True
            return "\n"
        text = tok.words[i] if self._line_start else " " + tok.words[i]
        self._line_start = False
        return text
