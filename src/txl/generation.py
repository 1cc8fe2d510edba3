"""Token-by-token sampling that reuses the Transformer-XL memory instead of recomputing the context."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from txl.errors import TxlError
from txl.evaluation.segments import eval_mode, segments
from txl.model.decoding import DecodingState
from txl.model.inputs import check_input_ids
from txl.model.memory import Mems
from txl.model.span import AttentionSpan, resolve_span


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise :class:`TxlError` for temperature < 0, top_k < 1 or top_p outside (0, 1]."""
    if not temperature >= 0 or temperature == float("inf"):  # also catches NaN
        raise TxlError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise TxlError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise TxlError(f"top_p must be in (0, 1], got {top_p}")


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from ``logits`` [B, V] (float). Returns int64 [B].

    ``temperature == 0`` picks the arg-max (greedy). ``top_k`` keeps the k most likely tokens;
    ``top_p`` keeps the smallest set whose probability reaches p (nucleus sampling, at least one token).

    Raises:
        TxlError: temperature < 0, top_k < 1 or top_p outside (0, 1].
    """
    check_sampling(temperature, top_k, top_p)
    if not bool(torch.isfinite(logits).all()):
        raise TxlError("the model produced non-finite scores (NaN or inf): its weights are broken, e.g. by a "
                       "diverged training run; use an earlier checkpoint")
    if temperature == 0:
        return logits.argmax(dim=-1)
    # float64 and shifted so that the best score is 0: dividing by any temperature > 0 then gives
    # scores <= 0 (-inf at worst for a tiny temperature), never inf or NaN, and the limit T -> 0 is greedy
    logits = logits.double()
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False  # the most likely token always stays, however small top_p is
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def prime_memory(model, input_ids: torch.Tensor, mems: Mems | None = None,
                 caches: DecodingState | None = None, *, span: AttentionSpan | None = None) -> Mems | None:
    """Feed ``input_ids`` (int64 [B, T], T >= 0) through the model in segments of ``span.tgt_len`` and
    return the memory (``n_layer`` tensors [B, <= mem_len, d_model]; ``mems`` itself when T = 0).

    The segments go through :func:`txl.evaluation.segments.segments` (paper §3.2 recurrence). With
    ``caches`` (a :class:`~txl.model.DecodingState`, whose span is then used) the state is filled
    instead and holds the memory: the return value is None once a segment was read. ``span`` None:
    the model's training span.
    """
    span = caches.span if caches is not None else resolve_span(model.config, span)
    for seg in segments(model, input_ids, span=span, mems=mems, caches=caches):
        mems = seg.output.mems
    return mems


@dataclass
class GenerationStep:
    """One step of :func:`generate_steps`.

    Attributes:
        token: int64 [B] the sampled token of each row.
        logprob: float64 [B] its log-probability in nats under the model's distribution (temperature
            1, before top-k/top-p), log p(token | everything before it).
    """

    token: torch.Tensor
    logprob: torch.Tensor


@torch.no_grad()
def generate_stream(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
                    generator: torch.Generator | None = None, *, span: AttentionSpan | None = None,
                    tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
                    same_length: bool | None = None) -> Iterator[torch.Tensor]:
    """Yield ``max_new_tokens`` sampled tokens (int64 [B] each): the tokens of :func:`generate_steps`
    (same arguments, same errors).
    """
    for step in generate_steps(model, input_ids, max_new_tokens, temperature, top_k, top_p, mems, generator,
                               span=span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                               same_length=same_length):
        yield step.token


@torch.no_grad()
def generate_steps(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
                   generator: torch.Generator | None = None, *, span: AttentionSpan | None = None,
                   tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
                   same_length: bool | None = None) -> Iterator[GenerationStep]:
    """Yield ``max_new_tokens`` :class:`GenerationStep` objects (the sampled token [B] and its
    log-probability), one forward of one token per step.

    For ``attn_type`` "rel" and "shaw" the prompt (all but its last token) is fed once in chunks of ``tgt_len`` to
    build the memory; then each step feeds only the newest token with the memory (cost per token grows
    with ``mem_len``, not with the length of the text). ``attn_type="abs"`` has no memory: each step
    recomputes a sliding window of the last ``tgt_len`` tokens (the vanilla protocol).
    The model is put in eval mode for the duration and restored afterwards.

    ``span`` (None: the model's training span) with ``tgt_len``, ``mem_len``, ``clamp_len``,
    ``same_length`` overriding its fields (None keeps one) sets the priming segment length and the
    memory kept while sampling (e.g. a longer memory than in training, paper §3.2). ``model.config``
    is not changed.

    Raises:
        TxlError: ``input_ids`` that is not a non-empty integer tensor [batch, length] of ids in the
            vocabulary on the model's device (a Python list, an empty batch or prompt), ``mems`` of
            another shape, dtype or device than the model's (see :meth:`~txl.model.TransformerXLLM.forward`),
            bad sampling settings or an impossible span.
    """
    check_input_ids(input_ids, model.config.vocab_size, next(model.parameters()).device)
    if model.config.attn_type == "abs" and mems is not None:
        raise TxlError("attn_type='abs' (vanilla Transformer) has no memory: pass mems=None")
    if max_new_tokens < 0:
        raise TxlError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    span = resolve_span(model.config, span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                        same_length=same_length)
    with eval_mode(model):
        if model.config.attn_type == "abs":
            seq = input_ids
            for _ in range(max_new_tokens):
                logits = model(seq[:, -span.tgt_len:], span=span).logits[:, -1]
                token = sample_next(logits, temperature, top_k, top_p, generator)
                seq = torch.cat([seq, token[:, None]], dim=1)
                yield GenerationStep(token, _logprob_of(logits, token))
            return
        # the memory lives in ring buffers of keys/values: a step projects and writes only the new token
        state = DecodingState(model.config.n_layer, span, keep_mems=False)
        mems = prime_memory(model, input_ids[:, :-1], mems, state)
        last = input_ids[:, -1:]
        for _ in range(max_new_tokens):
            out = model(last, mems=mems, caches=state)
            mems = None  # from the first step on, the state holds the memory
            token = sample_next(out.logits[:, -1], temperature, top_k, top_p, generator)
            last = token[:, None]
            yield GenerationStep(token, _logprob_of(out.logits[:, -1], token))


def _logprob_of(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """float64 [B]: log softmax(``logits`` [B, V]) at ``token`` (int64 [B]), in nats."""
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, token[:, None]).squeeze(-1)


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
             generator: torch.Generator | None = None, *, span: AttentionSpan | None = None,
             tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
             same_length: bool | None = None) -> torch.Tensor:
    """Sample continuations of ``input_ids`` (int64 [B, T]); returns int64 [B, T + max_new_tokens].

    Memory-cached sampling as in :func:`generate_stream` (same span arguments); ``generator`` makes
    it reproducible.

    Raises:
        TxlError: as :func:`generate_stream`.
    """
    tokens = list(generate_stream(model, input_ids, max_new_tokens, temperature, top_k, top_p, mems, generator,
                                  span=span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                                  same_length=same_length))
    if not tokens:
        return input_ids
    return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)


def stream_text(tokenizer, tokens: Iterable[int], prompt_ids: Iterable[int] = ()) -> Iterator[str]:
    """The text of ``prompt_ids`` followed by ``tokens``, piece by piece as the tokens arrive.

    Yields first the text of the prompt (possibly holding back an incomplete UTF-8 sequence at its
    end), then after each token the text it completes ("" when it completes none), then what is
    still held back at the end. For every sequence of ids the pieces concatenated equal
    ``tokenizer.decode([*prompt_ids, *tokens])`` (byte and byte-level BPE tokens go through an
    incremental UTF-8 decoder, see :meth:`txl.data.Tokenizer.text_stream`), so a stream printed
    as it is drawn reads exactly as the decoded sample. ``tokens`` is consumed lazily.

    Raises:
        TxlError: an id outside the tokenizer's vocabulary.
    """
    stream = tokenizer.text_stream()
    yield "".join(stream.push(int(i)) for i in prompt_ids)
    for token in tokens:
        yield stream.push(int(token))
    yield stream.finish()
