"""Dynamic evaluation: adapt the weights to the evaluation text as it is read.

Krause et al. 2018 ("Dynamic Evaluation of Neural Sequence Models") and 2019 ("Dynamic Evaluation
of Transformer Language Models", where Transformer-XL reached 0.940 "bpc" on enwik8 (bits per byte:
enwik8 is scored byte by byte), 1.038 bpc on text8 and 16.4 perplexity on WikiText-103).

Protocol (one stream, batch size 1, memory carried as in :func:`txl.evaluation.stream.evaluate`): the text
is cut into consecutive segments s_1, s_2, ... of ``tgt_len`` targets. For each segment:

1. score it with the current weights theta_{i-1} and the memory of the previous segment (this loss
   is what is reported; the segment has not been trained on yet, so nothing is peeked at);
2. backpropagate that segment's mean loss (the memory is detached, so the gradient covers this
   segment only) and update the weights:

   * ``sgd``: ``theta_i = theta_{i-1} - lr * g + decay * (theta_g - theta_{i-1})``
   * ``rms``: ``theta_i = theta_{i-1} - lr * g / (sqrt(MS) + eps * mean(sqrt(MS)))
     + decay * min(RMS_norm, 1/decay) * (theta_g - theta_{i-1})`` with
     ``RMS_norm = sqrt(MS) / mean(sqrt(MS))`` (Krause et al. 2018, eq. 8-10: the decay towards the
     trained weights theta_g is stronger for parameters whose gradients are usually large). txl
     makes eps relative to the mean RMS gradient, so that parameters whose statistics are
     (nearly) zero, e.g. embeddings of characters absent from the statistics, do not take
     unbounded steps.

   MS is the mean squared gradient. By default (:func:`gradient_statistics`) it is collected on
   ``tgt_len`` segments of the *training* data with the trained weights, as in Krause et al.;
   without training statistics it is collected on the fly as the running mean of the squared
   gradients of the evaluation segments already scored (the current one included, after scoring).

The weights are restored when the evaluation ends. Dropout is off throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from txl.data import LMOrderedIterator
from txl.data.mapped import token_array
from txl.errors import TxlError
from txl.kernels.cpu import check_reading_fits
from txl.kernels.int8 import check_float_model
from txl.segments import eval_mode, segments
from txl.evaluation.stream import EvalResult, check_unit
from txl.config import AttentionSpan, check_choice, check_count, check_dynamic, resolve_span
from txl.runtime import progress_bar

METHODS = ("sgd", "rms")


@dataclass
class DynamicEvalResult(EvalResult):
    """:class:`~txl.evaluation.stream.EvalResult` of a dynamic evaluation.

    Extra attributes:
        segment_losses: mean loss (nats/token) of each segment, in text order, each computed before
            the weights were adapted on that segment.
        segment_tokens: number of scored targets per segment.
    """

    segment_losses: list[float] = field(default_factory=list)
    segment_tokens: list[int] = field(default_factory=list)


def _params(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def gradient_statistics(model, tokens: np.ndarray, *, tgt_len: int | None = None, mem_len: int | None = None,
                        n_segments: int = 100, span: AttentionSpan | None = None,
                        progress: bool | str = False) -> dict[str, torch.Tensor]:
    """Mean squared gradient ``MS = 1/N sum_k (grad L_k)^2`` per parameter over ``n_segments`` segments.

    Segments of ``tgt_len`` targets are read in order from ``tokens`` (typically the training
    split) with the memory carried, batch size 1, dropout off, as dynamic evaluation reads the test
    text (Krause et al. 2018, §5), through :func:`txl.segments.segments`. The weights
    are not changed. ``tgt_len``/``mem_len`` override the model's span (or ``span``); ``model.config``
    is not changed. ``progress`` (True or a label): a progress bar over the segments on stderr.

    Returns:
        ``{parameter name: float tensor shaped like the parameter}``.

    Raises:
        TxlError: ``tokens`` that is not 1-D integer ids in the vocabulary, fewer than 2 tokens or
            n_segments < 1; a model with int8 weights.
    """
    check_float_model(model, "gradient statistics")
    check_count(n_segments, "n_segments", 1)
    span = resolve_span(model.config, span, tgt_len=tgt_len, mem_len=mem_len)
    data = token_array(tokens, vocab_size=model.config.vocab_size, min_tokens=0, max_tokens=n_segments * span.tgt_len)
    if len(data) < 2:
        raise TxlError("gradient statistics need at least 2 tokens and n_segments >= 1")
    params = _params(model)
    sums = {n: torch.zeros_like(p) for n, p in params}
    count = 0
    x, y = LMOrderedIterator(data, 1, span.tgt_len, device=next(model.parameters()).device).streams()
    total = min(n_segments, -(-x.size(1) // span.tgt_len))
    with eval_mode(model), progress_bar(total, progress, "gradient statistics") as bar:
        model.zero_grad(set_to_none=True)
        try:
            check_reading_fits(model, x, span, grad=True)
            for seg in segments(model, x, y, span=span, grad=True):
                bar.update(1)
                seg.output.loss.backward()
                for n, p in params:
                    if p.grad is not None:
                        sums[n] += p.grad.detach() ** 2
                model.zero_grad(set_to_none=True)
                count += 1
                if count == n_segments:
                    break
        except TxlError as err:  # say which pass: the statistics read another text than the one scored
            raise TxlError(f"the gradient statistics over {len(data):,} tokens (the training split, or the "
                           f"given stats text): {err}") from None
    model.zero_grad(set_to_none=True)
    return {n: s / count for n, s in sums.items()}


def _check_settings(method: str, lr: float, decay: float) -> None:
    """Refuse an unknown ``method``, and an ``lr`` or ``decay`` :func:`~txl.config.check_dynamic` refuses
    (TxlError)."""
    check_choice(method, METHODS, "dynamic evaluation method")
    if lr is None:
        raise TxlError("dynamic evaluation needs a step size lr (a finite number >= 0), got None")
    check_dynamic(lr, decay)


def _check_stats(params: list[tuple[str, torch.nn.Parameter]], stats: dict[str, torch.Tensor] | None) -> None:
    """Refuse gradient statistics ``stats`` (None: none given) that lack one of ``params`` (TxlError)."""
    if stats is not None:
        missing = [n for n, _ in params if n not in stats]
        if missing:
            raise TxlError(f"gradient statistics lack parameter {missing[0]}")


def _segment_sum(seg) -> float:
    """The summed loss of segment ``seg`` (a :func:`~txl.segments.segments` item), scored before any
    update on it; TxlError when it is not finite (the updates diverged)."""
    seg_sum = float(seg.output.token_loss.detach().double().sum())
    if not np.isfinite(seg_sum):
        raise TxlError(f"dynamic evaluation diverged at segment {seg.index} (loss {seg_sum}); use a smaller lr")
    return seg_sum


def _update_online(params: list[tuple[str, torch.nn.Parameter]], online: dict[str, torch.Tensor], k: int) -> None:
    """Fold the squared gradients of ``params`` into ``online``, their running mean over segments 0..``k``."""
    for n, p in params:
        if p.grad is not None:
            online[n] += (p.grad ** 2 - online[n]) / (k + 1)  # running mean


def _adapt(params: list[tuple[str, torch.nn.Parameter]], trained: dict[str, torch.Tensor],
           ms: dict[str, torch.Tensor] | None, *, method: str, lr: float, decay: float, eps: float) -> None:
    """One update of ``params`` in place from their gradients (see the module docstring): a step of ``lr``
    (scaled by the mean squared gradients ``ms`` for "rms") and the pull of ``decay`` towards ``trained``."""
    if method == "rms":
        roots = {n: ms[n].to(p.device).sqrt() for n, p in params}
        mean_root = sum(float(r.sum()) for r in roots.values()) / sum(r.numel() for r in roots.values())
    for n, p in params:
        pull = trained[n] - p
        if method == "rms":
            if decay > 0:
                norm = roots[n] / mean_root if mean_root > 0 else torch.ones_like(p)
                pull = pull * (decay * norm).clamp(max=1.0)
            else:
                pull = torch.zeros_like(p)
            step = p.grad / (roots[n] + eps * mean_root + 1e-12) if p.grad is not None else torch.zeros_like(p)
        else:
            pull = pull * decay
            step = p.grad if p.grad is not None else torch.zeros_like(p)
        p.add_(step, alpha=-lr).add_(pull)


def _settings(model, span: AttentionSpan, *, method: str, lr: float, decay: float, online: bool) -> dict:
    """The ``settings`` of the result: the protocol, the update's settings (``online``: statistics
    collected on the fly) and the evaluation span of ``model``."""
    return {"protocol": f"dynamic-{method}", "lr": lr, "decay": decay,
            "stats": "online" if online else ("train" if method == "rms" else "none"),
            "tgt_len": span.tgt_len, "mem_len": span.mem_len if model.config.has_memory else 0,
            "clamp_len": span.clamp_len, "same_length": span.same_length, "batch_size": 1}


def _restore(model, params: list[tuple[str, torch.nn.Parameter]], trained: dict[str, torch.Tensor]) -> None:
    """Copy the ``trained`` weights back into ``params`` and clear the gradients of ``model``."""
    with torch.no_grad():
        for n, p in params:
            p.copy_(trained[n])
    model.zero_grad(set_to_none=True)


def dynamic_evaluate(model, tokens: np.ndarray, *, unit: str = "bpc", lr: float = 1e-4, decay: float = 0.0,
                     method: str = "rms", stats: dict[str, torch.Tensor] | None = None, eps: float = 0.1,
                     tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
                     same_length: bool | None = None, max_tokens: int = 0, dtype: str = "float32",
                     span: AttentionSpan | None = None, cmem_len: int | None = None,
                     progress: bool | str = False) -> DynamicEvalResult:
    """Score a token stream while adapting the weights to it (see the module docstring for the rules).

    Args:
        model: a :class:`~txl.model.TransformerXLLM`; its weights are restored on return.
        tokens: 1-D int array; the targets ``tokens[1:]`` are each scored exactly once.
        unit: "bpb", "bpc" or "ppl" for the headline number (see :func:`txl.evaluation.stream.metric_unit`).
        lr: step size (0 gives the static evaluation of the same segments exactly).
        decay: lambda, pull towards the trained weights per step (0: none; must be < 1).
        method: "sgd" or "rms".
        stats: mean squared gradients for "rms" (:func:`gradient_statistics`); None collects them
            on the fly from the evaluation segments already scored.
        eps: in "rms", ``eps * mean(sqrt(MS))`` is added to sqrt(MS) (a relative floor).
        tgt_len, mem_len, clamp_len, same_length, cmem_len: evaluation span (None: the model's own, or
            ``span``'s); ``model.config`` is not changed.
        span: an :class:`~txl.model.AttentionSpan` to start from (None: the model's training span).
        max_tokens: score only the first ``max_tokens`` targets (0: all).
        dtype: "float32" or an autocast dtype for the forward passes.
        progress: True (or a label): a progress bar over the segments on stderr; False: none.

    Returns:
        :class:`DynamicEvalResult`: mean loss in nats/token over all targets and per segment.

    Raises:
        TxlError: unknown method, negative lr, decay outside [0, 1), ``tokens`` that is not 1-D
            integer ids in the vocabulary, fewer than 2 tokens, stats
            missing a parameter, or a non-finite segment loss (the updates diverged: lower lr); a model
            with int8 weights.
    """
    check_float_model(model, "dynamic evaluation")
    _check_settings(method, lr, decay)
    check_count(max_tokens, "max_tokens")
    check_unit(unit)
    data = token_array(tokens, max_tokens=max_tokens, vocab_size=model.config.vocab_size)
    params = _params(model)
    _check_stats(params, stats)
    trained = {n: p.detach().clone() for n, p in params}
    online = {n: torch.zeros_like(p) for n, p in params} if method == "rms" and stats is None else None
    seg_losses, seg_tokens = [], []
    total = 0.0
    span = resolve_span(model.config, span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                        same_length=same_length, cmem_len=cmem_len)
    x, y = LMOrderedIterator(data, 1, span.tgt_len, device=next(model.parameters()).device).streams()
    try:
        with eval_mode(model), progress_bar(-(-x.size(1) // span.tgt_len), progress, "dynamic evaluation") as bar:
            model.zero_grad(set_to_none=True)
            check_reading_fits(model, x, span, grad=True, dtype=dtype)
            for seg in segments(model, x, y, span=span, dtype=dtype, grad=True):
                bar.update(1)
                seg_sum, n_seg = _segment_sum(seg), seg.inputs.size(1)
                total += seg_sum
                seg_losses.append(seg_sum / n_seg)
                seg_tokens.append(n_seg)
                if lr == 0 and decay == 0:
                    continue
                seg.output.loss.backward()
                with torch.no_grad():
                    if online is not None:
                        _update_online(params, online, seg.index)
                    _adapt(params, trained, stats if stats is not None else online, method=method, lr=lr,
                           decay=decay, eps=eps)
                model.zero_grad(set_to_none=True)
            settings = _settings(model, span, method=method, lr=lr, decay=decay, online=online is not None)
    finally:
        _restore(model, params, trained)
    n_tokens = sum(seg_tokens)
    return DynamicEvalResult(loss=total / n_tokens, n_tokens=n_tokens, unit=unit, settings=settings,
                             segment_losses=seg_losses, segment_tokens=seg_tokens)
