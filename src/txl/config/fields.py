"""The fields every config checks through (:func:`check_fields`; a choice's and a floor's rule:
:func:`check_choice`, :func:`check_minimums`) and the constants every floor names.

The value checks that commands run before torch is imported live here too, torch-free: the split
fractions (:func:`check_split`) and the sampling and decoding settings (:func:`check_sampling`,
:func:`check_decoding`, which the generation functions run again for library callers).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import operator
import types
import typing
from typing import Any

from txl.errors import TxlError, listed


def did_you_mean(name: str, known: typing.Iterable[str]) -> str:
    """``" (did you mean X?)"`` (or ``X or Y``) for the known names closest to a misspelt ``name``, else ""."""
    close = difflib.get_close_matches(str(name), list(known), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def check_choice(value: Any, choices: typing.Sequence[Any], name: str) -> None:
    """The one rule of a setting that takes one of a few values (``model.attn_type``, ``--format``, ...):
    ``value`` must be one of ``choices``. A None among ``choices`` lets the setting be unset; the message
    does not list it.

    Raises:
        TxlError: ``"{name} must be one of A, B, got 'x'"``.
    """
    if value not in choices:
        shown = ", ".join(str(c) for c in choices if c is not None)
        raise TxlError(f"{name} must be one of {shown}, got {value!r}")


def check_minimums(obj: Any, minimums: dict[str, Any], prefix: str = "", notes: dict[str, str] | None = None) -> None:
    """The one rule of a field's floor: each attribute of ``obj`` named in ``minimums`` (field -> smallest
    value), in order, must be at least its minimum; an unset (None) one is not checked. ``prefix`` comes
    before a field's name in the message (``"model."``), ``notes`` add a word after its floor
    (``{"clamp_len": " (0: no clamping)"}``).

    Raises:
        TxlError: ``"{prefix}{field} must be >= {minimum}{note}, got {value}"`` for the first field below.
    """
    for field, minimum in minimums.items():
        value = getattr(obj, field)
        if value is not None and not value >= minimum:  # (NaN is below every floor)
            raise TxlError(f"{prefix}{field} must be >= {minimum}{(notes or {}).get(field, '')}, got {value}")


def check_fields(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Check that ``values`` only names fields of dataclass ``cls`` and that each has the right type.

    Ints are accepted for float fields (converted); bools are not accepted for int fields, and NaN or
    infinite numbers are not accepted for float fields (one rule for every float field of every
    config). Lists are accepted for list/tuple fields. An optional field (``int | None``) takes null
    or a value of its type.

    Raises:
        TxlError: an unknown key (with the closest known key when one is near, and the list of known
            ones), a value of the wrong type or a non-finite number.
    """
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        hints = "".join(did_you_mean(key, known) for key in unknown[:1])
        raise TxlError(f"unknown key(s) {listed(unknown)} in {where}{hints}; known keys: {', '.join(known)}")
    out: dict[str, Any] = {}
    for key, value in values.items():
        out[key] = _coerce(hints[key], value, f"{where}.{key}")
    return out


_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}  # (as messages say them)


def _coerce(hint: Any, value: Any, name: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:  # Optional[X] and X | None
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, name)
            except TxlError as err:
                errors.append(str(err))
        kinds = [_KINDS.get(arg) for arg in args if arg is not type(None)]
        if len(kinds) > 1 and all(kinds):  # str | int: "must be a string or an integer"
            raise TxlError(f"{name} must be {' or '.join(kinds)}, got {value!r}")
        raise TxlError(errors[0] if errors else f"{name} may not be null")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TxlError(f"{name} must be a list, got {type(value).__name__} {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, f"{name}[{i}]") if inner is not Any else v for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise TxlError(f"{name} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TxlError(f"{name} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TxlError(f"{name} must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            number = math.inf
        if not math.isfinite(number):
            raise TxlError(f"{name} must be a finite number, got {value!r}")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise TxlError(f"{name} must be a string, got {value!r}")
        return value
    return value


HALF_DTYPES = ("bfloat16", "float16")


def check_weights_dtype(weights: str, dtype: str | None, weights_text: str | None = None,
                        dtype_text: str | None = None, advice: str | None = None) -> None:
    """Half-precision weights run under autocast only to their own dtype: ``bfloat16`` weights with a
    ``float16`` autocast (or the reverse) reach kernels that multiply one by the other, which none does
    (CPU: "mixed dtype"). ``weights`` and ``dtype`` are dtype names (``dtype`` None or float32: no
    autocast); ``weights_text``, ``dtype_text`` and ``advice`` word the message (a command's flags).

    Raises:
        TxlError: the pair cannot run, naming both and what to give instead.
    """
    if weights in HALF_DTYPES and dtype in HALF_DTYPES and dtype != weights:
        dtype_text = dtype_text or f"dtype {dtype}"
        raise TxlError(f"{weights_text or weights + ' weights'} cannot run with {dtype_text}: {weights} weights "
                       f"compute in {weights}; {advice or f'use dtype {weights} or float32'}")


def check_split(fractions: typing.Sequence[float], name: str, train_needed: bool = False) -> tuple[float, float, float]:
    """``fractions`` are train/valid/test fractions: three finite numbers >= 0 summing to 1 (within
    1e-6; and, with ``train_needed``, a train fraction > 0). The one check of split fractions: the
    config, the command line and the data layer (:func:`txl.data.corpus.split_tokens`) call it.

    Returns:
        The three fractions as floats.

    Raises:
        TxlError: naming ``name`` (``data.split``, ``--split``) and the values given.
    """
    try:
        values = list(fractions)
    except TypeError:  # not a sequence at all
        values = [fractions]
    number = [isinstance(f, numbers.Real) and not isinstance(f, bool) for f in values]
    good = len(values) == 3 and all(number) and all(math.isfinite(f) and f >= 0 for f in values)
    if not good or abs(sum(values) - 1) > 1e-6 or (train_needed and not values[0] > 0):
        shown = ",".join(f"{f:g}" if ok else repr(f) for f, ok in zip(values, number))
        raise TxlError(f"{name} must be three finite fractions >= 0 summing to 1 (train, valid, test"
                       f"{'; train > 0' if train_needed else ''}), got {shown}")
    return float(values[0]), float(values[1]), float(values[2])


def _named(field: str) -> str:
    return field


def _is_int(value) -> bool:
    """An integer: a Python, numpy or 0-d integer tensor one (``operator.index`` takes it), not a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _is_number(value) -> bool:
    """A real number: a Python, numpy or 0-d tensor one (``float`` takes it), not a bool or a string."""
    if isinstance(value, (bool, str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, named=_named) -> None:
    """Raise :class:`TxlError` for a temperature that is not a finite number >= 0, a top_k that is not an
    integer >= 1 or a top_p outside (0, 1]. ``named(field)`` gives the name a message uses for a
    field (the command line passes its flag's)."""
    if not _is_number(temperature) or not 0 <= temperature < float("inf"):  # also catches NaN
        raise TxlError(f"{named('temperature')} must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise TxlError(f"{named('top_k')} must be an integer >= 1, got {top_k!r}")
    if top_p is not None and (not _is_number(top_p) or not 0.0 < top_p <= 1.0):
        raise TxlError(f"{named('top_p')} must be in (0, 1], got {top_p!r}")


def check_decoding(repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_new_tokens: int = 0,
                   length_penalty: float = 1.0, named=_named) -> None:
    """Raise :class:`TxlError` for a repetition penalty that is not a finite number > 0, a
    ``no_repeat_ngram_size`` or ``min_new_tokens`` that is not an integer >= 0, or a beam-search
    ``length_penalty`` that is not a finite number (NaN would make every finished hypothesis score NaN,
    inf make them all 0 or inf). ``named(field)``: as in :func:`check_sampling`."""
    if not _is_number(repetition_penalty) or not 0 < repetition_penalty < float("inf"):
        raise TxlError(f"{named('repetition_penalty')} must be a finite number > 0 (1: none), got "
                       f"{repetition_penalty!r}")
    for field, value in (("no_repeat_ngram_size", no_repeat_ngram_size), ("min_new_tokens", min_new_tokens)):
        if not _is_int(value) or value < 0:
            raise TxlError(f"{named(field)} must be an integer >= 0{' (0: off)' * (field[0] == 'n')}, got {value!r}")
    if not _is_number(length_penalty) or not math.isfinite(length_penalty):
        raise TxlError(f"{named('length_penalty')} must be a finite number (1: log-prob per token), got "
                       f"{length_penalty!r}")


def check_dynamic(lr: float | None, decay: float, named=_named) -> None:
    """Raise :class:`TxlError` for dynamic evaluation's (Krause et al. 2018) step size ``lr`` that is not
    None (the command line's default) or a finite number >= 0, or a ``decay`` (the pull towards the
    trained weights) outside [0, 1). ``named(field)``: as in :func:`check_sampling`."""
    if lr is not None and (not _is_number(lr) or not 0 <= lr < float("inf")):
        raise TxlError(f"{named('lr')} must be a finite number >= 0, got {lr!r}")
    if not _is_number(decay) or not 0.0 <= decay < 1.0:
        raise TxlError(f"{named('decay')} must be in [0, 1), got {decay!r}")


#: Label of a position that is not scored (context, padding): the value data, model, training and
#: evaluation use (PyTorch's ``cross_entropy`` default ``ignore_index``).
IGNORE_INDEX = -100

TOKENIZERS = ("byte", "char", "word", "bpe")
NORMALIZE = ("none", "wikitext")
DTYPES = ("float32", "bfloat16", "float16")  # autocast dtypes (txl.runtime.autocast), named once here
# The files of a checkpoint folder (txl.fileio.model_files, txl.training.checkpoint), named once here so
# that torch-free code (the command line's early checks) can name them too
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.json"
RUN_NAME = "run.json"
STATE_NAME = "state.json"
CLASSIFIER_NAME = "classifier.json"  # written beside config.json by txl classify
CHECKPOINT_NAMES = ("best", "last")  # the checkpoints of a run a command can be told to use
CHECKSUMS_NAME = "checksums.json"  # sha256 of every other file of a checkpoint, written last
#: The fields of an attention span (txl.model.AttentionSpan) and of the command line's span flags.
SPAN_FIELDS = ("tgt_len", "mem_len", "clamp_len", "same_length", "cmem_len")
#: The smallest value of each integer span field (the span's rule and its flags').
SPAN_MINIMUM = {"tgt_len": 1, "mem_len": 0, "clamp_len": 0, "cmem_len": 0}
MAX_THREADS = 1024  # CPU threads (train.threads, --threads): more than this is taken for a typing error
# every seed (train.seed, each command's --seed) lies in [0, SEED_LIMIT): what all of python's, numpy's
# (np.random.seed: 32 bits) and torch's seeding accept
SEED_LIMIT = 2**32


def check_seed(value, name: str = "--seed") -> None:
    """The one rule of a seed (``--seed`` of every command, ``train.seed``, ``[classify] seed``): None (not
    given) or an integer in ``[0, SEED_LIMIT)``, what python's, numpy's and torch's seeding all accept.

    Raises:
        TxlError: naming ``name`` and the value.
    """
    if value is not None and not 0 <= value < SEED_LIMIT:
        raise TxlError(f"{name} must be in [0, 2**{SEED_LIMIT.bit_length() - 1}), got {value}")


def check_count(value, name: str, minimum: int = 0) -> None:
    """The rule of a count given to a library function (``max_tokens``, ``batch_size``, ``n_segments``): an
    integer (not a bool) of at least ``minimum``.

    Raises:
        TxlError: naming ``name`` and the value.
    """
    if not _is_int(value) or value < minimum:
        raise TxlError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_threads(value, name: str = "--threads") -> None:
    """The one rule of a thread count (``--threads`` of every command and of the export runner,
    ``train.threads``): None (not given) or an integer from 0 (automatic: the free CPUs) to
    :data:`MAX_THREADS`. Torch-free, so commands check it before loading anything.

    Raises:
        TxlError: naming ``name`` and the value.
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_THREADS):
        raise TxlError(f"{name} must be from 0 (automatic: the free CPUs) to {MAX_THREADS}, got {value!r}")
