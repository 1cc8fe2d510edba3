"""Text out: stop strings, decoding prompts to texts in batches or with beams, and the completions of a
model fine-tuned on prompt/completion pairs."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice

import torch

from txl.errors import TxlError
from txl.generation.beam import beam_search
from txl.generation.sampling import DecodingRules, Generators, check_end_ids, check_generators, rules_from
from txl.generation.stream import generate_steps
from txl.config import AttentionSpan


class StopText:
    """Cuts streamed text at the first of some stop strings, in time linear in the text.

    :meth:`push` takes the text pieces of a stream (e.g. from :func:`stream_text`) and returns the
    text that can be shown: only a tail that is the start of a stop string is held back, until it
    cannot be one any more. Once a stop string has appeared, :attr:`stopped` is True and the text
    before it is all that was ever returned (the stop string is not shown). Concatenated, the
    returned pieces and :meth:`finish` equal the whole text cut before the stop string that is
    complete first (of those complete at the same character, the longest), the whole text when none
    appears; how the text is cut into pieces does not matter.

    Each stop string is followed by a Knuth-Morris-Pratt automaton (its prefix function, computed
    once), so a character costs amortised O(1) per stop string whatever the stops' lengths: the
    text is read once, never searched again from an earlier position, and a held-back character is
    stored once and leaves once (no copying of the held text per piece).

    The one stop matcher of txl: ``txl generate``/``summarize``/:func:`continue_texts` and
    ``txl serve`` all cut with it.

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
        self._held: deque[str] = deque()  # characters not shown yet: each enters and leaves once
        self._fail = [_prefix_function(s) for s in self.stops]
        self._state = [0] * len(self.stops)  # characters of each stop matched by the end of the text

    def push(self, piece: str) -> str:
        """The text of ``piece`` (with what was held back) that can be shown now."""
        if self.stopped:
            return ""
        held = self._held
        if not (self.armed and self.stops):
            out = "".join(held) + piece
            held.clear()
            self._state = [0] * len(self.stops)
            return out
        stops, fail, state = self.stops, self._fail, self._state
        for ch in piece:
            held.append(ch)
            done = 0  # the longest stop complete at this character
            for k, s in enumerate(stops):
                q = state[k]
                while q and s[q] != ch:
                    q = fail[k][q - 1]
                if s[q] == ch:
                    q += 1
                if q == len(s):
                    done = max(done, q)
                    q = fail[k][q - 1]
                state[k] = q
            if done:
                self.stopped = True
                out = "".join(islice(held, len(held) - done))
                held.clear()
                return out
        keep = max(state)  # the longest tail that may still become a stop string
        return "".join(held.popleft() for _ in range(len(held) - keep))

    def finish(self) -> str:
        """What is still held back (the stream ended without a stop string there)."""
        held = "".join(self._held)
        self._held.clear()
        return "" if self.stopped else held


def _prefix_function(s: str) -> list[int]:
    """``pi[i]``: length of the longest proper prefix of ``s[:i + 1]`` that is also its suffix (KMP)."""
    pi = [0] * len(s)
    q = 0
    for i in range(1, len(s)):
        while q and s[i] != s[q]:
            q = pi[q - 1]
        if s[i] == s[q]:
            q += 1
        pi[i] = q
    return pi


def continue_texts(model, tokenizer, prompts: Sequence[torch.Tensor], *, max_new_tokens: int = 128,
                   rules: DecodingRules | None = None, generator: Generators = None, stop: Sequence[str] = (),
                   end_ids: Sequence[int] = (), num_beams: int = 1, length_penalty: float = 1.0, batch_size: int = 8,
                   span: AttentionSpan | None = None, mem_len: int | None = None,
                   ended: list | None = None, **rule_fields) -> list[str]:
    """The text each prompt (int64 [T_b] ids, lengths may differ) continues with, decoded until one of
    ``end_ids`` (not returned), a ``stop`` string (cut before it; stops count from ``rules.min_new_tokens``
    tokens on) or ``max_new_tokens`` tokens.

    ``rules``: the :class:`~txl.generation.DecodingRules`, or its fields as keywords (``rule_fields``:
    ``temperature``, ``min_new_tokens``, ...; not both). Completions are greedy unless told otherwise:
    with neither, :data:`~txl.generation.GREEDY`; keywords without ``temperature`` are greedy too
    (``rules=DecodingRules(...)`` takes that class's defaults, temperature 1).
    ``num_beams`` 1: up to ``batch_size`` prompts are decoded together (:func:`generate_steps` with
    prompts of different lengths), each exactly as alone; give ``generator`` as one generator per
    prompt for sampling that does not depend on the batching. ``num_beams`` > 1: :func:`beam_search`
    for each prompt (the rules' temperature, top-k and top-p and ``generator`` are not used).
    ``ended`` (a list) receives, per prompt, whether its text ended at one of ``end_ids`` or a stop
    string (False: cut at ``max_new_tokens``).

    Raises:
        TxlError: bad settings, a generator list whose length is not the number of prompts.
    """
    StopText(stop)
    if batch_size < 1:
        raise TxlError(f"batch_size must be >= 1, got {batch_size}")
    check_generators(generator, len(prompts), "prompt")
    if rules is None:  # greedy unless a temperature is given
        rules = rules_from(None, **{**rule_fields, "temperature": rule_fields.get("temperature") or 0.0})
    else:
        rules = rules_from(rules, **rule_fields)
    end = set(check_end_ids(end_ids, model.config.vocab_size))
    texts: list[str] = []
    if num_beams > 1:
        for p in prompts:
            result = beam_search(model, p[None], num_beams, max_new_tokens, length_penalty=length_penalty,
                                 end_ids=tuple(end), rules=rules, span=span, mem_len=mem_len)
            texts += _cut_texts(tokenizer, [iter(result.tokens.tolist())], end, stop, rules.min_new_tokens, ended)
        return texts
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start:start + batch_size])
        gen = generator if generator is None or isinstance(generator, torch.Generator) else \
            list(generator[start:start + batch_size])
        steps = generate_steps(model, chunk, max_new_tokens, generator=gen, span=span, mem_len=mem_len,
                               rules=rules, end_ids=tuple(end))
        texts += _cut_texts(tokenizer, _Columns(steps, len(chunk)).rows(), end, stop, rules.min_new_tokens, ended)
    return texts


class _Columns:
    """The rows of a batched stream of :class:`~txl.generation.stream.GenerationStep` (int64 [B] tokens per
    step), each read one token at a time; a step is computed only when a row that is still being read needs
    its next token, and its faults are checked as its tokens are read (the reading may stop early)."""

    def __init__(self, steps: Iterator, n: int) -> None:
        self.steps, self.buffer = steps, [[] for _ in range(n)]

    def rows(self) -> list[Iterator[int]]:
        return [self._row(b) for b in range(len(self.buffer))]

    def _row(self, b: int) -> Iterator[int]:
        while True:
            if not self.buffer[b]:
                step = next(self.steps, None)
                if step is None:
                    return
                for row, t in zip(self.buffer, step.token.tolist()):
                    row.append(t)
                step.check()
            yield self.buffer[b].pop(0)


def _cut_texts(tokenizer, rows: list[Iterator[int]], end: set, stop: Sequence[str], min_new_tokens: int,
               ended: list | None = None) -> list[str]:
    """Decode each row's tokens until an end id or a stop string (see :func:`continue_texts`); ``ended``
    receives whether each row ended so (not at its last allowed token)."""
    cuts = [StopText(stop) for _ in rows]
    streams = [tokenizer.text_stream() for _ in rows]
    pieces: list[list[str]] = [[] for _ in rows]
    active = list(range(len(rows)))
    at_end = [False] * len(rows)
    n = 0
    while active:
        n += 1
        for b in list(active):
            t = next(rows[b], None)
            if t is None or t in end:
                at_end[b] = t is not None
                active.remove(b)
                continue
            cuts[b].armed = n >= min_new_tokens
            pieces[b].append(cuts[b].push(streams[b].push(t)))
            if cuts[b].stopped:
                at_end[b] = True
                active.remove(b)
    if ended is not None:
        ended.extend(at_end)
    return ["".join(p) + ("" if c.stopped else c.push(s.finish()) + c.finish())
            for p, c, s in zip(pieces, cuts, streams)]


def complete(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 128, max_prompt_tokens: int = 0,
             **settings) -> list[str]:
    """The completions of ``prompts`` by a model fine-tuned on prompt/completion pairs (``txl finetune``).

    Each prompt is fed as ``prompt + SEP`` (:mod:`txl.data.pairs`; only its last ``max_prompt_tokens``
    tokens when > 0), read segment by segment with the memory however long it is, and decoded until
    the end-of-completion marker, a ``stop`` string or ``max_new_tokens`` tokens, by
    :func:`continue_texts` (whose keyword ``settings`` apply: ``rules`` or their fields, greedy by default,
    ``num_beams``, ``batch_size``, ``generator`` one per prompt ...). Returns the texts without
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
