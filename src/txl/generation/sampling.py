"""Choosing each step's tokens: sampling (temperature, top-k, nucleus) and the decoding rules
(repetition penalty, no repeated n-grams, a minimum length before the end token)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from txl.config import check_decoding, check_sampling  # re-exported: txl.generation names them too
from txl.errors import TxlError, quoted
from txl.runtime import reads_values

__all__ = ["GREEDY", "DecodingRules", "Generators", "LogitsProcessor", "adjust_logits", "banned_ngram_tokens",
           "check_decoding", "check_sampling", "sample_next"]  # Chooser and rules_from serve this package


Generators = torch.Generator | Sequence[torch.Generator] | None
"""One generator for the batch, one per row (row b draws with ``generator[b]`` only, so a row's tokens
are those it would get decoded alone with that generator), or None (torch's global one)."""


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: Generators = None) -> torch.Tensor:
    """Draw one token per row from ``logits`` [B, V] (float). Returns int64 [B].

    ``temperature == 0`` picks the arg-max (greedy). ``top_k`` keeps the k most likely tokens;
    ``top_p`` keeps the smallest set whose probability reaches p (nucleus sampling, at least one token).
    A score of -inf is a banned token (probability 0, see :func:`adjust_logits`). ``generator``: one
    for the batch, or a sequence of one per row (see :data:`Generators`). The same draw as
    :meth:`DecodingRules.choose` with these three rules only.

    Raises:
        TxlError: temperature < 0, top_k < 1 or top_p outside (0, 1]; NaN or +inf scores, or a row
            whose every score is -inf; a generator list whose length is not B.
    """
    check_sampling(temperature, top_k, top_p)
    return _draw(logits, temperature, top_k, top_p, generator)


def _draw(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
          generator: Generators, faults: "Faults | None" = None) -> torch.Tensor:
    """The draw after the constraints: temperature, top-k, top-p processors, then multinomial (or arg max).

    Non-finite scores raise at once where their values can be read for free (:func:`~txl.runtime.reads_values`),
    else they are noted in ``faults`` (raised when the decoder checks it, at the end of its loop) and the
    faulty rows are drawn from uniform scores, so that the draw itself cannot fail on the device. The
    rules were checked when given (:func:`sample_next`, :class:`DecodingRules`), not again per step."""
    check_generators(generator, logits.size(0))
    # one reduction finds all three faults: a row's max is NaN if the row holds a NaN (max propagates
    # it), +inf if it holds +inf, and -inf if every score is -inf; its indices are the greedy choice
    best, argmax = logits.max(dim=-1)
    finite = torch.isfinite(best)
    if faults is None or reads_values(logits):
        if not bool(finite.all()):
            raise TxlError(NON_FINITE)
    else:
        faults.note(~finite, Faults.NON_FINITE)
        logits = torch.where(finite[:, None], logits, 0.0)
    if temperature == 0:
        return argmax
    logits = _wide(logits)
    for process in (_temperature(temperature), _top_k(top_k), _top_p(top_p)):
        if process is not None:
            logits = process(logits)
    probs = torch.softmax(logits, dim=-1)
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return torch.cat([torch.multinomial(probs[b:b + 1], 1, generator=g)[:, 0] for b, g in enumerate(generator)])


NON_FINITE = ("the model produced non-finite scores (NaN or inf): its weights are broken, e.g. by a diverged "
              "training run; use an earlier checkpoint")


def _wide(logits: torch.Tensor) -> torch.Tensor:
    """Scores in the logits' own dtype, but bf16/fp16 widened to float32 (their 8-bit or 11-bit
    mantissa would round small probabilities away in the softmax and the nucleus' running sum)."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


class Faults:
    """What a decoding loop found wrong on the device, kept there until the loop checks it: a per-token
    check would wait for an accelerator at every step (on CPU tensors the checks run at once instead).

    ``note(rows, kind)`` records bool [B] ``rows`` at fault of one kind; :meth:`check` reads the record
    once (one host synchronisation) and raises.
    """

    NON_FINITE, NO_TOKEN = 1, 2

    def __init__(self) -> None:
        self.kind: torch.Tensor | None = None  # int64 scalar on the device: the kinds seen, or-ed

    def note(self, rows: torch.Tensor, kind: int) -> None:
        """Record ``kind`` if any of the bool [B] ``rows`` is set (no host synchronisation)."""
        found = rows.any().to(torch.int64) * kind
        self.kind = found if self.kind is None else self.kind | found

    def check(self) -> None:
        """Raise what was noted, if anything.

        Raises:
            TxlError: non-finite scores, or a row left without a token by the decoding rules.
        """
        kind = 0 if self.kind is None else int(self.kind)
        # a row the rules leave without a token has -inf as its best score too: that kind is said first
        if kind & self.NO_TOKEN:
            raise TxlError("the decoding rules left no token to choose in a row: loosen them (e.g. a smaller "
                           "min_new_tokens) or generate fewer tokens")
        if kind & self.NON_FINITE:
            raise TxlError(NON_FINITE)


LogitsProcessor = Callable[[torch.Tensor], torch.Tensor]
"""[B, V] scores -> [B, V] scores (the dtype of the scores, at least float32; -inf bans a token)."""


def _temperature(temperature: float) -> LogitsProcessor | None:
    """Scores shifted so that each row's best is 0, then divided by the temperature (> 0): <= 0 for any
    temperature (-inf at worst for a tiny one), never inf or NaN; the limit T -> 0 is greedy."""
    def process(logits):
        shifted = logits - logits.max(dim=-1, keepdim=True).values
        if temperature < torch.finfo(shifted.dtype).tiny:  # T itself underflows the dtype (1e-300 in float32):
            return shifted * torch.finfo(shifted.dtype).max  # the greedy limit, every tie at the best kept
        return shifted / temperature
    return process


def _top_k(top_k: int | None) -> LogitsProcessor | None:
    """Only the ``top_k`` best scores of each row stay (ties at the k-th all stay)."""
    if top_k is None:
        return None

    def process(logits):
        if top_k >= logits.size(-1):
            return logits
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        return logits.masked_fill(logits < kth, float("-inf"))
    return process


def _top_p(top_p: float | None) -> LogitsProcessor | None:
    """Nucleus (Holtzman et al. 2020): the smallest set of best tokens whose probability reaches ``top_p``
    stays, and always the most likely one."""
    if top_p is None or top_p >= 1.0:
        return None

    def process(logits):
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False  # the most likely token always stays, however small top_p is
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, float("-inf"))
    return process


def banned_ngram_tokens(generated: Sequence[int], n: int) -> set[int]:
    """The tokens that would repeat an n-gram of ``generated``: every t such that
    ``generated[-(n-1):] + [t]`` already occurs in ``generated`` (for n = 1: every token in it)."""
    if n < 1 or len(generated) < n - 1:
        return set()
    seq = list(generated)
    prefix = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
    return {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == prefix}


def adjust_logits(logits: torch.Tensor, generated: Sequence[Sequence[int]], *, repetition_penalty: float = 1.0,
                  no_repeat_ngram_size: int = 0, banned: Sequence[int] | torch.Tensor = ()) -> torch.Tensor:
    """The scores [B, V] after the decoding rules, in the logits' dtype (float32 for bf16/fp16 logits;
    ``logits`` itself when no rule applies).

    ``generated[b]`` holds the tokens row b has generated so far (the prompt is not counted, so that
    copying a phrase of the prompt stays allowed):

    * repetition penalty θ (Keskar et al. 2019, CTRL §4.1): a score s of a token already in
      ``generated[b]`` becomes s / θ when s > 0, else s · θ (θ > 1 discourages repeating);
    * ``no_repeat_ngram_size`` n > 0: a token that would complete an n-gram already in
      ``generated[b]`` gets -inf (:func:`banned_ngram_tokens`);
    * ``banned``: these ids get -inf in every row (e.g. the end marker before ``min_new_tokens``); a
      sequence, or an int64 tensor (on the logits' device: no copy per step).

    Raises:
        TxlError: bad settings (:func:`check_decoding`) or a ``generated`` list whose length is not B.
    """
    check_decoding(repetition_penalty, no_repeat_ngram_size)
    if len(generated) != logits.size(0):
        raise TxlError(f"generated must hold one token list per row: {logits.size(0)} rows, {len(generated)} lists")
    if repetition_penalty == 1.0 and not no_repeat_ngram_size and not len(banned):  # (a tensor of one id 0 is falsy)
        return logits
    out = _wide(logits).clone()
    for b, seq in enumerate(generated):
        if repetition_penalty != 1.0 and len(seq):
            ids = torch.as_tensor(sorted(set(int(t) for t in seq)), dtype=torch.long, device=out.device)
            seen = out[b, ids]
            penalized = torch.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
            top = torch.finfo(out.dtype).max  # a θ near 0 or near inf must not turn a score into ±inf
            out[b, ids] = torch.where(torch.isfinite(seen), penalized.clamp(-top, top), seen)  # (the model's own
            # non-finite scores stay as they are: the sampler reports them)
        if no_repeat_ngram_size:
            ban = banned_ngram_tokens([int(t) for t in seq], no_repeat_ngram_size)
            if ban:
                out[b, torch.as_tensor(sorted(ban), dtype=torch.long, device=out.device)] = float("-inf")
    if len(banned):  # a tensor on the device already (a decoder's end ids, made once) or a sequence of ids
        ids = banned if isinstance(banned, torch.Tensor) else torch.as_tensor(list(banned), dtype=torch.long)
        out[:, ids.to(out.device)] = float("-inf")
    return out


@dataclass(frozen=True)
class DecodingRules:
    """How each step's token is chosen from the model's scores: one object for every decoder
    (:func:`~txl.generation.generate` and its streams, :func:`~txl.generation.beam_search`,
    :func:`~txl.generation.continue_texts`/:func:`~txl.generation.complete`, ``txl serve``).

    The scores go through a list of logits processors, in this order, then the draw:

    1. ``repetition_penalty`` θ (Keskar et al. 2019, CTRL §4.1; 1: off): a score s of a token the row
       has generated becomes s / θ when s > 0, else s · θ (the prompt does not count);
    2. ``no_repeat_ngram_size`` n (0: off): a token that would complete an n-gram the row has generated
       gets -inf (:func:`banned_ngram_tokens`);
    3. ``min_new_tokens``: the call's end ids (e.g. a fine-tuned model's end-of-completion marker) get
       -inf until that many tokens are out;
    4. ``temperature`` (0: greedy, the arg max after 1-3; the rest then does not apply), 5. ``top_k``,
       6. ``top_p`` (None or 1: off) -- the draw (:func:`sample_next`).

    Beam search applies 1-3 and ranks by log-probability: 4-6 are not used there.

    Raises:
        TxlError: at construction, a setting out of range (:func:`~txl.config.check_sampling`,
            :func:`~txl.config.check_decoding`).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_decoding(self.repetition_penalty, self.no_repeat_ngram_size, self.min_new_tokens)

    @property
    def needs_history(self) -> bool:
        """Whether a rule reads the tokens each row has generated (repetition penalty, no repeated n-grams):
        then a decoder keeps them on the host, one read of each step's tokens."""
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0

    def constraints(self, generated: Sequence[Sequence[int]], end_ids: Sequence[int] | torch.Tensor = (),
                    steps: int | None = None) -> list[LogitsProcessor]:
        """Processors 1-3 for rows that have generated ``generated[b]`` so far (empty when all are off);
        ``steps``: how many tokens each row has generated (None: ``len(generated[0])``); ``end_ids`` a
        sequence or an int64 tensor."""
        n = steps if steps is not None else (len(generated[0]) if len(generated) else 0)
        banned = end_ids if n < self.min_new_tokens and len(end_ids) else ()
        if not self.needs_history and not len(banned):
            return []
        return [lambda logits: adjust_logits(logits, generated, repetition_penalty=self.repetition_penalty,
                                             no_repeat_ngram_size=self.no_repeat_ngram_size, banned=banned)]

    def choose(self, logits: torch.Tensor, generated: Sequence[Sequence[int]], end_ids: Sequence[int] | torch.Tensor = (),
               generator: Generators = None, *, steps: int | None = None, faults: Faults | None = None) -> torch.Tensor:
        """The next token of each row (int64 [B]) from the model's scores ``logits`` [B, V]: every
        processor, then the draw. ``generated[b]``: the tokens row b has generated so far (may be empty
        lists when no rule needs them and ``steps`` gives their number). ``faults``: where a fault is noted
        instead of raised when the scores' values cannot be read for free (see :class:`Faults`).

        Raises:
            TxlError: non-finite scores or a row whose every token is banned; a generator list or
                ``generated`` whose length is not B.
        """
        if len(generated) != logits.size(0):
            raise TxlError(f"generated must hold one token list per row: {logits.size(0)} rows, "
                           f"{len(generated)} lists")
        constrained = logits
        for process in self.constraints(generated, end_ids, steps):
            constrained = process(constrained)
        if constrained is not logits:
            left = torch.isfinite(constrained).any(dim=-1) | ~torch.isfinite(logits).all(dim=-1)
            if faults is not None and not reads_values(logits):
                faults.note(~left, Faults.NO_TOKEN)
            elif not bool(left.all()):
                row = int((~left).nonzero()[0, 0])
                raise TxlError(f"the decoding rules leave no token to choose in row {row} after "
                               f"{len(generated[row]) if steps is None else steps} tokens (e.g. "
                               f"no_repeat_ngram_size {self.no_repeat_ngram_size} once every n-gram was used): "
                               "loosen them or generate fewer tokens")
        return _draw(constrained, self.temperature, self.top_k, self.top_p, generator, faults)


GREEDY = DecodingRules(temperature=0.0)
"""The arg max at every step, no other rule: the default of completions and summaries."""


def check_generators(generator: Generators, rows: int, row: str = "row") -> None:
    """Raise :class:`TxlError` unless ``generator`` is None, a ``torch.Generator`` or a sequence of
    ``rows`` of them (one per row; ``row`` names what a row is in the message, e.g. "prompt")."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if isinstance(generator, (str, bytes)) or not isinstance(generator, Sequence) or \
            not all(isinstance(g, torch.Generator) for g in generator):
        raise TxlError(f"generator must be a torch.Generator or a list of them (one per {row}), got "
                       f"{type(generator).__name__}")
    if len(generator) != rows:
        raise TxlError(f"give one generator per {row}: {rows} {row}s, {len(generator)} generators")


def check_end_ids(end_ids: Sequence[int], vocab_size: int | None) -> tuple[int, ...]:
    """``end_ids`` as a tuple of ints, each a token id in ``[0, vocab_size)`` (any int >= 0 when
    ``vocab_size`` is None).

    Raises:
        TxlError: an id that is not an integer or lies outside the vocabulary.
    """
    try:
        ids = tuple(operator.index(i) for i in end_ids)
    except TypeError:
        raise TxlError(f"end_ids must be a sequence of integer token ids, got {quoted(end_ids)}") from None
    outside = [i for i in ids if i < 0 or vocab_size is not None and i >= vocab_size]
    if outside:
        raise TxlError(f"end_ids must be token ids in [0, {vocab_size or 'vocab_size'}), got {outside[0]}")
    return ids


class Chooser:
    """A decoding's token chooser: :meth:`DecodingRules.choose` over the tokens each row has generated.

    It keeps those tokens on the host only when a rule reads them (:attr:`DecodingRules.needs_history`),
    else just their number, so that a step's tokens stay on the device; faults found on an accelerator are
    kept in :attr:`faults` until :meth:`check` (the decoder's loop calls it when it ends).
    """

    def __init__(self, batch: int, rules: DecodingRules, generator: Generators = None, end_ids: Sequence[int] = (),
                 vocab_size: int | None = None):
        self.rules, self.generator = rules, generator
        self.end_ids = check_end_ids(end_ids, vocab_size)
        check_generators(generator, batch)
        self.generated: list[list[int]] = [[] for _ in range(batch)]
        self.steps = 0
        self.faults = Faults()

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """int64 [B]: the next token of each row, drawn from ``logits`` [B, V]."""
        if isinstance(self.end_ids, tuple) and self.end_ids:  # once, not per step
            self.end_ids = torch.tensor(self.end_ids, dtype=torch.long).to(logits.device)
        token = self.rules.choose(logits, self.generated, self.end_ids, self.generator, steps=self.steps,
                                  faults=self.faults)
        self.steps += 1
        if self.rules.needs_history:
            for row, t in zip(self.generated, token.tolist()):
                row.append(t)
        return token

    def check(self) -> None:
        """Raise a fault noted on the device during the decoding (:meth:`Faults.check`)."""
        self.faults.check()


def rules_from(rules: DecodingRules | None, **fields) -> DecodingRules:
    """``rules``, or a :class:`DecodingRules` of the keyword ``fields`` (each None keeps its default) when
    it is None: the public decoders take either.

    Raises:
        TxlError: both ``rules`` and a field, an unknown field, or a setting out of range.
    """
    unknown = set(fields) - set(DecodingRules.__dataclass_fields__)
    if unknown:
        raise TxlError(f"unknown decoding rule(s) {', '.join(sorted(unknown))}: the rules are "
                       f"{', '.join(DecodingRules.__dataclass_fields__)}")
    given = {k: v for k, v in fields.items() if v is not None}
    if rules is None:
        return DecodingRules(**given)
    if given:
        raise TxlError(f"give the decoding rules either as rules=DecodingRules(...) or as keywords, not both "
                       f"({', '.join(sorted(given))} with rules)")
    if not isinstance(rules, DecodingRules):
        raise TxlError(f"rules must be a DecodingRules, got {type(rules).__name__}")
    return rules
