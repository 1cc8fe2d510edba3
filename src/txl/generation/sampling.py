"""Choosing each step's tokens: sampling (temperature, top-k, nucleus) and the decoding rules
(repetition penalty, no repeated n-grams, a minimum length before the end token)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from txl.config import check_decoding, check_sampling  # re-exported: txl.generation names them too
from txl.errors import TxlError

__all__ = ["Generators", "adjust_logits", "banned_ngram_tokens", "check_decoding", "check_sampling", "sample_next"]


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
    # one reduction finds all three faults: a row's max is NaN if the row holds a NaN (max propagates
    # it), +inf if it holds +inf, and -inf if every score is -inf; its indices are the greedy choice
    best, argmax = logits.max(dim=-1)
    if not bool(torch.isfinite(best).all()):
        raise TxlError("the model produced non-finite scores (NaN or inf): its weights are broken, e.g. by a "
                       "diverged training run; use an earlier checkpoint")
    if generator is not None and not isinstance(generator, torch.Generator) and len(generator) != logits.size(0):
        raise TxlError(f"give one generator per row: {logits.size(0)} rows, {len(generator)} generators")
    if temperature == 0:
        return argmax
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
