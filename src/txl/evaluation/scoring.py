"""Scoring documents: per-token and per-document log-probabilities with segment-level memory.

A document of n tokens x_0 .. x_{n-1} is read segment by segment (``tgt_len`` tokens at a time)
with the memory carried through it (paper §3.2, the evaluation procedure), and every token is
scored from everything before it: log p(x_t | x_<t) for t = 1 .. n-1, in nats.

**The first token is not scored.** The model predicts token t+1 from tokens <= t and has no
begin-of-document token, so p(x_0) is not something it defines. A document of n tokens therefore
has n - 1 scored tokens, exactly as training and :func:`txl.evaluation.stream.evaluate` count targets.
With ``carry_memory=True`` the documents form one continuous stream: the first token of every
document after the first is scored from the previous documents (only the stream's first token is
not scored).

Batching (``carry_memory=False``): documents are sorted by length and up to ``batch_size`` of them
are placed side by side, right-padded, with fresh memory per batch. Attention is causal, so the
padding after a document never reaches its real tokens; finished rows leave the batch (with their
rows of the memory). A document's scores do not depend on the other documents (up to float
rounding of batched kernels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from txl.config import resolve_span, AttentionSpan
from txl.data.pairs import pair_batch
from txl.errors import TxlError
from txl.segments import decoding_state, eval_mode, segments
from txl.runtime import check_fits
from txl.evaluation.stream import metric_value
from txl.kernels.cpu import check_reading_fits

__all__ = ["DocumentScore", "score", "score_tokens", "score_texts", "token_text", "total_metric"]


@dataclass
class DocumentScore:
    """Scores of one document.

    Attributes:
        tokens: int64 [n] the document's token ids.
        logprobs: float64 [n] log p(tokens[t] | everything before it) in nats; NaN where a token is
            not scored (position 0, unless the memory was carried in from a previous document).
    """

    tokens: np.ndarray
    logprobs: np.ndarray

    @property
    def n_tokens(self) -> int:
        """Number of tokens in the document."""
        return int(self.tokens.size)

    @property
    def scored(self) -> np.ndarray:
        """bool [n]: True where the token was scored."""
        return ~np.isnan(self.logprobs)

    @property
    def n_scored(self) -> int:
        """Number of scored tokens (n - 1, or n with carried memory)."""
        return int(self.scored.sum())

    @property
    def total(self) -> float:
        """Sum of the scored log-probabilities in nats (<= 0): log p(document | first token)."""
        return float(self.logprobs[self.scored].sum())

    @property
    def loss(self) -> float:
        """Mean negative log-likelihood in nats per scored token (NaN when no token is scored)."""
        return -self.total / self.n_scored if self.n_scored else math.nan

    @property
    def bits_per_token(self) -> float:
        """loss / ln 2: bits per byte (bpb) for byte tokenizers, bits per character (bpc) for char
        tokenizers, bits per token otherwise."""
        return self.loss / math.log(2)

    @property
    def perplexity(self) -> float:
        """exp(loss), per token (the metric of word and BPE models)."""
        return metric_value(self.loss, "ppl")

    def metric(self, unit: str) -> float:
        """The document's bits per byte (``unit="bpb"``), bits per character (``"bpc"``) or perplexity
        (``"ppl"``); see :func:`txl.evaluation.stream.metric_unit`."""
        return metric_value(self.loss, unit)


def total_metric(scores: Sequence[DocumentScore], unit: str) -> tuple[float, int]:
    """(bpb, bpc or perplexity over all scored tokens of ``scores``, number of scored tokens).

    Tokens are pooled (not documents averaged): the value is ``metric(-sum(totals) / sum(n_scored))``.
    """
    count = sum(s.n_scored for s in scores)
    total = sum(s.total for s in scores)
    return (metric_value(-total / count, unit) if count else math.nan), count


def _as_ids(doc: Any, index: int) -> np.ndarray:
    """One document as a 1-D int64 array (list, ndarray or tensor)."""
    if hasattr(doc, "detach"):
        doc = doc.detach().cpu().numpy()
    arr = np.asarray(doc)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TxlError(f"document {index} must be a 1-D sequence of integer token ids, got shape {arr.shape} "
                       f"dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


@torch.no_grad()
def _score_rows(model, rows: list[np.ndarray], span: AttentionSpan, dtype: str) -> list[np.ndarray]:
    """Score rows (inputs+1 tokens each, sorted by length) side by side with :func:`segments`; fresh memory.

    A row leaves the batch (with its rows of the memory) once its inputs are all read.

    Returns, per row, float64 [len - 1]: log p(row[t+1] | row[<=t]) in nats.
    """
    device = next(model.parameters()).device
    n_in = [len(r) - 1 for r in rows]
    if any(a > b for a, b in zip(n_in, n_in[1:])):
        raise AssertionError("rows must be sorted by length")
    width = n_in[-1]
    inputs, labels = pair_batch([(row, 1) for row in rows], device)  # pad id 0: never reaches real tokens
    out_lp = np.zeros((len(rows), width), dtype=np.float64)
    state = decoding_state(model, span, max_tokens=width)
    if state is not None:
        need = state.nbytes(model.config, len(rows), next(model.parameters()).element_size(), device)
        check_fits(need, f"a decoding state with mem_len {span.mem_len:,}", "use a smaller --mem-len or batch", device)
    check_reading_fits(model, inputs, span, dtype=dtype)
    for seg in segments(model, inputs, labels, span=span, lengths=n_in, dtype=dtype, caches=state):
        cols = slice(seg.start, seg.start + seg.inputs.size(1))
        out_lp[seg.rows.cpu().numpy(), cols] = -seg.output.token_loss.detach().to(torch.float64).cpu().numpy()
    result = [out_lp[r, :n_in[r]] for r in range(len(rows))]
    if not all(np.isfinite(lp).all() for lp in result):
        raise TxlError("the model produced non-finite log-probabilities (NaN or inf): its weights are broken, or "
                       "float16 overflowed (try dtype float32)")
    return result


def score_tokens(model, documents: Sequence[Any], *, batch_size: int = 8, tgt_len: int | None = None,
                 mem_len: int | None = None, clamp_len: int | None = None, same_length: bool | None = None,
                 carry_memory: bool = False, dtype: str = "float32",
                 span: AttentionSpan | None = None, cmem_len: int | None = None) -> list[DocumentScore]:
    """Per-token log-probabilities of token-id documents, with memory through each document.

    See the module docstring for the first-token policy and batching. Equals one long causal pass
    over a document when ``mem_len`` >= its length (and ``same_length``/``clamp_len`` are off), and
    :func:`txl.evaluation.stream.evaluate` with ``batch_size=1`` on the document for any span.

    Args:
        model: a :class:`~txl.model.TransformerXLLM` (put in eval mode during the call, then restored).
        documents: sequence of 1-D integer token-id arrays/lists/tensors, ids in ``[0, vocab_size)``.
        batch_size: documents scored side by side (ignored with ``carry_memory``: one stream).
        tgt_len, mem_len, clamp_len, same_length, cmem_len: attention span (None: the model's own,
            or ``span``'s); ``model.config`` is not changed.
        span: an :class:`~txl.model.AttentionSpan` to start from (None: the model's training span).
        carry_memory: treat the documents as one continuous stream (memory and context carry over).
        dtype: "float32", or "bfloat16"/"float16" autocast.

    Returns:
        One :class:`DocumentScore` per document, in input order; log-probs in nats (float64).

    Raises:
        TxlError: no documents, a document that is not 1-D integer data, a document with fewer
            than 2 tokens (fewer than 1 with ``carry_memory``, and 2 in all), bad ``batch_size``
            or span, ids outside the vocabulary, non-finite scores.
    """
    if batch_size < 1:
        raise TxlError(f"batch_size must be >= 1, got {batch_size}")
    docs = [_as_ids(d, i) for i, d in enumerate(documents)]
    if not docs:
        raise TxlError("no documents to score")
    need = 1 if carry_memory else 2
    vocab = model.config.vocab_size
    for i, d in enumerate(docs):
        if d.size and (d.min() < 0 or d.max() >= vocab):
            raise TxlError(f"document {i} has token id {d.min() if d.min() < 0 else d.max()} outside the "
                           f"vocabulary [0, {vocab})")
        if d.size < need:
            raise TxlError(f"document {i} has {d.size} token(s); scoring needs at least {need} (the first token of "
                           "a document has no context and is not scored)")
    span = resolve_span(model.config, span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                        same_length=same_length, cmem_len=cmem_len)
    with eval_mode(model):
        if carry_memory:
            stream = np.concatenate(docs)
            if stream.size < 2:
                raise TxlError("the documents hold 1 token in all; scoring needs at least 2")
            (lp,) = _score_rows(model, [stream], span, dtype)
            full = np.concatenate([[np.nan], lp])
            ends = np.cumsum([d.size for d in docs])
            return [DocumentScore(d, full[e - d.size:e]) for d, e in zip(docs, ends)]
        order = sorted(range(len(docs)), key=lambda i: docs[i].size)
        results: list[DocumentScore | None] = [None] * len(docs)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            for i, lp in zip(idx, _score_rows(model, [docs[i] for i in idx], span, dtype)):
                results[i] = DocumentScore(docs[i], np.concatenate([[np.nan], lp]))
    return results  # type: ignore[return-value]


def score_texts(model, tokenizer, texts: Sequence[str], **options: Any) -> list[DocumentScore]:
    """Encode ``texts`` with ``tokenizer`` and :func:`score_tokens` them (same options).

    Raises:
        TxlError: see :func:`score_tokens`; also text the tokenizer cannot encode (e.g. characters
            outside a char vocabulary).
    """
    if isinstance(texts, str):
        raise TxlError("score_texts takes a list of texts (one per document), not a single string")
    texts = list(texts)  # (an iterator is read once)
    mixed = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if mixed is not None:
        raise TxlError(f"documents must be all texts or all token-id sequences: document {mixed} is a "
                       f"{type(texts[mixed]).__name__} among texts")
    return score_tokens(model, [tokenizer.encode(t) for t in texts], **options)


def token_text(tokenizer, token_id: int) -> str:
    """Printable text of one token for per-token output.

    Byte tokens: the character for printable ASCII (0x20-0x7e), else ``\\xNN`` (a lone byte of a
    multi-byte character is not text). Word tokens: the vocabulary entry (``<eos>`` for a line end).
    Char and BPE tokens: the decoded text (a BPE token that splits a character shows U+FFFD).
    """
    kind = tokenizer.kind
    if kind == "byte":
        return chr(token_id) if 0x20 <= token_id < 0x7F else f"\\x{token_id:02x}"
    if kind == "word":
        return tokenizer.words[token_id]
    return tokenizer.decode([token_id])


def score(model, documents: Sequence[Any], tokenizer: Any = None, **options: Any) -> list[DocumentScore]:
    """Per-token log-probabilities (nats) of documents, with memory through each document.

    Args:
        model: a :class:`~txl.model.TransformerXLLM`.
        documents: texts (with ``tokenizer``, e.g. a checkpoint's) or 1-D token-id sequences.
        tokenizer: turns texts into ids; not needed for token ids.
        options: batch_size, tgt_len, mem_len, clamp_len, same_length, carry_memory, dtype, span
            (see :func:`score_tokens`).

    Returns:
        one :class:`DocumentScore` per document, in order.

    Raises:
        TxlError: texts without a tokenizer, or see :func:`score_tokens`.
    """
    if isinstance(documents, str) or (len(documents) and isinstance(documents[0], str)):
        if tokenizer is None:
            raise TxlError("scoring text needs a tokenizer: pass tokenizer= (e.g. load_checkpoint(...).tokenizer)")
        return score_texts(model, tokenizer, documents, **options)
    return score_tokens(model, documents, **options)
