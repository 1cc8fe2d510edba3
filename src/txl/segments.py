"""The segment loop of every reading function: read token rows segment by segment, carrying the memory (paper §3.2).

Evaluation, document scoring, dynamic evaluation, gradient statistics, attention maps, RECL's
exact-context windows, generation's prompt priming and the classifiers' reading of documents all read
text the same way: cut the rows into consecutive segments of ``span.tgt_len`` columns, run each with
the memory of the previous one, and carry the new memory on. :func:`segments` is that loop; callers
consume what it yields. State is explicit: the memory goes in (``mems``) and comes out with every
:class:`Segment`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from txl.errors import TxlError
from txl.model.decoding import DecodingState
from txl.model.memory import Mems
from txl.config import AttentionSpan
from txl.model.transformer import LMOutput
from txl.runtime import autocast


@dataclass
class Segment:
    """One segment read by :func:`segments`.

    Attributes:
        index: 0, 1, ... in reading order.
        start: column of the segment's first input in the given rows (tokens).
        rows: int64 [b] indices (into the given rows) of the rows in this segment, in order; rows
            whose ``lengths`` ended before ``start`` have left (with their rows of the memory).
        inputs: int64 [b, t] the segment's inputs, ``t <= span.tgt_len``.
        labels: int64 [b, t] its labels, or None when none were given.
        mems: the memory the segment was read with (``n_layer`` tensors [b, M, d_model]) or None.
        output: the model's :class:`~txl.model.LMOutput`; ``output.mems`` is the memory carried
            to the next segment (detached). Holds the autograd graph when read with ``grad=True``.
            Read with ``hidden=True``: only ``output.mems`` is set (no logits, no loss).
        hidden: float [b, t, d_model] the last layer's states when read with ``hidden=True``, else None.
    """

    index: int
    start: int
    rows: torch.Tensor
    inputs: torch.Tensor
    labels: torch.Tensor | None
    mems: Mems | None
    output: LMOutput
    hidden: torch.Tensor | None = None


def segments(model, inputs: torch.Tensor, labels: torch.Tensor | None = None, *, span: AttentionSpan,
             mems: Mems | None = None, lengths: torch.Tensor | list[int] | None = None, dtype: str = "float32",
             grad: bool = False, caches: DecodingState | None = None,
             positions: Sequence[tuple[int, int]] | None = None,
             grad_from: torch.Tensor | None = None, hidden: bool = False,
             same_layer: bool = False) -> Iterator[Segment]:
    """Read ``inputs`` in segments of ``span.tgt_len`` columns, carrying the memory; yield each :class:`Segment`.

    Segment k covers columns ``[k * tgt_len, (k + 1) * tgt_len)`` (the last may be shorter) and is
    read with the memory returned by segment k - 1 (``mems`` for k = 0), so every column is read
    exactly once, in order. The generator is lazy: segment k + 1 is computed only when asked for,
    after the caller has used segment k (e.g. back-propagated its loss and changed the weights).

    Args:
        model: a :class:`~txl.model.TransformerXLLM` (its mode is the caller's business).
        inputs: int64 [B, N] token ids, N >= 0 (N = 0 yields nothing), or a lazy array of them read by
            columns (:meth:`txl.data.LMOrderedIterator.streams`: a memory-mapped split stays on disk).
        labels: int64 [B, N] targets aligned with ``inputs`` (-100: not scored; or lazy), or None (no loss).
        span: the :class:`~txl.model.AttentionSpan` (``tgt_len`` cuts the segments; the rest goes
            to the model).
        mems: memory to start from (``n_layer`` tensors [B, M, d_model]) or None.
        lengths: int [B] number of real inputs per row (None: all N). A row leaves, with its rows
            of the memory, at the first segment starting at or after its length (document
            scoring: finished documents stop costing compute).
        dtype: "float32" or an autocast dtype ("bfloat16", "float16") for the forward passes.
        grad: forward passes with autograd (dynamic evaluation, gradient statistics), else under no_grad.
        caches: a :class:`~txl.model.DecodingState` passed to every forward (needs ``grad=False``):
            it then holds the memory (each segment's ``output.mems`` is None; read
            ``caches.mems()``) and keeps the memory's keys and values, so they are not re-projected.
        positions: ``(start, length)`` of each segment, in order, instead of the regular cut (e.g.
            :meth:`txl.data.LMOrderedIterator.positions`, whose warm-up context ends on a segment
            boundary); each length must be in ``[1, span.tgt_len]``.
        grad_from: with ``grad``, int64 [B]: row b is read with autograd from segment index
            ``grad_from[b]`` on (truncated back-propagation through time, as
            :class:`~txl.classification.ClassifierConfig`'s ``grad_segments``): earlier segments
            of the row run without a graph, the memory entering segment ``grad_from[b]`` is
            detached for that row, and from there on the memory keeps its graph, so a loss on a
            later segment back-propagates through the earlier ones of the window. A segment in which
            no row is inside its window runs under ``torch.no_grad``. None: every segment with
            autograd and the memory detached between segments (the paper's stop-gradient).
        hidden: yield the last layer's states (:attr:`Segment.hidden`, from
            :meth:`~txl.model.TransformerXLLM.hidden_states`) instead of the softmax's output, for
            heads other than the language model's (:mod:`txl.classification`); needs ``labels``
            and ``caches`` None.
        same_layer: with ``hidden``, each layer's memory is its own output (ERNIE-Doc's enhanced
            recurrence: :meth:`~txl.model.TransformerXLLM.hidden_states`) instead of its input.

    Yields :class:`Segment` objects, one per segment with at least one row.

    Raises:
        TxlError: inputs that are not [B, N], labels or lengths of another shape, a ``span``
            that is not an :class:`~txl.model.AttentionSpan`, ``hidden`` with labels or caches,
            ``same_layer`` without ``hidden``; and what the model raises.
    """
    _check_arguments(inputs, labels, span, caches, hidden, same_layer)
    n_rows, width = inputs.shape
    device = inputs.device
    rows = torch.arange(n_rows, device=device)
    # the loop decides on the host which rows still run and which need a graph: Python lists, read once
    # here when given as tensors, so that no segment waits for an accelerator to answer
    ends_host = _host_list(lengths, n_rows, "lengths")
    grad_from_host = _host_list(grad_from, n_rows, "grad_from")
    if grad_from is not None:
        grad_from = torch.tensor(grad_from_host, dtype=torch.int64, device=device)
    rows_host = list(range(n_rows))  # the rows still running, as ``rows`` on the device
    if positions is None:
        positions = [(start, min(span.tgt_len, width - start)) for start in range(0, width, span.tgt_len)]
    for index, (start, size) in enumerate(positions):
        if not 1 <= size <= span.tgt_len or start < 0 or start + size > width:
            raise TxlError(f"segment {index} at ({start}, {size}) does not fit rows of {width} tokens and "
                           f"tgt_len {span.tgt_len}")
        if ends_host is not None:
            kept = [i for i, r in enumerate(rows_host) if ends_host[r] > start]  # among the running rows
            if not kept:  # every row has ended
                return
            if len(kept) < len(rows_host):
                rows_host = [rows_host[i] for i in kept]
                rows, mems = _keep_rows(kept, rows, mems, caches)
        pick, cols = slice(None) if len(rows_host) == n_rows else rows, slice(start, start + size)  # (a view: all rows)
        x, y = inputs[pick, cols], None if labels is None else labels[pick, cols]
        keep_graph = grad
        if grad and grad_from is not None:
            window = grad_from[rows]
            keep_graph = any(grad_from_host[r] <= index for r in rows_host)
            if keep_graph and mems is not None:
                cut = (window >= index)[:, None, None]  # the memory entering the window's first segment
                mems = [torch.where(cut, m.detach(), m) for m in mems]
        detach = grad_from is None or not keep_graph  # else the memory keeps the window's graph
        states = None
        with torch.set_grad_enabled(keep_graph), autocast(device, dtype):
            if hidden:
                states, new_mems = model.hidden_states(x, mems, detach_mems=detach, span=span, same_layer=same_layer)
                out = LMOutput(logits=None, loss=None, mems=new_mems)
            elif detach:
                out = model(x, mems=mems, labels=y, caches=caches, span=span)
            else:
                out = model(x, mems=mems, labels=y, caches=caches, span=span, detach_mems=False)
        yield Segment(index=index, start=start, rows=rows, inputs=x, labels=y, mems=mems, output=out, hidden=states)
        mems = out.mems


def _check_arguments(inputs: torch.Tensor, labels: torch.Tensor | None, span: AttentionSpan,
                     caches: DecodingState | None, hidden: bool, same_layer: bool) -> None:
    """The checks of :func:`segments`' arguments (its Raises)."""
    if not isinstance(span, AttentionSpan):
        raise TxlError(f"span must be an AttentionSpan, got {type(span).__name__}")
    if inputs.dim() != 2:
        raise TxlError(f"inputs must be [rows, tokens], got shape {tuple(inputs.shape)}")
    if hidden and (labels is not None or caches is not None):
        raise TxlError("hidden=True reads states for another head: give no labels and no caches")
    if same_layer and not hidden:
        raise TxlError("same_layer (a memory of each layer's output) is a reading for another head: give hidden=True")
    if labels is not None and labels.shape != inputs.shape:
        raise TxlError(f"labels shape {tuple(labels.shape)} differs from inputs {tuple(inputs.shape)}")


def _host_list(values, n_rows: int, name: str) -> list[int] | None:
    """``values`` (a tensor on any device, or a sequence) [n_rows] as a Python list of ints; None for None.

    Raises:
        TxlError: another shape than [n_rows].
    """
    if values is None:
        return None
    host = torch.as_tensor(values, dtype=torch.int64).cpu()
    if host.shape != (n_rows,):
        raise TxlError(f"{name} must be [rows] = [{n_rows}], got shape {tuple(host.shape)}")
    return host.tolist()


def _keep_rows(kept: list[int], rows: torch.Tensor, mems: Mems | None,
               caches: DecodingState | None) -> tuple[torch.Tensor, Mems | None]:
    """The running rows' indices and memory after only the rows at positions ``kept`` stay (a decoding
    state drops the others' rows itself)."""
    index = torch.tensor(kept, dtype=torch.int64).to(rows.device)  # one copy each time rows leave
    if caches is not None and caches.length > 0:
        caches.reorder(index)
    return rows.index_select(0, index), None if mems is None else [m.index_select(0, index) for m in mems]


def decoding_state(model, span: AttentionSpan, max_tokens: int | None = None) -> DecodingState | None:
    """A fresh :class:`~txl.model.DecodingState` for reading without autograd with ``span``, or None for
    the vanilla model (``attn_type="abs"``, no memory).

    Passed as ``caches`` to :func:`segments`, it keeps the memory's keys, values and projected
    positions between segments instead of re-projecting them (the scores are the same; only the
    order of float additions inside the projections differs). Its hidden-state memory is not kept.
    ``max_tokens``: the columns that will be read, when known (the state then holds no more slots).
    """
    if not model.config.has_memory:
        return None
    return DecodingState(model.config.n_layer, span, keep_mems=False, max_tokens=max_tokens)


@contextlib.contextmanager
def eval_mode(model):
    """Put ``model`` in eval mode (no dropout) for a ``with`` block and restore its mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
