"""Token-by-token generation that reuses the Transformer-XL memory instead of recomputing the context,
for a batch of prompts of one length or of different lengths."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from txl.errors import TxlError
from txl.segments import eval_mode, segments
from txl.generation.sampling import Chooser, DecodingRules, Faults, Generators, rules_from
from txl.model.decoding import DecodingState
from txl.model.checks import check_input_ids
from txl.model.memory import Mems, check_mems, given_length
from txl.generation.compiled import RingDecoder
from txl.model.graphs import check_exportable
from txl.config import AttentionSpan, check_count, resolve_span
from txl.runtime import check_fits
from txl.kernels.cpu import check_reading_fits


@torch.no_grad()
def prime_memory(model, input_ids: torch.Tensor, mems: Mems | None = None,
                 caches: DecodingState | None = None, *, span: AttentionSpan | None = None) -> Mems | None:
    """Feed ``input_ids`` (int64 [B, T], T >= 0) through the model in segments of ``span.tgt_len`` and
    return the memory (``n_layer`` tensors [B, <= mem_len, d_model]; ``mems`` itself when T = 0).

    The segments go through :func:`txl.segments.segments` (paper §3.2 recurrence). With
    ``caches`` (a :class:`~txl.model.DecodingState`, whose span is then used) the state is filled
    instead and holds the memory: the return value is None once a segment was read. ``span`` None:
    the model's training span.
    """
    span = caches.span if caches is not None else resolve_span(model.config, span)
    check_reading_fits(model, input_ids, span, mems)
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


@dataclass
class GenerationStep:
    """One step of :func:`generate_steps`.

    Attributes:
        token: int64 [B] the sampled token of each row.
        logits: float [B, V] the model's scores for this step (before temperature, top-k/top-p and
            the decoding rules).
        faults: what the decoding noted on the device so far (:class:`~txl.generation.sampling.Faults`;
            None: nothing can be noted, e.g. on CPU, where faults raise at the step).
    """

    token: torch.Tensor
    logits: torch.Tensor
    faults: Faults | None = None

    def check(self) -> None:
        """Raise a fault the decoding noted on the device up to this step (one read of the device: free for
        a caller that reads the step's tokens anyway, as a consumer that may stop early does).

        Raises:
            TxlError: non-finite scores, or a row the decoding rules left without a token.
        """
        if self.faults is not None:
            self.faults.check()

    @property
    def logprob(self) -> torch.Tensor:
        """float64 [B]: log p(token | everything before it) in nats, under the model's distribution
        (temperature 1, before top-k/top-p and the decoding rules); computed when asked for."""
        return torch.log_softmax(self.logits.double(), dim=-1).gather(-1, self.token[:, None]).squeeze(-1)


def _step(choose: Chooser, token: torch.Tensor, logits: torch.Tensor, last: bool) -> GenerationStep:
    """The step of ``token`` drawn from ``logits``; the faults are checked first when it is the ``last`` one
    of the decoding (its consumer may never ask for more)."""
    if last:
        choose.check()
    return GenerationStep(token, logits, None if choose.faults.kind is None else choose.faults)


@torch.no_grad()
def generate_steps(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float | None = None,
                   top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
                   generator: Generators = None, *, span: AttentionSpan | None = None,
                   tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
                   same_length: bool | None = None, rules: DecodingRules | None = None,
                   end_ids: Sequence[int] = (), compile: bool | str = False, **rule_fields) -> Iterator[GenerationStep]:
    """Yield ``max_new_tokens`` :class:`GenerationStep` objects (the sampled tokens [B] and the scores
    they were drawn from), one forward of one token per step.

    For a model with memory ("rel", "shaw", "rope") the prompt (all but its last token) is fed once in chunks of ``tgt_len`` to
    build the memory; then each step feeds only the newest token with the memory (cost per token grows
    with ``mem_len``, not with the length of the text). ``attn_type="abs"`` has no memory: each step
    recomputes a sliding window of the last ``tgt_len`` tokens (the vanilla protocol).
    The model is put in eval mode for the duration and restored afterwards.

    ``span`` (None: the model's training span) with ``tgt_len``, ``mem_len``, ``clamp_len``,
    ``same_length`` overriding its fields (None keeps one) sets the priming segment length and the
    memory kept while sampling (e.g. a longer memory than in training, paper §3.2). ``model.config``
    is not changed.

    How each token is chosen: ``rules``, a :class:`~txl.generation.DecodingRules` (temperature, top-k,
    top-p, repetition penalty, no repeated n-grams, a minimum number of new tokens), or the same
    settings as keywords (``temperature``, ``top_k``, ``top_p`` and the ``rule_fields``
    ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``); the default samples at
    temperature 1. ``end_ids`` (e.g. the end-of-completion marker of :mod:`txl.data.pairs`) cannot be
    drawn before ``min_new_tokens`` tokens. The stream itself never stops early: the caller stops
    reading it (see :func:`complete`).

    No step reads a value back from the device (no host synchronisation per token) unless a rule needs
    the generated tokens on the host (repetition penalty, no repeated n-grams): on an accelerator,
    non-finite scores and rows the rules leave without a token are checked once, before the last step is
    yielded (on CPU at the step); a caller that may stop earlier and reads each step's tokens anyway
    calls :meth:`GenerationStep.check` with them. ``generator``: one, or one per row (:data:`Generators`).

    Prompts of different lengths: ``input_ids`` a list of int64 [T_b] tensors. Each prompt primes its
    own memory alone (:func:`prime_rows`); the memories are left-padded to one length and the
    padding is masked (``mem_padding``), so every row's tokens and scores are those it gets decoded
    alone (scores equal up to float rounding), with its own generator when ``generator`` is a list.
    ``mems`` must then be None. (``attn_type="abs"``: each row's window is read alone.)

    ``compile=True`` (or a ``torch.compile`` backend's name): the prompt is read into a decoding
    state without spare room and each step is taken by :class:`txl.generation.compiled.RingDecoder`'s step under
    ``torch.compile(fullgraph=True)``, whose state (the ring of keys and values, its write index and fill)
    reaches the graph as tensors of fixed shape, so the step compiles once for every memory fill; the
    tokens are those of the default path (scores equal to float rounding).
    For prompts of one length (``mems`` too: the last ``mem_len`` positions are kept), a model and span
    :func:`txl.model.graphs.check_exportable` accepts, with float32, float64 or int8 weights
    (:func:`txl.kernels.int8.quantize_int8`: the int8 products compile with the rest of the step).

    Raises:
        TxlError: ``input_ids`` that is not a non-empty integer tensor [batch, length] of ids in the
            vocabulary on the model's device (a Python list of ints, an empty batch or prompt), nor a
            list of such 1-D tensors; ``mems`` of another shape, dtype or device than the model's (see
            :meth:`~txl.model.TransformerXLLM.forward`), bad sampling settings or an impossible span.
    """
    input_ids, ragged = _check_arguments(model, input_ids, mems, max_new_tokens)
    max_new_tokens = int(max_new_tokens)  # (a numpy or 0-d tensor integer too)
    span = resolve_span(model.config, span, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                        same_length=same_length)
    rules = rules_from(rules, temperature=temperature, top_k=top_k, top_p=top_p, **rule_fields)
    choose = Chooser(len(input_ids), rules, generator, end_ids, vocab_size=model.config.vocab_size)
    if compile:
        _check_compilable(model, span, ragged)
    with eval_mode(model):
        if compile:  # the ring's state is tensors of fixed shape: one compiled step for every memory fill
            ring = _ring_decoder(model, input_ids, mems, span, compile, max_new_tokens)
            if ring is None:  # nothing to decode: nothing to compile
                return
            last = input_ids[:, -1:]
            for i in range(max_new_tokens):
                logits = ring.step(last)
                token = choose(logits)
                last = token[:, None]
                yield _step(choose, token, logits, i == max_new_tokens - 1)
            return
        if not model.config.has_memory:
            rows = [p[None] for p in input_ids] if ragged else [input_ids]
            for i in range(max_new_tokens):
                logits = torch.cat([model(seq[:, -span.tgt_len:], span=span).logits[:, -1] for seq in rows])
                token = choose(logits)
                rows = [torch.cat([seq, t[:, None]], dim=1) for seq, t in zip(rows, token.split(
                    [seq.size(0) for seq in rows]))]
                yield _step(choose, token, logits, i == max_new_tokens - 1)
            return
        state, mems, padding, last = _primed_state(model, input_ids, ragged, mems, span, max_new_tokens)
        for i in range(max_new_tokens):
            before = 0
            if padding is not None:  # the memory length before this step (the model checks the memory first)
                before = state.memory_length if state.length else (0 if mems is None else mems[0].size(1))
            out = model(last, mems=mems, caches=state, mem_padding=padding)
            mems = None  # from the first step on, the state holds the memory
            if padding is not None:  # positions that left the memory on the left are padding first
                padding = (padding - (before + 1 - state.memory_length)).clamp(min=0)
            token = choose(out.logits[:, -1])
            last = token[:, None]
            yield _step(choose, token, out.logits[:, -1], i == max_new_tokens - 1)


def _check_arguments(model, input_ids, mems: Mems | None,
                     max_new_tokens: int) -> tuple[torch.Tensor | list[torch.Tensor], bool]:
    """The arguments of :func:`generate_steps` that need no span nor rules, checked: returns ``(input_ids,
    ragged)`` as :func:`_check_prompts` does.

    Raises:
        TxlError: bad prompts, ``mems`` with prompts of different lengths or with a model without memory,
            a negative ``max_new_tokens``.
    """
    input_ids, ragged = _check_prompts(model, input_ids)
    if ragged and mems is not None:
        raise TxlError("prompts of different lengths start without a memory: pass mems=None")
    if not model.config.has_memory and mems is not None:
        raise TxlError("attn_type='abs' (vanilla Transformer) has no memory: pass mems=None")
    check_count(max_new_tokens, "max_new_tokens")
    return input_ids, ragged


def _check_compilable(model, span: AttentionSpan, ragged: bool) -> None:
    """Refuse what compiled decoding cannot take: ``ragged`` prompts (of different lengths), a model and
    ``span`` :func:`txl.model.graphs.check_exportable` refuses, half-precision weights or autocast.

    Raises:
        TxlError: one line naming what is refused.
    """
    if ragged:
        raise TxlError("compiled decoding takes prompts of one length")
    check_exportable(model.config, span, "compiled decoding", reader=False)
    weight = model.word_emb.emb_layers[0].weight
    if weight.dtype not in (torch.float32, torch.float64) or torch.is_autocast_enabled(weight.device.type):
        raise TxlError("compiled decoding takes float32, float64 or int8 weights without autocast: not "
                       "half-precision weights, nor torch.autocast")


def _ring_decoder(model, input_ids: torch.Tensor, mems: Mems | None, span: AttentionSpan, compile: bool | str,
                  max_new_tokens: int) -> RingDecoder | None:
    """The :class:`~txl.generation.compiled.RingDecoder` of compiled decoding (``compile``: True or a backend's
    name) that has read ``mems`` and all but the last token of ``input_ids`` (int64 [B, T]); None, once
    ``mems`` is checked, when ``max_new_tokens`` is 0 (nothing to decode: nothing to compile).

    Raises:
        TxlError: ``mems`` a forward refuses, a state the device's memory cannot hold.
    """
    weight = model.word_emb.emb_layers[0].weight
    if mems is not None:  # the checks of a forward with this memory (shape, dtype, device)
        check_mems(mems, model.config.n_layer, input_ids.size(0), model.config.d_model,
                   dtypes=(weight.dtype,), device=weight.device)
    if max_new_tokens == 0:
        return None
    check_state_fits(model, RingDecoder.state_for(model, span), len(input_ids))
    check_reading_fits(model, input_ids[:, :-1], span, mems)
    ring = RingDecoder(model, span, compile=compile)
    ring.read_prompt(input_ids[:, :-1], mems)
    return ring


def _primed_state(model, input_ids, ragged: bool, mems: Mems | None, span: AttentionSpan, max_new_tokens: int
                  ) -> tuple[DecodingState, Mems | None, torch.Tensor | None, torch.Tensor]:
    """The decoding state of :func:`generate_steps` for a model with memory, primed with all but the last
    token of each prompt (``input_ids``: int64 [B, T], or ``ragged``, a list of int64 [T_b]).

    Returns:
        ``(state, mems, padding, last)``: the state (:func:`step_state`); the memory of the first step
        (None when the state holds it); int64 [B] the padding positions of each row's memory (ragged
        prompts, :func:`prime_rows`; else None); int64 [B, 1] the last token of each prompt.

    Raises:
        TxlError: as :func:`step_state`.
    """
    # the memory lives in ring buffers of keys/values: a step projects and writes only the new token
    state = step_state(model, span, len(input_ids), given_length(mems) + max(map(len, input_ids)) + max_new_tokens)
    if ragged:  # each prompt primes its memory alone; left-padded to one length, the padding masked
        mems, padding = prime_rows(model, input_ids, span)
        last = torch.stack([p[-1:] for p in input_ids])
    else:
        mems, padding = prime_memory(model, input_ids[:, :-1], mems, state), None
        last = input_ids[:, -1:]
    return state, mems, padding, last

def step_state(model, span: AttentionSpan, batch_size: int, max_tokens: int) -> DecodingState:
    """A decoding state for one-token steps after a prompt (``max_tokens``: memory, prompt and new tokens),
    without spare room (steps read no segment views), refused when the memory available cannot hold it.

    Raises:
        TxlError: as :func:`check_state_fits`.
    """
    state = DecodingState(model.config.n_layer, span, keep_mems=False, max_tokens=max_tokens, spare_room=False)
    check_state_fits(model, state, batch_size)
    return state


def check_state_fits(model, state: DecodingState, batch_size: int) -> None:
    """Refuse a decoding ``state`` whose buffers for ``batch_size`` rows the available memory of the model's
    device cannot hold (:func:`txl.runtime.check_fits`).

    Raises:
        TxlError: one line naming ``mem_len``, the bytes needed and available.
    """
    weight = model.word_emb.emb_layers[0].weight
    check_fits(state.nbytes(model.config, batch_size, weight.element_size(), weight.device),
               f"a decoding state with mem_len {state.span.mem_len:,}",
               "use a smaller mem_len (or a shorter text, a smaller batch, fewer beams)", weight.device)


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, mems: Mems | None = None,
             generator: Generators = None, *, span: AttentionSpan | None = None,
             tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
             same_length: bool | None = None, rules: DecodingRules | None = None, end_ids: Sequence[int] = (),
             compile: bool | str = False, **rule_fields) -> torch.Tensor:
    """Sample continuations of ``input_ids`` (int64 [B, T]); returns int64 [B, T + max_new_tokens]
    (for a list of prompts of different lengths, a list of int64 [T_b + max_new_tokens]).

    Memory-cached sampling as in :func:`generate_steps` (same span arguments, decoding ``rules`` or
    their keywords, ``end_ids``, ``compile``); ``generator`` makes it reproducible.

    Raises:
        TxlError: as :func:`generate_steps`.
    """
    steps = generate_steps(model, input_ids, max_new_tokens, temperature, top_k, top_p, mems, generator, span=span,
                           tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length,
                           rules=rules, end_ids=end_ids, compile=compile, **rule_fields)
    tokens = [step.token for step in steps]
    if isinstance(input_ids, (list, tuple)):  # prompts of different lengths: one tensor each
        new = torch.stack(tokens, dim=1) if tokens else None
        return [p if new is None else torch.cat([p, new[b]]) for b, p in enumerate(input_ids)]
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
