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
from collections.abc import Iterable
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
    # idx2sym, lower_case and the added tokens' text are read, these stay inert
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


# where a pickled TransfoXLTokenizer keeps the tokens added by ``add_tokens``: {id: token} (transformers
# >= 4.34: AddedToken records; earlier 4.x: strings) and {token text: id}
_ADDED_DECODERS = ("_added_tokens_decoder", "added_tokens_decoder")
_ADDED_ENCODERS = ("_added_tokens_encoder", "added_tokens_encoder")


def _token_text(token: Any) -> str | None:
    """The text of an added token as pickled: a string, or an inert ``AddedToken`` record (its state's
    ``content``, or its first constructor argument); None when it holds none."""
    if isinstance(token, str):
        return token
    if isinstance(token, _Inert):
        state = getattr(token, "state", None)
        if isinstance(state, dict) and isinstance(state.get("content"), str):
            return state["content"]
        if token.args and isinstance(token.args[0], str):
            return token.args[0]
        if isinstance(token.kwargs.get("content"), str):
            return token.kwargs["content"]
    return None


def transfo_xl_words(state: Any, added: Iterable[tuple[Any, Any]] = (), where: str = "the pickled vocabulary",
                     size: int | None = None) -> list[str]:
    """The id-ordered vocabulary of a TransfoXLTokenizer state (the pickled ``__dict__``): ``idx2sym``,
    then the tokens ``add_tokens`` gave the ids after it.

    transformers 4.x keeps added tokens outside ``idx2sym`` (``len(tokenizer)`` counts them, and the
    model's vocabulary holds their rows): in the state as ``_added_tokens_decoder`` ({id: AddedToken},
    >= 4.34), ``added_tokens_decoder`` ({id: text}) or ``*added_tokens_encoder`` ({text: id}), and in
    the saved folder's ``added_tokens.json`` and ``tokenizer_config.json``, which the caller passes as
    ``added`` (``(id, text)`` pairs, checked here like the others). All are read as plain data (nothing
    is imported or run). An added token at an id of ``idx2sym`` must be that very symbol (transformers
    lists ``<eos>`` and ``<unk>`` there); the others must take the ids right after ``idx2sym``, in
    order, without a gap. With ``size`` (the
    model's vocabulary size), added tokens at ids from ``size`` on are left out: the model has no row
    for them (TransfoXLTokenizer adds ``<formula>`` by default, also for a model trained without it).

    Raises:
        TxlError: no ``idx2sym`` list of strings; an added token that is not a string at an integer id
            >= 0; two texts for one id; an added token at an id ``idx2sym`` gives another symbol, or
            already in the vocabulary at another id; a gap in the ids after ``idx2sym``.
    """
    symbols = state.get("idx2sym") if isinstance(state, dict) else None
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        raise TxlError(f"{where} has no idx2sym list of strings")
    pairs: list[tuple[Any, Any]] = []
    for name in _ADDED_DECODERS:
        table = state.get(name)
        if isinstance(table, dict):
            pairs += [(i, _token_text(token)) for i, token in table.items()]
    for name in _ADDED_ENCODERS:
        table = state.get(name)
        if isinstance(table, dict):
            pairs += [(i, text) for text, i in table.items()]
    pairs += list(added)
    found: dict[int, str] = {}
    for i, text in pairs:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0 or not isinstance(text, str):
            raise TxlError(f"{where}: an added token must be text at an integer id >= 0, got {text!r} at {i!r}")
        if found.setdefault(i, text) != text:
            raise TxlError(f"{where}: the added tokens give id {i} two texts, {found[i]!r} and {text!r}")
    words = list(symbols)
    index = {w: i for i, w in enumerate(words)}
    for i, text in sorted(found.items()):
        if size is not None and i >= max(size, len(symbols)):
            break
        if i < len(symbols):
            if symbols[i] != text:
                raise TxlError(f"{where}: added token {text!r} has id {i}, which the vocabulary gives to "
                               f"{symbols[i]!r}; one id cannot stand for two tokens")
            continue
        if i != len(words):
            raise TxlError(f"{where}: the added tokens leave id {len(words)} without a token (ids after the "
                           f"{len(symbols)} symbols must follow on; the next added one is {text!r} at id {i})")
        if text in index:
            raise TxlError(f"{where}: added token {text!r} (id {i}) is already in the vocabulary at id {index[text]}")
        index[text] = i
        words.append(text)
    return words
