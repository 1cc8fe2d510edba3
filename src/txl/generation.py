"""Token-by-token sampling that reuses the Transformer-XL memory instead of recomputing the context."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
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


Generators = torch.Generator | Sequence[torch.Generator] | None
"""One generator for the batch, one per row (row b draws with ``generator[b]`` only, so a row's tokens
are those it would get decoded alone with that generator), or None (torch's global one)."""


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: Generators = None) -> torch.Tensor:
    """Draw one token per row from ``logits`` [B, V] (float). Returns int64 [B].

    ``temperature == 0`` picks the arg-max (greedy). ``top_k`` keeps the k most likely tokens;
    ``top_p`` keeps the smallest set whose probability reaches p (nucleus sampling, at least one token).
    A score of -inf is a banned token (probability 0, see :func:`adjust_logits`). ``generator``: one
    for the batch, or a sequence of one per row (see :data:`Generators`).

    Raises:
        TxlError: temperature < 0, top_k < 1 or top_p outside (0, 1]; NaN or +inf scores, or a row
            whose every score is -inf; a generator list whose length is not B.
    """
    check_sampling(temperature, top_k, top_p)
    if bool(torch.isnan(logits).any()) or bool((logits == float("inf")).any()) \
            or not bool(torch.isfinite(logits).any(dim=-1).all()):
        raise TxlError("the model produced non-finite scores (NaN or inf): its weights are broken, e.g. by a "
                       "diverged training run; use an earlier checkpoint")
    if generator is not None and not isinstance(generator, torch.Generator) and len(generator) != logits.size(0):
        raise TxlError(f"give one generator per row: {logits.size(0)} rows, {len(generator)} generators")
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
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return torch.cat([torch.multinomial(probs[b:b + 1], 1, generator=g)[:, 0] for b, g in enumerate(generator)])


def check_decoding(repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_new_tokens: int = 0) -> None:
    """Raise :class:`TxlError` for a repetition penalty that is not a finite number > 0, or a negative
    ``no_repeat_ngram_size`` or ``min_new_tokens``."""
    if not 0 < repetition_penalty < float("inf"):
        raise TxlError(f"repetition_penalty must be a finite number > 0 (1: none), got {repetition_penalty}")
    if no_repeat_ngram_size < 0:
        raise TxlError(f"no_repeat_ngram_size must be >= 0 (0: off), got {no_repeat_ngram_size}")
    if min_new_tokens < 0:
        raise TxlError(f"min_new_tokens must be >= 0, got {min_new_tokens}")


def banned_ngram_tokens(generated: Sequence[int], n: int) -> set[int]:
    """The tokens that would repeat an n-gram of ``generated``: every t such that
    ``generated[-(n-1):] + [t]`` already occurs in ``generated`` (for n = 1: every token in it)."""
    if n < 1 or len(generated) < n - 1:
        return set()
    seq = list(generated)
    prefix = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
    return {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == prefix}


def adjust_logits(logits: torch.Tensor, generated: Sequence[Sequence[int]], *, repetition_penalty: float = 1.0,
                  no_repeat_ngram_size: int = 0, banned: Sequence[int] = ()) -> torch.Tensor:
    """The scores [B, V] after the decoding rules, float64 (``logits`` itself when no rule applies).

    ``generated[b]`` holds the tokens row b has generated so far (the prompt is not counted, so that
    copying a phrase of the prompt stays allowed):

    * repetition penalty θ (Keskar et al. 2019, CTRL §4.1): a score s of a token already in
      ``generated[b]`` becomes s / θ when s > 0, else s · θ (θ > 1 discourages repeating);
    * ``no_repeat_ngram_size`` n > 0: a token that would complete an n-gram already in
      ``generated[b]`` gets -inf (:func:`banned_ngram_tokens`);
    * ``banned``: these ids get -inf in every row (e.g. the end marker before ``min_new_tokens``).

    Raises:
        TxlError: bad settings (:func:`check_decoding`) or a ``generated`` list whose length is not B.
    """
    check_decoding(repetition_penalty, no_repeat_ngram_size)
    if len(generated) != logits.size(0):
        raise TxlError(f"generated must hold one token list per row: {logits.size(0)} rows, {len(generated)} lists")
    if repetition_penalty == 1.0 and not no_repeat_ngram_size and not banned:
        return logits
    out = logits.double().clone()
    for b, seq in enumerate(generated):
        if repetition_penalty != 1.0 and len(seq):
            ids = torch.as_tensor(sorted(set(int(t) for t in seq)), dtype=torch.long, device=out.device)
            seen = out[b, ids]
            out[b, ids] = torch.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
        if no_repeat_ngram_size:
            ban = banned_ngram_tokens([int(t) for t in seq], no_repeat_ngram_size)
            if ban:
                out[b, torch.as_tensor(sorted(ban), dtype=torch.long, device=out.device)] = float("-inf")
    if banned:
        out[:, torch.as_tensor(list(banned), dtype=torch.long, device=out.device)] = float("-inf")
    return out


class _Chooser:
    """Picks each step's tokens: the decoding rules (:func:`adjust_logits`), then :func:`sample_next`;
    keeps the tokens generated so far per row."""

    def __init__(self, batch: int, temperature: float, top_k, top_p, generator: Generators,
                 repetition_penalty: float, no_repeat_ngram_size: int, min_new_tokens: int, end_ids) -> None:
        check_sampling(temperature, top_k, top_p)
        check_decoding(repetition_penalty, no_repeat_ngram_size, min_new_tokens)
        self.sampling = (temperature, top_k, top_p, generator)
        self.rules = dict(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
        self.min_new_tokens, self.end_ids = min_new_tokens, tuple(int(i) for i in end_ids)
        self.generated: list[list[int]] = [[] for _ in range(batch)]

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        banned = self.end_ids if len(self.generated[0]) < self.min_new_tokens else ()
        token = sample_next(adjust_logits(logits, self.generated, banned=banned, **self.rules), *self.sampling)
        for row, t in zip(self.generated, token.tolist()):
            row.append(t)
        return token


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


@torch.no_grad()
def prime_rows(model, prompts: Sequence[torch.Tensor], span: AttentionSpan) -> tuple[Mems | None, torch.Tensor | None]:
    """The memories of prompts of different lengths, each primed alone (:func:`prime_memory` of all
    but its last token), left-padded with zeros to one length M.

    Returns:
        ``(mems, mem_padding)``: ``n_layer`` tensors [B, M, d_model] and int64 [B], the padding
        positions of each row (see :meth:`~txl.model.TransformerXLLM.forward`); (None, None) when no
        prompt has more than one token.
    """
    alone = [prime_memory(model, p[None, :-1], span=span) for p in prompts]
    width = max((m[0].size(1) for m in alone if m is not None), default=0)
    if width == 0:
        return None, None
    layer = next(m for m in alone if m is not None)
    mems = []
    for i, ref in enumerate(layer):
        rows = [ref.new_zeros(1, width, ref.size(2)) if m is None else
                torch.cat([ref.new_zeros(1, width - m[i].size(1), ref.size(2)), m[i]], dim=1) for m in alone]
        mems.append(torch.cat(rows))
    padding = torch.as_tensor([width - (0 if m is None else m[0].size(1)) for m in alone], device=ref.device)
    return mems, padding


def _check_prompts(model, input_ids) -> tuple[torch.Tensor | list[torch.Tensor], bool]:
    """``input_ids`` checked: a tensor [B, T], or a list of 1-D tensors of different lengths (ragged)."""
    device = next(model.parameters()).device
    if isinstance(input_ids, (list, tuple)):
        if not input_ids:
            raise TxlError("give at least one prompt")
        for p in input_ids:
            check_input_ids(p[None] if isinstance(p, torch.Tensor) and p.dim() == 1 else p,
                            model.config.vocab_size, device)
        return list(input_ids), True
    check_input_ids(input_ids, model.config.vocab_size, device)
    return input_ids, False


@torch.no_grad()
def generate_stream(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
                    generator: Generators = None, *, span: AttentionSpan | None = None,
                    tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
                    same_length: bool | None = None, repetition_penalty: float = 1.0,
                    no_repeat_ngram_size: int = 0, min_new_tokens: int = 0,
                    end_ids: Sequence[int] = ()) -> Iterator[torch.Tensor]:
    """Yield ``max_new_tokens`` sampled tokens (int64 [B] each), one forward of one token per step.

    For ``attn_type`` "rel" and "shaw" the prompt (all but its last token) is fed once in chunks of ``tgt_len`` to
    build the memory; then each step feeds only the newest token with the memory (cost per token grows
    with ``mem_len``, not with the length of the text). ``attn_type="abs"`` has no memory: each step
    recomputes a sliding window of the last ``tgt_len`` tokens (the vanilla protocol).
    The model is put in eval mode for the duration and restored afterwards.

    ``span`` (None: the model's training span) with ``tgt_len``, ``mem_len``, ``clamp_len``,
    ``same_length`` overriding its fields (None keeps one) sets the priming segment length and the
    memory kept while sampling (e.g. a longer memory than in training, paper §3.2). ``model.config``
    is not changed.

    Decoding rules (:func:`adjust_logits`, over the tokens generated so far): ``repetition_penalty``
    (1: none), ``no_repeat_ngram_size`` (0: off); ``end_ids`` (e.g. the end-of-completion marker of
    :mod:`txl.data.pairs`) cannot be drawn before ``min_new_tokens`` tokens. The stream itself never
    stops early: the caller stops reading it (see :func:`complete`). ``generator``: one, or one per
    row (:data:`Generators`).

    Prompts of different lengths: ``input_ids`` a list of int64 [T_b] tensors. Each prompt primes its
    own memory alone (:func:`prime_rows`); the memories are left-padded to one length and the
    padding is masked (``mem_padding``), so every row's tokens and scores are those it gets decoded
    alone (scores equal up to float rounding), with its own generator when ``generator`` is a list.
    ``mems`` must then be None. (``attn_type="abs"``: each row's window is read alone.)

    Raises:
        TxlError: ``input_ids`` that is not a non-empty integer tensor [batch, length] of ids in the
            vocabulary on the model's device (a Python list of ints, an empty batch or prompt), nor a
            list of such 1-D tensors; ``mems`` of another shape, dtype or device than the model's (see
            :meth:`~txl.model.TransformerXLLM.forward`), bad sampling settings or an impossible span.
    """
    input_ids, ragged = _check_prompts(model, input_ids)
    if ragged and mems is not None:
        raise TxlError("prompts of different lengths start without a memory: pass mems=None")
    if model.config.attn_type == "abs" and mems is not None:
        raise TxlError("attn_type='abs' (vanilla Transformer) has no memory: pass mems=None")
    if max_new_tokens < 0:
        raise TxlError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    span = resolve_span(model.config, span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                        same_length=same_length)
    choose = _Chooser(len(input_ids), temperature, top_k, top_p, generator, repetition_penalty,
                      no_repeat_ngram_size, min_new_tokens, end_ids)
    with eval_mode(model):
        if model.config.attn_type == "abs":
            rows = [p[None] for p in input_ids] if ragged else [input_ids]
            for _ in range(max_new_tokens):
                logits = torch.cat([model(seq[:, -span.tgt_len:], span=span).logits[:, -1] for seq in rows])
                token = choose(logits)
                rows = [torch.cat([seq, t[:, None]], dim=1) for seq, t in zip(rows, token.split(
                    [seq.size(0) for seq in rows]))]
                yield token
            return
        # the memory lives in ring buffers of keys/values: a step projects and writes only the new token
        state = DecodingState(model.config.n_layer, span, keep_mems=False)
        if ragged:  # each prompt primes its memory alone; left-padded to one length, the padding masked
            mems, padding = prime_rows(model, input_ids, span)
            last = torch.stack([p[-1:] for p in input_ids])
        else:
            mems, padding = prime_memory(model, input_ids[:, :-1], mems, state), None
            last = input_ids[:, -1:]
        for _ in range(max_new_tokens):
            before = state.memory_length if state.length else (0 if mems is None else mems[0].size(1))
            out = model(last, mems=mems, caches=state, mem_padding=padding)
            mems = None  # from the first step on, the state holds the memory
            if padding is not None:  # positions that left the memory on the left are padding first
                padding = (padding - (before + 1 - state.memory_length)).clamp(min=0)
            token = choose(out.logits[:, -1])
            last = token[:, None]
            yield token


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
             generator: Generators = None, *, span: AttentionSpan | None = None,
             tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
             same_length: bool | None = None, **rules) -> torch.Tensor:
    """Sample continuations of ``input_ids`` (int64 [B, T]); returns int64 [B, T + max_new_tokens]
    (for a list of prompts of different lengths, a list of int64 [T_b + max_new_tokens]).

    Memory-cached sampling as in :func:`generate_stream` (same span arguments and decoding ``rules``:
    ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``end_ids``); ``generator``
    makes it reproducible.

    Raises:
        TxlError: as :func:`generate_stream`.
    """
    tokens = list(generate_stream(model, input_ids, max_new_tokens, temperature, top_k, top_p, mems, generator,
                                  span=span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                                  same_length=same_length, **rules))
    if isinstance(input_ids, (list, tuple)):  # prompts of different lengths: one tensor each
        new = torch.stack(tokens, dim=1) if tokens else None
        return [p if new is None else torch.cat([p, new[b]]) for b, p in enumerate(input_ids)]
    if not tokens:
        return input_ids
    return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)


@dataclass
class BeamResult:
    """The best sequence of :func:`beam_search`.

    Attributes:
        tokens: int64 [n] the new tokens (an end id, when one ended it, included).
        logprob: float64 sum of the model's log-probabilities of ``tokens`` (nats, rules not applied).
        score: the search score: the sum of the rule-adjusted log-probabilities / n ** length_penalty.
    """

    tokens: torch.Tensor
    logprob: float
    score: float


@torch.no_grad()
def beam_search(model, input_ids: torch.Tensor, num_beams: int, max_new_tokens: int, *,
                length_penalty: float = 1.0, end_ids: Sequence[int] = (), min_new_tokens: int = 0,
                repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, span: AttentionSpan | None = None,
                mem_len: int | None = None) -> BeamResult:
    """The continuation of one prompt (int64 [1, T]) with the best score among ``num_beams`` beams.

    Each step extends every beam by every token, scores ``sum log p`` (after the decoding rules of
    :func:`adjust_logits`) and keeps the ``num_beams`` best; a candidate ending in one of ``end_ids``
    is set aside as finished (scored ``sum / n ** length_penalty``, n its number of tokens). The memory,
    held in the ring buffers of a :class:`~txl.model.DecodingState`, follows its beams
    (:func:`reorder_state`), so a step costs one forward of one token per beam. The search stops after ``max_new_tokens``, or once ``num_beams``
    hypotheses are finished and no running beam can still beat them at its current length. The greedy
    path is decoded alongside as one more row and returned when it scores higher, so the result never
    scores below greedy decoding. ``num_beams=1`` is greedy decoding itself.

    Raises:
        TxlError: ``num_beams`` < 1, a batch other than 1, bad rules or an impossible span.
    """
    if num_beams < 1:
        raise TxlError(f"num_beams must be >= 1, got {num_beams}")
    check_input_ids(input_ids, model.config.vocab_size, next(model.parameters()).device)
    if input_ids.size(0) != 1:
        raise TxlError(f"beam search decodes one prompt at a time, got a batch of {input_ids.size(0)}")
    check_decoding(repetition_penalty, no_repeat_ngram_size, min_new_tokens)
    if max_new_tokens < 0:
        raise TxlError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    span = resolve_span(model.config, span, mem_len=mem_len)
    end = tuple(int(i) for i in end_ids)
    rules = dict(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
    k = num_beams
    device = input_ids.device
    norm = lambda total, n: total / max(n, 1) ** length_penalty  # noqa: E731
    with eval_mode(model):
        rows = list(range(k + 1))  # beams 0..k-1, then the greedy row
        seqs = [[] for _ in rows]
        scores = torch.full((k,), float("-inf"), dtype=torch.float64, device=device)
        scores[0] = 0.0  # one live beam at the start: no duplicates
        true_lp = [0.0] * (k + 1)
        greedy_score, greedy_done = 0.0, False
        finished: list[tuple[float, float, list[int]]] = []  # (score, logprob, tokens)
        state = DecodingState(model.config.n_layer, span, keep_mems=False) if model.config.attn_type != "abs" else None
        mems = None
        if state is not None:
            mems = prime_memory(model, input_ids[:, :-1], None, state)  # None once the state holds the memory
            mems = reorder_state(mems, state, torch.zeros(k + 1, dtype=torch.long, device=device))
        last = input_ids[:, -1:].expand(k + 1, 1)
        for n in range(1, max_new_tokens + 1):
            if state is None:  # attn_type "abs": each row's window of the last tgt_len tokens
                logits = torch.cat([model(torch.cat([input_ids[0], torch.as_tensor(sq, dtype=torch.long, device=device)])
                                          [None, -span.tgt_len:], span=span).logits[:, -1] for sq in seqs])
            else:
                out = model(last, mems=mems, caches=state)
                mems, logits = None, out.logits[:, -1]
            logp = torch.log_softmax(logits.double(), dim=-1)
            banned = end if n <= min_new_tokens else ()
            adj = torch.log_softmax(adjust_logits(logits, seqs, banned=banned, **rules).double(), dim=-1)
            g = int(adj[k].argmax())  # the greedy row
            greedy_seq = seqs[k] if greedy_done else seqs[k] + [g]
            if not greedy_done:
                greedy_score += float(adj[k, g])
                true_lp[k] += float(logp[k, g])
                greedy_done = g in end
            seqs[k] = greedy_seq
            if k == 1 and greedy_done:
                break
            # the beams: the 2k best extensions, so that k of them can go on after finished ones
            total = (scores[:, None] + adj[:k]).view(-1)
            top = torch.topk(total, min(2 * k, total.numel()))
            parents, tokens, new_scores, new_lp = [], [], [], []
            for rank, (value, flat) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                if value == float("-inf") or len(parents) == k:
                    break
                beam, token = divmod(flat, logits.size(-1))
                lp = true_lp[beam] + float(logp[beam, token])
                if token in end:
                    if rank < k:
                        finished.append((norm(value, n), lp, seqs[beam] + [token]))
                    continue
                parents.append(beam)
                tokens.append(token)
                new_scores.append(value)
                new_lp.append(lp)
            finished = sorted(finished, key=lambda f: -f[0])[:k]
            if not parents:
                break
            while len(parents) < k:  # fewer live extensions than beams: dead copies
                parents.append(parents[0])
                tokens.append(tokens[0])
                new_scores.append(float("-inf"))
                new_lp.append(float("-inf"))
            seqs = [seqs[p] + [t] for p, t in zip(parents, tokens)] + [greedy_seq]
            scores = torch.as_tensor(new_scores, dtype=torch.float64, device=device)
            true_lp = new_lp + [true_lp[k]]
            if state is not None:
                reorder_state(None, state, torch.as_tensor(parents + [k], device=device))
            last = torch.as_tensor([[t] for t in tokens] + [[g]], device=device)
            if len(finished) >= k and norm(float(scores.max()), n) <= finished[-1][0]:
                break  # no running beam beats the finished ones at its present length
        greedy = (norm(greedy_score, len(seqs[k])), true_lp[k], seqs[k])
        candidates = finished + [(norm(float(sc), len(sq)), lp, sq) for sc, lp, sq in
                                 zip(scores.tolist(), true_lp[:k], seqs[:k]) if sc > float("-inf")]
        best = max(candidates + [greedy], key=lambda c: c[0]) if k > 1 else greedy
    return BeamResult(tokens=torch.as_tensor(best[2], dtype=torch.long, device=device), logprob=best[1], score=best[0])


def reorder_state(mems: Mems | None, state: DecodingState, index: torch.Tensor) -> Mems | None:
    """The decoding of rows ``index`` (int64 [B']; beam search): the rows of the memory ``mems``
    (returned; None stays None) and, in place, of the ring buffers of ``state``
    (:meth:`txl.model.DecodingState.reorder`)."""
    state.reorder(index)
    return None if mems is None else [m.index_select(0, index) for m in mems]


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


class StopText:
    """Cuts streamed text at the first of some stop strings.

    :meth:`push` takes the text pieces of a stream (e.g. from :func:`stream_text`) and returns the
    text that can be shown: a tail that could still become a stop string is held back until it
    cannot. Once a stop string has appeared, :attr:`stopped` is True and the text before it is all
    that was ever returned (the stop string is not shown). Concatenated, the returned pieces and
    :meth:`finish` equal the whole text cut before the stop string that is complete first (of those
    complete at the same character, the longest), the whole text when none appears; how the text
    is cut into pieces does not matter.

    Args:
        stops: the stop strings (empty ones are not allowed).
        armed: stop strings count only once this is True (e.g. after ``min_new_tokens``); text seen
            before is shown as it is.

    Raises:
        TxlError: an empty stop string.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise TxlError("a stop sequence must not be empty")
        self.stops = tuple(stops)
        self.stopped = False
        self.armed = True
        self._held = ""
        self._hold = max((len(s) for s in self.stops), default=1) - 1

    def push(self, piece: str) -> str:
        """The text of ``piece`` (with what was held back) that can be shown now."""
        if self.stopped:
            return ""
        text = self._held + piece
        if self.armed and self.stops:
            found = [(i + len(s), i) for s in self.stops if (i := text.find(s)) >= 0]
            if found:  # the stop that is complete first (then the longest of those) ends the text
                self.stopped, self._held = True, ""
                return text[:min(found)[1]]
        keep = self._hold if self.armed else 0
        self._held = text[len(text) - keep:] if keep and len(text) > keep else (text if keep else "")
        return text[:len(text) - len(self._held)]

    def finish(self) -> str:
        """What is still held back (the stream ended without a stop string there)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def continue_texts(model, tokenizer, prompts: Sequence[torch.Tensor], *, max_new_tokens: int = 128,
                   temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                   generator: Generators = None, stop: Sequence[str] = (), end_ids: Sequence[int] = (),
                   min_new_tokens: int = 0, repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
                   num_beams: int = 1, length_penalty: float = 1.0, batch_size: int = 8,
                   span: AttentionSpan | None = None, mem_len: int | None = None) -> list[str]:
    """The text each prompt (int64 [T_b] ids, lengths may differ) continues with, decoded until one of
    ``end_ids`` (not returned), a ``stop`` string (cut before it; stops count from ``min_new_tokens``
    tokens on) or ``max_new_tokens`` tokens.

    ``num_beams`` 1: up to ``batch_size`` prompts are decoded together (:func:`generate_stream` with
    prompts of different lengths), each exactly as alone; give ``generator`` as one generator per
    prompt for sampling that does not depend on the batching. ``num_beams`` > 1: :func:`beam_search`
    for each prompt (``temperature``, ``top_k``, ``top_p`` and ``generator`` are not used).

    Raises:
        TxlError: bad settings, a generator list whose length is not the number of prompts.
    """
    StopText(stop)
    if batch_size < 1:
        raise TxlError(f"batch_size must be >= 1, got {batch_size}")
    if generator is not None and not isinstance(generator, torch.Generator) and len(generator) != len(prompts):
        raise TxlError(f"give one generator per prompt: {len(prompts)} prompts, {len(generator)} generators")
    end = set(int(i) for i in end_ids)
    rules = dict(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                 min_new_tokens=min_new_tokens)
    texts: list[str] = []
    if num_beams > 1:
        for p in prompts:
            result = beam_search(model, p[None], num_beams, max_new_tokens, length_penalty=length_penalty,
                                 end_ids=tuple(end), span=span, mem_len=mem_len, **rules)
            texts += _cut_texts(tokenizer, [iter(result.tokens.tolist())], end, stop, min_new_tokens)
        return texts
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start:start + batch_size])
        gen = generator if generator is None or isinstance(generator, torch.Generator) else \
            list(generator[start:start + batch_size])
        steps = generate_stream(model, chunk, max_new_tokens, temperature, top_k, top_p, generator=gen, span=span,
                                mem_len=mem_len, end_ids=tuple(end), **rules)
        texts += _cut_texts(tokenizer, _Columns(steps, len(chunk)).rows(), end, stop, min_new_tokens)
    return texts


class _Columns:
    """The rows of a batched token stream (int64 [B] per step), each read one token at a time; a step
    is computed only when a row that is still being read needs its next token."""

    def __init__(self, steps: Iterator[torch.Tensor], n: int) -> None:
        self.steps, self.buffer = steps, [[] for _ in range(n)]

    def rows(self) -> list[Iterator[int]]:
        return [self._row(b) for b in range(len(self.buffer))]

    def _row(self, b: int) -> Iterator[int]:
        while True:
            if not self.buffer[b]:
                step = next(self.steps, None)
                if step is None:
                    return
                for row, t in zip(self.buffer, step.tolist()):
                    row.append(t)
            yield self.buffer[b].pop(0)


def _cut_texts(tokenizer, rows: list[Iterator[int]], end: set, stop: Sequence[str], min_new_tokens: int) -> list[str]:
    """Decode each row's tokens until an end id or a stop string (see :func:`continue_texts`)."""
    cuts = [StopText(stop) for _ in rows]
    streams = [tokenizer.text_stream() for _ in rows]
    pieces: list[list[str]] = [[] for _ in rows]
    active = list(range(len(rows)))
    n = 0
    while active:
        n += 1
        for b in list(active):
            t = next(rows[b], None)
            if t is None or t in end:
                active.remove(b)
                continue
            cuts[b].armed = n >= min_new_tokens
            pieces[b].append(cuts[b].push(streams[b].push(t)))
            if cuts[b].stopped:
                active.remove(b)
    return ["".join(p) + ("" if c.stopped else c.push(s.finish()) + c.finish())
            for p, c, s in zip(pieces, cuts, streams)]


def complete(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 128, max_prompt_tokens: int = 0,
             **settings) -> list[str]:
    """The completions of ``prompts`` by a model fine-tuned on prompt/completion pairs (``txl finetune``).

    Each prompt is fed as ``prompt + SEP`` (:mod:`txl.data.pairs`; only its last ``max_prompt_tokens``
    tokens when > 0), read segment by segment with the memory however long it is, and decoded until
    the end-of-completion marker, a ``stop`` string or ``max_new_tokens`` tokens, by
    :func:`continue_texts` (whose keyword ``settings`` apply: greedy by default, ``num_beams``,
    ``batch_size``, ``generator`` one per prompt, the decoding rules ...). Returns the texts without
    the marker or the stop string.

    Raises:
        TxlError: a tokenizer without the markers (a model that was not fine-tuned), a prompt holding
            a marker, bad decoding settings.
    """
    from txl.data.pairs import encode_prompt, find_markers

    markers = find_markers(tokenizer)
    device = next(model.parameters()).device
    ids = [torch.as_tensor(encode_prompt(tokenizer, markers, p, max_prompt_tokens), device=device) for p in prompts]
    return continue_texts(model, tokenizer, ids, max_new_tokens=max_new_tokens, end_ids=(markers.end_id,), **settings)


