"""A restricted reader for the pickled word vocabularies of Hugging Face's TransfoXLTokenizer.

The vocabulary of a ``transfo-xl`` download (``vocab.pkl``) is the pickled ``__dict__`` of the
tokenizer. txl never unpickles it normally: this reader builds only plain values (dict, list, tuple,
set, str, bytes, int, float, bool, None) plus ``collections.OrderedDict``/``Counter`` (read as
dicts). Compiled regular expressions that newer tokenizers pickle are replaced by their pattern
text without compiling anything; the sacremoses, trie and added-token objects that transformers 4.x
pickles with the tokenizer become inert records (nothing of theirs is imported or called). Any other global (a class or function reference, the way a
malicious pickle runs code) is refused before it is ever called.
"""

from __future__ import annotations

import collections
import io
import pickle
from typing import Any

from txl.errors import TxlError


class _PatternText(str):
    """Stands in for ``re.compile(pattern, flags)``: keeps the pattern text, compiles nothing."""

    def __new__(cls, pattern: Any = "", flags: Any = 0):
        return super().__new__(cls, pattern if isinstance(pattern, str) else repr(pattern))


class _Inert:
    """Stands in for a helper object that transformers 4.x pickles with the tokenizer (sacremoses'
    normalizer/tokenizers, the added-token trie, ``AddedToken``): it records what the pickle gives it
    and has no behaviour, so nothing of the original class is imported or run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "Counter"): collections.Counter,
    ("re", "_compile"): _PatternText,
    # saved beside the vocabulary by transformers 4.x TransfoXLTokenizer.save_pretrained; only
    # idx2sym and lower_case are read, these stay inert
    ("sacremoses.normalize", "MosesPunctNormalizer"): _Inert,
    ("sacremoses.tokenize", "MosesTokenizer"): _Inert,
    ("sacremoses.tokenize", "MosesDetokenizer"): _Inert,
    ("transformers.tokenization_utils", "Trie"): _Inert,
    ("tokenizers", "AddedToken"): _Inert,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle hook
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise TxlError(f"refusing to load {module}.{name} from a pickled vocabulary: only plain "
                           "containers, strings and numbers are accepted")
        return allowed

    def persistent_load(self, pid):  # pragma: no cover - not used by vocabularies
        raise TxlError("refusing a pickled vocabulary with persistent references")


def load_restricted_pickle(data: bytes) -> Any:
    """Decode ``data`` with the restricted reader.

    Raises:
        TxlError: a disallowed global, or data that is not a valid pickle.
    """
    try:
        return _RestrictedUnpickler(io.BytesIO(data)).load()
    except TxlError:
        raise
    except Exception as err:  # malformed pickles raise many exception types
        raise TxlError(f"cannot read the pickled vocabulary: {type(err).__name__}: {err}") from None


def read_transfo_xl_vocab(data: bytes) -> list[str]:
    """The id-ordered symbol list (``idx2sym``) of a pickled TransfoXLTokenizer vocabulary.

    Raises:
        TxlError: refused or malformed pickle, or no ``idx2sym`` list of strings in it.
    """
    state = load_restricted_pickle(data)
    symbols = state.get("idx2sym") if isinstance(state, dict) else None
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        raise TxlError("the pickled vocabulary has no idx2sym list of strings")
    return symbols
