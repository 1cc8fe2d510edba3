"""Configuration fields shared by every config, and the data, training and evaluation sections of a run.

:func:`check_fields` checks the fields of every config: the model, run, classifier and conversion configs all
check their keys and value types through it. The sections here are plain dataclasses; a whole run
(these sections plus the model) is :class:`txl.training.config.RunConfig`.

The value checks that commands run before torch is imported live here too, torch-free: the split
fractions (:func:`check_split`) and the sampling and decoding settings (:func:`check_sampling`,
:func:`check_decoding`, which the generation functions run again for library callers).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from txl.errors import TxlError, listed

def did_you_mean(name: str, known: typing.Iterable[str]) -> str:
    """``" (did you mean X?)"`` (or ``X or Y``) for the known names closest to a misspelt ``name``, else ""."""
    close = difflib.get_close_matches(str(name), list(known), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


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


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise :class:`TxlError` for a temperature that is not a finite number >= 0, top_k < 1 or top_p
    outside (0, 1]."""
    if not temperature >= 0 or temperature == float("inf"):  # also catches NaN
        raise TxlError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise TxlError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise TxlError(f"top_p must be in (0, 1], got {top_p}")


def check_decoding(repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_new_tokens: int = 0,
                   length_penalty: float = 1.0) -> None:
    """Raise :class:`TxlError` for a repetition penalty that is not a finite number > 0, a negative
    ``no_repeat_ngram_size`` or ``min_new_tokens``, or a beam-search ``length_penalty`` that is not a
    finite number (NaN would make every finished hypothesis score NaN, inf make them all 0 or inf)."""
    if not 0 < repetition_penalty < float("inf"):
        raise TxlError(f"repetition_penalty must be a finite number > 0 (1: none), got {repetition_penalty}")
    if no_repeat_ngram_size < 0:
        raise TxlError(f"no_repeat_ngram_size must be >= 0 (0: off), got {no_repeat_ngram_size}")
    if min_new_tokens < 0:
        raise TxlError(f"min_new_tokens must be >= 0, got {min_new_tokens}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or \
            not math.isfinite(length_penalty):
        raise TxlError(f"length_penalty must be a finite number (1: log-prob per token), got {length_penalty!r}")


#: Label of a position that is not scored (context, padding): the value data, model, training and
#: evaluation use (PyTorch's ``cross_entropy`` default ``ignore_index``).
IGNORE_INDEX = -100

TOKENIZERS = ("byte", "char", "word", "bpe")
NORMALIZE = ("none", "wikitext")
DTYPES = ("float32", "bfloat16", "float16")  # autocast dtypes (txl.runtime.autocast), named once here
# The files of a checkpoint folder (txl.model.serialization, txl.training.checkpoint), named once here so
# that torch-free code (the command line's early checks) can name them too
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.json"
RUN_NAME = "run.json"
STATE_NAME = "state.json"
CLASSIFIER_NAME = "classifier.json"  # written beside config.json by txl classify
CHECKSUMS_NAME = "checksums.json"  # sha256 of every other file of a checkpoint, written last
#: The fields of an attention span (txl.model.AttentionSpan) and of the command line's span flags.
SPAN_FIELDS = ("tgt_len", "mem_len", "clamp_len", "same_length", "cmem_len")
MAX_THREADS = 1024  # CPU threads (train.threads, --threads): more than this is taken for a typing error
# every seed (train.seed, each command's --seed) lies in [0, SEED_LIMIT): what all of python's, numpy's
# (np.random.seed: 32 bits) and torch's seeding accept
SEED_LIMIT = 2**32


def check_threads(value, name: str = "--threads") -> None:
    """The one rule of a thread count (``--threads`` of every command and of the export runner,
    ``train.threads``): None (not given) or an integer from 0 (automatic: the free CPUs) to
    :data:`MAX_THREADS`. Torch-free, so commands check it before loading anything.

    Raises:
        TxlError: naming ``name`` and the value.
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_THREADS):
        raise TxlError(f"{name} must be from 0 (automatic: the free CPUs) to {MAX_THREADS}, got {value!r}")


@dataclass
class DataConfig:
    """Where the text comes from and how it is tokenised.

    Attributes:
        path: a text file or a directory of files (all files matching ``pattern``, sorted); None means
            the built-in default corpus (this Python's standard-library ``*.py`` modules).
        tokenizer: "byte" (vocab 256), "char" (vocab from the corpus), "word" (WikiText style) or
            "bpe" (byte-level BPE trained on the train split, ``max_size`` tokens); None means the
            tokenizer a prepared dataset folder recommends (its ``dataset.json``), else "byte".
        train, valid, test: separate split files; when given, ``path`` and ``split`` are not used.
        split: train/valid/test fractions of one corpus (contiguous, in order).
        pattern: glob for files inside a directory ``path``.
        min_freq, max_size, lower: word vocabulary options (``max_size`` is the BPE vocabulary size).
        normalize: "none", or "wikitext" to tokenise raw text the WikiText way (``1 @,@ 000``) first.
        cache_dir: where encoded corpora are cached (None: ``~/.cache/txl``).
    """

    path: str | None = None
    tokenizer: str | None = None
    train: str | None = None
    valid: str | None = None
    test: str | None = None
    split: list[float] = field(default_factory=lambda: [0.9, 0.05, 0.05])
    pattern: str = "*"
    min_freq: int = 1
    max_size: int | None = None
    lower: bool = False
    normalize: str = "none"
    cache_dir: str | None = None

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first value of a wrong type or impossible."""
        check_fields(type(self), dataclasses.asdict(self), "data")
        if self.normalize not in NORMALIZE:
            raise TxlError(f"data.normalize must be one of {', '.join(NORMALIZE)}, got {self.normalize!r}")
        if self.tokenizer is not None and self.tokenizer not in TOKENIZERS:
            raise TxlError(f"data.tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        check_split(self.split, "data.split")
        if self.min_freq < 1:
            raise TxlError(f"data.min_freq must be >= 1, got {self.min_freq}")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping of a training run.

    Attributes:
        out_dir: run directory (config, metrics.csv, ``best/`` and ``last/`` checkpoints).
        batch_size: parallel streams per step (the global batch: split over torchrun ranks).
        grad_accum_steps: each rank's streams are run in this many pieces per step, gradients
            accumulated (the reference's ``batch_chunk``): same update, less activation memory.
        max_steps: optimizer steps.
        lr, min_lr: peak and final learning rate (AdamW; linear warm-up then cosine decay).
        warmup_steps: steps of linear warm-up from 0 to ``lr``.
        weight_decay: AdamW decoupled weight decay on linear maps only (see txl.training.optim: not on
            biases, LayerNorm gains, u/v, Shaw tables, embeddings or output tables).
        clip: max global gradient norm (0 disables).
        tgt_len_schedule: progressive segment length, ``[[step, tgt_len], ...]`` or
            ``[[step, tgt_len, mem_len], ...]``; from each step on that length is used; with pairs,
            mem_len follows tgt_len. Empty: ``model.tgt_len``/``model.mem_len`` throughout.
        varlen: variable-length segments around tgt_len (reference's varlen iterator).
        eval_interval: steps between validations (with memory, at the training span).
        eval_max_tokens: tokens of the valid split used by periodic validation (0: all).
        log_interval: steps between metric rows.
        seed: seeds python, numpy and torch.
        device: "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
        threads: CPU threads for torch's operations in each process (``--threads``); 0: automatic,
            ``OMP_NUM_THREADS`` when set, else the CPUs this process may use less the busy ones
            (the load average), at least 1 (see :func:`txl.runtime.choose_threads`).
        dtype: "float32", or "bfloat16"/"float16" autocast.
        max_bad_steps: a step whose loss is NaN or inf is skipped (no update, fresh memory) and
            counted; this many in a row stop the run with a message.
        sample_tokens: tokens sampled at the end of training (0: none).
        sample_prompt: prompt for that sample ("": the first tokens of the valid split).
        save_interval: steps between ``last/`` checkpoints (0: at each validation only; every
            validation also writes one).
        keep_last: ``last`` checkpoints kept (``last/``, then ``last.<step>/``): a corrupt newest one
            falls back to the one before.
        deterministic: ``torch.use_deterministic_algorithms(True)`` (bit-identical reruns on GPU too,
            at some speed cost; CPU runs are deterministic at a given thread count).
        compile: run the training forward and backward through ``torch.compile`` (the language
            model traces as one graph, no break; the first steps of each segment shape pay the
            compilation). The same updates as eager up to float rounding; dropout draws its masks
            from the compiler's own generator, so a run with dropout is not the eager run's twin.
            docs/compile.md.
    """

    out_dir: str = "runs/default"
    batch_size: int = 16
    max_steps: int = 700
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 50
    weight_decay: float = 0.0
    clip: float = 0.25
    tgt_len_schedule: list[list[int]] = field(default_factory=list)
    varlen: bool = False
    eval_interval: int = 100
    eval_max_tokens: int = 32768
    log_interval: int = 10
    seed: int = 1234
    device: str = "auto"
    threads: int = 0
    dtype: str = "float32"
    max_bad_steps: int = 10
    sample_tokens: int = 300
    sample_prompt: str = ""
    grad_accum_steps: int = 1
    save_interval: int = 0
    keep_last: int = 2
    deterministic: bool = False
    compile: bool = False

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first value of a wrong type or impossible."""
        check_fields(type(self), dataclasses.asdict(self), "train")
        for name in ("batch_size", "max_steps", "eval_interval", "log_interval", "max_bad_steps", "grad_accum_steps",
                     "keep_last"):
            if getattr(self, name) < 1:
                raise TxlError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise TxlError(f"train.seed must be in [0, 2**32), got {self.seed}")  # 2**32: SEED_LIMIT
        if not math.isfinite(self.lr) or not math.isfinite(self.clip) or not math.isfinite(self.weight_decay):
            raise TxlError("train.lr, train.clip and train.weight_decay must be finite numbers")
        if not self.lr > 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise TxlError(f"train.lr must be > 0 and 0 <= train.min_lr <= train.lr, got lr={self.lr}, min_lr={self.min_lr}")
        for name in ("warmup_steps", "eval_max_tokens", "sample_tokens", "save_interval"):
            if getattr(self, name) < 0:
                raise TxlError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.clip < 0 or self.weight_decay < 0:
            raise TxlError("train.clip and train.weight_decay must be >= 0")
        if self.dtype not in DTYPES:
            raise TxlError(f"train.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_threads(self.threads, "train.threads")
        last = -1
        for entry in self.tgt_len_schedule:
            if len(entry) not in (2, 3) or entry[0] < 0 or any(v < 1 for v in entry[1:2]) or \
                    (len(entry) == 3 and entry[2] < 0):
                raise TxlError(f"train.tgt_len_schedule entries must be [step, tgt_len] or [step, tgt_len, mem_len] "
                               f"with step >= 0, tgt_len >= 1, mem_len >= 0; got {entry}")
            if entry[0] <= last:
                raise TxlError(f"train.tgt_len_schedule steps must increase, got {self.tgt_len_schedule}")
            last = entry[0]


@dataclass
class EvalConfig:
    """Evaluation settings, independent of training (the paper evaluates with a far longer memory).

    Attributes:
        split: "valid" or "test".
        batch_size: parallel streams.
        tgt_len, mem_len, clamp_len, same_length, cmem_len: attention span for evaluation (None: the
            model's; ``cmem_len``, the compressed-memory slots, needs a model trained with one).
        warmup: feed ``mem_len`` tokens before the first scored one so every scored token sees a full
            memory (those context tokens are not scored).
        max_tokens: score at most this many tokens (0: the whole split).
    """

    split: str = "valid"
    batch_size: int = 8
    tgt_len: int | None = None
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool | None = None
    cmem_len: int | None = None
    warmup: bool = False
    max_tokens: int = 0

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first value of a wrong type or impossible."""
        check_fields(type(self), dataclasses.asdict(self), "eval")
        if self.split not in ("valid", "test"):
            raise TxlError(f"eval.split must be 'valid' or 'test', got {self.split!r}")
        if self.batch_size < 1:
            raise TxlError(f"eval.batch_size must be >= 1, got {self.batch_size}")
        if self.tgt_len is not None and self.tgt_len < 1:
            raise TxlError(f"eval.tgt_len must be >= 1, got {self.tgt_len}")
        if self.mem_len is not None and self.mem_len < 0:
            raise TxlError(f"eval.mem_len must be >= 0, got {self.mem_len}")
        if self.cmem_len is not None and self.cmem_len < 0:
            raise TxlError(f"eval.cmem_len must be >= 0, got {self.cmem_len}")
        if self.clamp_len is not None and self.clamp_len < 0:
            raise TxlError(f"eval.clamp_len must be >= 0 (0: no clamping), got {self.clamp_len}")
        if self.max_tokens < 0:
            raise TxlError(f"eval.max_tokens must be >= 0, got {self.max_tokens}")
