"""Token-by-token sampling that reuses the Transformer-XL memory instead of recomputing the context."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from txl.errors import TxlError
from txl.evaluation.segments import eval_mode, segments
from txl.model.attention import LayerCache, empty_caches
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
                 caches: list[LayerCache] | None = None, *, span: AttentionSpan | None = None) -> Mems | None:
    """Feed ``input_ids`` (int64 [B, T], T >= 0) through the model in segments of ``span.tgt_len`` and
    return the memory (``n_layer`` tensors [B, <= mem_len, d_model]; ``mems`` itself when T = 0).

    The segments go through :func:`txl.evaluation.segments.segments` (paper §3.2 recurrence), filling
    ``caches`` (the per-layer :class:`~txl.model.LayerCache` decoding state) when given. ``span``
    None: the model's training span.
    """
    span = resolve_span(model.config, span)
    for seg in segments(model, input_ids, span=span, mems=mems, caches=caches):
        mems = seg.output.mems
    return mems


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
    choose = _Chooser(input_ids.size(0), temperature, top_k, top_p, generator, repetition_penalty,
                      no_repeat_ngram_size, min_new_tokens, end_ids)
    with eval_mode(model):
        if model.config.attn_type == "abs":
            seq = input_ids
            for _ in range(max_new_tokens):
                logits = model(seq[:, -span.tgt_len:], span=span).logits[:, -1]
                token = choose(logits)
                seq = torch.cat([seq, token[:, None]], dim=1)
                yield token
            return
        # per-layer keys/values of the memory travel with it, so a step projects only the new token
        caches = empty_caches(model.config.n_layer)
        mems = prime_memory(model, input_ids[:, :-1], mems, caches, span=span)
        last = input_ids[:, -1:]
        for _ in range(max_new_tokens):
            out = model(last, mems=mems, caches=caches, span=span)
            mems = out.mems
            token = choose(out.logits[:, -1])
            last = token[:, None]
            yield token


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
             generator: Generators = None, *, span: AttentionSpan | None = None,
             tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
             same_length: bool | None = None, **rules) -> torch.Tensor:
    """Sample continuations of ``input_ids`` (int64 [B, T]); returns int64 [B, T + max_new_tokens].

    Memory-cached sampling as in :func:`generate_stream` (same span arguments and decoding ``rules``:
    ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``end_ids``); ``generator``
    makes it reproducible.

    Raises:
        TxlError: as :func:`generate_stream`.
    """
    tokens = list(generate_stream(model, input_ids, max_new_tokens, temperature, top_k, top_p, mems, generator,
                                  span=span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                                  same_length=same_length, **rules))
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


def complete(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 128, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: Generators = None,
             stop: Sequence[str] = (), min_new_tokens: int = 0, repetition_penalty: float = 1.0,
             no_repeat_ngram_size: int = 0, max_prompt_tokens: int = 0, span: AttentionSpan | None = None,
             mem_len: int | None = None) -> list[str]:
    """The completions of ``prompts`` by a model fine-tuned on prompt/completion pairs (``txl finetune``).

    Each prompt is fed as ``prompt + SEP`` (:mod:`txl.data.pairs`; only its last ``max_prompt_tokens``
    tokens when > 0), read segment by segment with the memory however long it is, and decoded until
    the end-of-completion marker, a ``stop`` string (not before ``min_new_tokens`` tokens) or
    ``max_new_tokens`` tokens; the text is returned without the marker or the stop string. Greedy
    by default (``temperature`` 0); the decoding rules are those of :func:`generate_stream`.
    ``generator`` is one for all prompts, or one per prompt.

    Raises:
        TxlError: a tokenizer without the markers (a model that was not fine-tuned), a prompt holding
            a marker, bad decoding settings.
    """
    from txl.data.pairs import encode_prompt, find_markers

    markers = find_markers(tokenizer)
    check_sampling(temperature, top_k, top_p)
    check_decoding(repetition_penalty, 0 if no_repeat_ngram_size is None else no_repeat_ngram_size, min_new_tokens)
    if max_new_tokens < 0:
        raise TxlError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if generator is not None and not isinstance(generator, torch.Generator) and len(generator) != len(prompts):
        raise TxlError(f"give one generator per prompt: {len(prompts)} prompts, {len(generator)} generators")
    device = next(model.parameters()).device
    texts = []
    for i, prompt in enumerate(prompts):
        ids = torch.as_tensor(encode_prompt(tokenizer, markers, prompt, max_prompt_tokens), device=device)[None]
        gen = generator if generator is None or isinstance(generator, torch.Generator) else [generator[i]]
        cut = StopText(stop)
        pieces, stream = [], tokenizer.text_stream()
        tokens = generate_stream(model, ids, max_new_tokens, temperature, top_k, top_p, generator=gen, span=span,
                                 mem_len=mem_len, repetition_penalty=repetition_penalty,
                                 no_repeat_ngram_size=no_repeat_ngram_size, min_new_tokens=min_new_tokens,
                                 end_ids=(markers.end_id,))
        for n, token in enumerate(tokens, 1):
            t = int(token[0])
            if t == markers.end_id:
                break
            cut.armed = n >= min_new_tokens
            pieces.append(cut.push(stream.push(t)))
            if cut.stopped:
                break
        if not cut.stopped:
            pieces.append(cut.push(stream.finish()) + cut.finish())
        texts.append("".join(pieces))
    return texts
