"""Evaluation: bits per byte / bits per character / perplexity with memory, and the vanilla sliding-window protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from txl.config import IGNORE_INDEX, check_compilable, check_count, resolve_span, AttentionSpan
from txl.data import LMOrderedIterator
from txl.data.mapped import PageBudget, token_array
from txl.errors import TxlError, quoted
from txl.segments import decoding_state, eval_mode, segments
from txl.runtime import autocast, check_fits, compile_module, progress_bar
from txl.kernels.cpu import check_reading_fits


@dataclass
class EvalResult:
    """Result of an evaluation.

    Attributes:
        loss: mean negative log-likelihood in nats per token.
        n_tokens: number of scored tokens.
        unit: "bpb" (byte models: bits per byte), "bpc" (char models: bits per character), both
            loss / ln 2, or "ppl" (word and BPE models: exp(loss)); see :func:`metric_unit`.
        settings: the attention span / protocol used, for reporting.
    """

    loss: float
    n_tokens: int
    unit: str
    settings: dict

    @property
    def value(self) -> float:
        """The headline number in :attr:`unit` (bits per byte, bits per character or perplexity)."""
        return metric_value(self.loss, self.unit)

    def __str__(self) -> str:
        spans = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{self.unit} {self.value:.4f} (loss {self.loss:.4f} nats/token over {self.n_tokens:,} tokens; {spans})"


UNITS = ("bpb", "bpc", "ppl", "nats")
"""The headline units: bits per byte (byte models), bits per character (char models), perplexity, and
nats per document (the cross-entropy of a classifier, :mod:`txl_recipes.classify.task`)."""

UNIT_NAMES = {"bpb": "bits per byte", "bpc": "bits per character", "ppl": "perplexity", "nats": "nats per document"}


def metric_unit(tokenizer_kind: str) -> str:
    """The headline unit of a tokenizer kind: "bpb" for byte models (bits per byte), "bpc" for char
    models (bits per character), "ppl" (perplexity per token) for word and BPE models.

    Byte and char models both report loss / ln 2 per token; the label says what a token is. (The
    literature's enwik8 "bpc" is bits per byte: enwik8 is scored byte by byte.)
    """
    if tokenizer_kind == "byte":
        return "bpb"
    return "bpc" if tokenizer_kind == "char" else "ppl"


def stored_unit(unit: str | None, tokenizer_kind: str | None = None) -> str | None:
    """The unit of a metric read from a file (``state.json``, ``metrics.csv``, results JSON).

    A byte model's file may label its metric "bpc"; with the run's ``tokenizer_kind`` known, such a
    "bpc" is read as "bpb" (the number is bits per byte). Other known units are returned as they are;
    anything else gives None.
    """
    if unit not in UNITS:
        return None
    if unit == "bpc" and tokenizer_kind == "byte":
        return "bpb"
    return unit


def check_unit(unit: str) -> None:
    """Raise :class:`TxlError` unless ``unit`` is one of :data:`UNITS` (a misspelt "PPL" would be read as bits)."""
    if unit not in UNITS:
        raise TxlError(f"unit must be one of {', '.join(UNITS)} (metric_unit(tokenizer.kind) gives the usual one), "
                       f"got {quoted(unit)}")


def metric_value(loss: float, unit: str) -> float:
    """Convert a loss in nats/token to the headline number: bits per token for ``"bpb"`` and ``"bpc"``
    (loss / ln 2, per byte or per character), perplexity exp(loss) for ``"ppl"``, the loss itself for
    ``"nats"``.

    Raises:
        TxlError: another unit (:func:`check_unit`).
    """
    check_unit(unit)
    if unit == "nats":
        return loss
    return math.exp(min(loss, 50.0)) if unit == "ppl" else loss / math.log(2)


def _wide(logits: torch.Tensor) -> torch.Tensor:
    """Logits in at least float32 (bf16/fp16 are widened; float64 stays float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


@torch.no_grad()
def evaluate(model, tokens: np.ndarray, *, unit: str = "bpc", batch_size: int = 8, tgt_len: int | None = None,
             mem_len: int | None = None, clamp_len: int | None = None, same_length: bool | None = None,
             warmup: bool = False, max_tokens: int = 0, dtype: str = "float32", dist=None,
             span: AttentionSpan | None = None, cmem_len: int | None = None,
             progress: bool | str = False, compiled: bool = False) -> EvalResult:
    """Score a token stream segment by segment, carrying the memory (paper §3.2 evaluation).

    The streams are read with :func:`txl.segments.segments`, in eval mode (the model's
    mode is restored afterwards).

    Args:
        model: a :class:`~txl.model.TransformerXLLM`.
        tokens: 1-D token array (a whole split; a ``np.memmap`` is read segment by segment, never
            copied whole); scored in ``batch_size`` parallel streams (at most one per target: more
            would only add streams of padding).
        unit: "bpb", "bpc", "ppl" or "nats" (see :func:`metric_unit`; another: TxlError).
        tgt_len, mem_len, clamp_len, same_length, cmem_len: evaluation span (None: the model's own,
            or ``span``'s); ``model.config`` is not changed. ``cmem_len`` (compressed-memory slots)
            needs a model trained with a compressed memory.
        span: an :class:`~txl.model.AttentionSpan` to start from (None: the model's training span).
        warmup: feed ``mem_len`` context tokens first so every scored token sees a full memory.
        max_tokens: score only the first ``max_tokens`` targets (0: all).
        dtype: "float32" or an autocast dtype.
        dist: a :class:`txl.distributed.Dist`: each rank scores its block of the streams
            and the sums are added over ranks, so every rank gets the single-process result.
        progress: True (or a label such as ``"mem_len 256"``): a progress bar over the segments
            on stderr (:func:`txl.runtime.progress_bar`); False: none.
        compiled: read the segments with ``torch.compile(model)`` (one graph per segment shape), the
            memory carried as hidden states instead of a decoding state's keys and values (whose
            bookkeeping runs on the host); the same result up to float rounding (docs/compile.md).
            Not for a compressed memory or an adaptive softmax (TxlError); int8 weights compile.

    Returns:
        :class:`EvalResult` (loss in nats/token). Every target token is scored exactly once.

    Raises:
        TxlError: ``tokens`` that is not 1-D integer data or holds ids outside the vocabulary, a split
            too short for one target (plus the warm-up context), or an impossible span; ``compiled``
            with a model it does not serve yet (compressed memory, adaptive softmax).
    """
    if compiled:
        check_compilable(model.config, "--compile")
    check_unit(unit)
    check_count(batch_size, "batch_size", 1)
    check_count(max_tokens, "max_tokens")
    device = next(model.parameters()).device
    span = resolve_span(model.config, span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                        same_length=same_length, cmem_len=cmem_len)
    has_memory = model.config.has_memory
    context = span.mem_len if warmup and has_memory else 0
    # only what is read is checked (the iterator says whether there is enough)
    tokens = token_array(tokens, vocab_size=model.config.vocab_size, min_tokens=0,
                         max_tokens=max_tokens + context if max_tokens else 0)
    # streams beyond one per target would hold padding only: same result, without their memory
    batch_size = max(1, min(int(batch_size), len(tokens) - 1 - context))
    batches = LMOrderedIterator(tokens, batch_size, span.tgt_len, context=context, device=device)
    inputs, labels = batches.streams(dist.rows(batch_size) if dist is not None else slice(None))  # read per segment
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, targets
    if inputs.size(0):  # more ranks than streams: this rank has none
        positions = batches.positions()
        reader = compile_module(model) if compiled else model
        state = None if compiled else decoding_state(model, span, max_tokens=inputs.size(1))
        if state is not None:
            need = state.nbytes(model.config, inputs.size(0), next(model.parameters()).element_size(), device)
            check_fits(need, f"a decoding state with mem_len {span.mem_len:,}", "use a smaller --mem-len or batch", device)
        check_reading_fits(model, inputs, span, positions=positions, dtype=dtype)
        with eval_mode(model), progress_bar(len(positions), progress, "evaluating") as bar:
            for seg in segments(reader, inputs, labels, span=span, dtype=dtype, positions=positions, caches=state):
                sums[0] += seg.output.token_loss.double().sum()
                sums[1] += (seg.labels != IGNORE_INDEX).sum()
                bar.update(1)
    if dist is not None:
        from txl.distributed import all_sum

        all_sum(dist, sums)
    total, count = sums.tolist()
    count = int(count)
    settings = {"tgt_len": span.tgt_len, "mem_len": span.mem_len if has_memory else 0,
                "clamp_len": span.clamp_len, "same_length": span.same_length, "warmup": warmup}
    if span.cmem_len:
        settings["cmem_len"] = span.cmem_len
    return EvalResult(loss=total / count, n_tokens=count, unit=unit, settings=settings)


@torch.no_grad()
def evaluate_sliding_window(model, tokens: np.ndarray, *, context: int, stride: int = 1, unit: str = "bpc",
                            batch_size: int = 32, max_tokens: int = 0, dtype: str = "float32",
                            progress: bool | str = False) -> EvalResult:
    """The vanilla Transformer protocol: recompute a window of ``context`` tokens for every ``stride`` targets.

    The first window scores all of its targets; each later window ends ``stride`` tokens further and
    scores only its last ``stride`` targets, each predicted from up to ``context`` tokens. ``stride=1``
    is the paper's one prediction per window (Table 9). No memory is used.

    Args:
        tokens: 1-D token array; ``context`` >= 1 and 1 <= ``stride`` <= ``context``.
        max_tokens: score only the first ``max_tokens`` targets (0: all).
        progress: True (or a label): a progress bar over the windows on stderr; False: none.

    Returns:
        :class:`EvalResult`; every target is scored exactly once.

    Raises:
        TxlError: bad context/stride, ``tokens`` that is not 1-D integer data or holds ids outside
            the vocabulary, or a split shorter than two tokens.
    """
    for value, name, least in ((context, "context", 1), (stride, "stride", 1), (batch_size, "batch_size", 1),
                               (max_tokens, "max_tokens", 0)):
        check_count(value, name, least)
    check_unit(unit)
    if not stride <= context:
        raise TxlError(f"sliding window needs 1 <= stride <= context, got stride {stride} and context {context}")
    data = token_array(tokens, max_tokens=max_tokens, vocab_size=model.config.vocab_size)
    pages = PageBudget(data)
    device = next(model.parameters()).device

    def ids(start: int, stop: int) -> torch.Tensor:  # tokens [start, stop) as int64 on the model's device
        pages.read(stop - start)
        return torch.from_numpy(data[start:stop].astype(np.int64)).to(device)
    n_targets = len(data) - 1
    first = min(context, n_targets)
    ends = list(range(first + stride, n_targets + stride, stride))  # window end (exclusive, input index)
    window = resolve_span(model.config, tgt_len=context, mem_len=0, cmem_len=0)  # windows carry no memory
    with eval_mode(model), torch.no_grad(), progress_bar(1 + len(ends), progress, "evaluating", "window") as bar:
        with autocast(device, dtype):
            logits = _wide(model(ids(0, first)[None], span=window).logits)
        total = float(F.cross_entropy(logits[0], ids(1, first + 1), reduction="sum"))
        count, prev = first, first
        bar.update(1)
        for i in range(0, len(ends), batch_size):
            chunk = [min(e, n_targets) for e in ends[i:i + batch_size]]
            x = torch.stack([ids(e - context, e) for e in chunk])
            with autocast(device, dtype):
                logits = _wide(model(x, span=window).logits)
            for row, e in enumerate(chunk):
                k = e - prev  # new targets in this window: data[prev+1 .. e]
                total += float(F.cross_entropy(logits[row, -k:], ids(prev + 1, e + 1), reduction="sum"))
                count += k
                prev = e
            bar.update(len(chunk))
    return EvalResult(loss=total / count, n_tokens=count, unit=unit,
                      settings={"protocol": "sliding-window", "context": context, "stride": stride})
