"""Beam search over the Transformer-XL memory: the decoding state's rows follow their beams."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from txl.errors import TxlError
from txl.segments import eval_mode
from txl.generation.sampling import DecodingRules, check_decoding, check_end_ids, rules_from
from txl.generation.stream import prime_memory, step_state
from txl.model.decoding import DecodingState
from txl.model.checks import check_input_ids
from txl.model.memory import Mems
from txl.config import AttentionSpan, check_count, resolve_span
from txl.runtime import available_memory_bytes, format_bytes


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


def _check_beams(num_beams: int, vocab_size: int, max_new_tokens: int, device=None) -> None:
    """Refuse more beams than distinct continuations, or than the model's device can hold the scores of."""
    need = 8 * (num_beams + 1) * vocab_size  # one step's candidate scores (float64 here and there)
    if need > available_memory_bytes(device):
        raise TxlError(f"num_beams {num_beams:,} needs {format_bytes(need)} for one step's candidate scores, more "
                       "than the memory available: use fewer beams")
    if max_new_tokens == 0:  # one continuation, the empty one, whatever the beams
        return
    distinct = 1
    for _ in range(max_new_tokens if vocab_size > 1 else 1):
        distinct *= vocab_size
        if distinct >= num_beams:
            break
    if distinct < num_beams:
        raise TxlError(f"num_beams {num_beams:,} is more than the {distinct:,} distinct continuations of "
                       f"{max_new_tokens} token(s) over {vocab_size:,} tokens: use at most {distinct:,} beams")


@torch.no_grad()
def beam_search(model, input_ids: torch.Tensor, num_beams: int, max_new_tokens: int, *,
                length_penalty: float = 1.0, end_ids: Sequence[int] = (), rules: DecodingRules | None = None,
                span: AttentionSpan | None = None, mem_len: int | None = None, **rule_fields) -> BeamResult:
    """The continuation of one prompt (int64 [1, T]) with the best score among ``num_beams`` beams.

    Each step extends every beam by every token, scores ``sum log p`` (after the constraints of the
    decoding ``rules``, a :class:`~txl.generation.DecodingRules`: repetition penalty, no repeated
    n-grams, ``end_ids`` banned before ``min_new_tokens``; or those fields as keywords, not both; its
    temperature, top-k and top-p are not used, the search ranks by log-probability) and keeps the ``num_beams`` best; a candidate ending in one of ``end_ids``
    is set aside as finished (scored ``sum / n ** length_penalty``, n its number of tokens). The memory,
    held in the ring buffers of a :class:`~txl.model.DecodingState`, follows its beams
    (:func:`reorder_state`), so a step costs one forward of one token per beam. The search stops after ``max_new_tokens``, or once ``num_beams``
    hypotheses are finished and no running beam can still beat them at its current length. The greedy
    path is decoded alongside as one more row and returned when it scores higher, so the result never
    scores below greedy decoding. ``num_beams=1`` is greedy decoding itself.

    Raises:
        TxlError: ``num_beams`` that is not an integer >= 1, more beams than there are distinct
            continuations (vocab_size ** max_new_tokens) or than the memory can score, a batch
            other than 1, bad rules or an impossible span.
    """
    rules, span = _check_search(model, input_ids, num_beams, max_new_tokens, length_penalty, rules, span, mem_len,
                                rule_fields)
    end = check_end_ids(end_ids, model.config.vocab_size)
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
        state, mems = _primed_rows(model, input_ids, span, k + 1, max_new_tokens)
        last = input_ids[:, -1:].expand(k + 1, 1)
        for n in range(1, max_new_tokens + 1):
            if state is None:  # attn_type "abs": each row's window of the last tgt_len tokens
                logits = torch.cat([model(torch.cat([input_ids[0], torch.as_tensor(sq, dtype=torch.long, device=device)])
                                          [None, -span.tgt_len:], span=span).logits[:, -1] for sq in seqs])
            else:
                out = model(last, mems=mems, caches=state)
                mems, logits = None, out.logits[:, -1]
            logp = torch.log_softmax(logits.double(), dim=-1)
            adj = logits
            for process in rules.constraints(seqs, end):  # seqs: every row's n - 1 tokens so far
                adj = process(adj)
            adj = torch.log_softmax(adj.double(), dim=-1)
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
        best = _best(finished, scores, true_lp, seqs, greedy_score, norm)
    return BeamResult(tokens=torch.as_tensor(best[2], dtype=torch.long, device=device), logprob=best[1], score=best[0])


def _check_search(model, input_ids: torch.Tensor, num_beams: int, max_new_tokens: int, length_penalty: float,
                  rules: DecodingRules | None, span: AttentionSpan | None, mem_len: int | None,
                  rule_fields: dict) -> tuple[DecodingRules, AttentionSpan]:
    """The arguments of :func:`beam_search` checked; returns its decoding rules (``rules`` or the
    ``rule_fields``, :func:`~txl.generation.sampling.rules_from`) and span (``span`` with ``mem_len``).

    Raises:
        TxlError: as :func:`beam_search`.
    """
    check_count(num_beams, "num_beams", 1)
    check_input_ids(input_ids, model.config.vocab_size, next(model.parameters()).device)
    if input_ids.size(0) != 1:
        raise TxlError(f"beam search decodes one prompt at a time, got a batch of {input_ids.size(0)}")
    rules = rules_from(rules, **rule_fields)
    check_decoding(length_penalty=length_penalty)
    if max_new_tokens < 0:
        raise TxlError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    _check_beams(int(num_beams), model.config.vocab_size, max_new_tokens, next(model.parameters()).device)
    return rules, resolve_span(model.config, span, mem_len=mem_len)


def _primed_rows(model, input_ids: torch.Tensor, span: AttentionSpan, n_rows: int,
                 max_new_tokens: int) -> tuple[DecodingState | None, Mems | None]:
    """The decoding state of ``n_rows`` rows (the beams and the greedy row) that all start from the prompt
    ``input_ids`` (int64 [1, T]; all but its last token read), with room for ``max_new_tokens``.

    Returns:
        ``(state, mems)``: the state (:func:`~txl.generation.stream.step_state`) and the memory of the first
        step (None once the state holds it); (None, None) for a model without memory (``attn_type="abs"``).
    """
    state = None
    if model.config.has_memory:
        state = step_state(model, span, n_rows, input_ids.size(1) + max_new_tokens)
    mems = None
    if state is not None:
        mems = prime_memory(model, input_ids[:, :-1], None, state)  # None once the state holds the memory
        mems = reorder_state(mems, state, torch.zeros(n_rows, dtype=torch.long, device=input_ids.device))
    return state, mems


def _best(finished: list[tuple[float, float, list[int]]], scores: torch.Tensor, true_lp: list[float],
          seqs: list[list[int]], greedy_score: float, norm) -> tuple[float, float, list[int]]:
    """The best ``(score, logprob, tokens)`` of the search: among the ``finished`` hypotheses, the running
    beams (``scores`` float64 [k], ``true_lp`` and ``seqs`` of the k beams then the greedy row) and the
    greedy row (rule-adjusted sum ``greedy_score``); ``norm(total, n)`` the length-normalised score.
    With one beam, the greedy row."""
    k = len(scores)
    greedy = (norm(greedy_score, len(seqs[k])), true_lp[k], seqs[k])
    candidates = finished + [(norm(float(sc), len(sq)), lp, sq) for sc, lp, sq in
                             zip(scores.tolist(), true_lp[:k], seqs[:k]) if sc > float("-inf")]
    return max(candidates + [greedy], key=lambda c: c[0]) if k > 1 else greedy


def reorder_state(mems: Mems | None, state: DecodingState, index: torch.Tensor) -> Mems | None:
    """The decoding of rows ``index`` (int64 [B']; beam search): the rows of the memory ``mems``
    (returned; None stays None) and, in place, of the ring buffers of ``state``
    (:meth:`txl.model.DecodingState.reorder`)."""
    state.reorder(index)
    return None if mems is None else [m.index_select(0, index) for m in mems]
