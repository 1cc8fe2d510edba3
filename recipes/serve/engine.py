"""The serving engine: one model, one worker thread that runs every model call in turn, sessions, metrics.

Nothing here knows HTTP (see :mod:`txl_recipes.serve.app`): requests arrive as plain values, errors
leave as :class:`ServeError` with the HTTP status they stand for. All coroutines run on the
server's event loop; every model call is a job of the single :class:`ModelWorker` thread, so
calls of different requests never run at the same time. No job is long: a generation is one job per
token, and a long text (an append, a prompt) is read in jobs of whole segments of about
``job_tokens`` tokens. A request has at most one job queued at a time and the queue is first in,
first out, so the requests in progress take turns (one client's megabyte cannot hold the others
for its whole reading). Work that is not the model's (tokenising a text, cutting at stop strings)
runs off the event loop too, which therefore only moves bytes and stays responsive.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from txl.config import check_weights_dtype, AttentionSpan
from txl.errors import TxlError, quoted
from txl.evaluation.scoring import token_text
from txl.generation import DecodingRules, StopText, generate_steps
from txl.runtime import autocast, out_of_memory
from txl_recipes.serve.cursor import TextCursor
from txl_recipes.serve.metrics import Metrics
from txl_recipes.serve.sessions import (Session, SessionState, SessionStore, StoreFull, bits, read_tokens,
                                  session_memory_bytes)

__all__ = ["ServeError", "SessionGone", "SamplingParams", "Piece", "ModelWorker", "Engine", "MAX_STOPS",
           "MAX_STOP_CHARS"]

MAX_STOPS = 4  #: most stop strings per request (as OpenAI's API)
MAX_STOP_CHARS = 1000  #: most characters in one stop string


class ServeError(Exception):
    """A refused request: ``status`` (HTTP 4xx/5xx) and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class SessionGone(ServeError):
    """404: the session was deleted while this request waited for it or ran on it."""

    def __init__(self, session_id: str) -> None:
        super().__init__(404, f"session {quoted(session_id)} was deleted while this request was waiting or running; "
                              "nothing of this request was kept")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``max_tokens`` to draw, the decoding ``rules`` (a
    :class:`~txl.generation.DecodingRules`: temperature, top-k, top-p, repetition penalty, no repeated
    n-grams; its ``min_new_tokens`` is the number of tokens before which ``stop`` strings do not count),
    ``stop`` strings that end the text, ``seed`` (None: random)."""

    max_tokens: int = 16
    rules: DecodingRules = DecodingRules()
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Piece:
    """One sampled token: its id, log-probability (nats), the text it adds to the output ("" while
    a character or a possible stop string is incomplete), and whether it completed a stop string
    (the generation's ``finish_reason`` is then "stop", even on the last allowed token)."""

    text: str
    token: int
    logprob: float
    stopped: bool = False


class ModelWorker:
    """One thread that runs model calls one at a time, in the order they were submitted.

    Each job runs without autograd and under the server's autocast ``dtype``.
    """

    def __init__(self, device: torch.device, dtype: str) -> None:
        self.device, self.dtype = device, dtype
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txl-model")
        self._count = threading.Lock()
        self.waiting = 0  # submitted, not started
        self.busy_s = 0.0  # seconds spent running jobs
        self.closed = False  # shut down: no new jobs

    def _call(self, fn: Callable, args: tuple) -> Any:
        with self._count:
            self.waiting -= 1
        start = time.perf_counter()
        try:
            with torch.no_grad(), autocast(self.device, self.dtype):
                return fn(*args)
        finally:
            self.busy_s += time.perf_counter() - start

    def submit(self, fn: Callable, *args):
        """Queue ``fn(*args)``; returns its :class:`concurrent.futures.Future`.

        Raises:
            ServeError: 503 once the worker is shut down (the server is stopping).
        """
        with self._count:
            self.waiting += 1
        try:
            if self.closed:
                raise RuntimeError("shut down")
            return self._pool.submit(self._call, fn, args)
        except RuntimeError:
            with self._count:
                self.waiting -= 1
            raise ServeError(503, "the server is shutting down") from None

    async def run(self, fn: Callable, *args) -> Any:
        """Run ``fn(*args)`` on the worker thread and return its result (or raise its exception; an
        allocation failure becomes :class:`ServeError` 503: the request, not the server, was too big
        for the memory left).

        A request cancelled while its job waits takes the job out of the queue.
        """
        future = self.submit(fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancel():
                with self._count:
                    self.waiting -= 1
            raise
        except (MemoryError, RuntimeError) as err:
            if out_of_memory(err):
                raise ServeError(503, "the server has not enough memory for this request now: send a shorter "
                                      "text, or retry when fewer sessions are open") from None
            raise

    def shutdown(self) -> None:
        """Finish the running job, drop the queued ones (their requests are gone), stop the thread."""
        self.closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class Engine:
    """The model, its tokenizer and span, the worker thread, the sessions and the metrics of a server.

    Args:
        model: a :class:`~txl.model.TransformerXLLM` in eval mode (never changed).
        tokenizer: its tokenizer.
        span: the :class:`~txl.model.AttentionSpan` every request reads and samples with.
        store: the session store.
        dtype: "float32", or an autocast dtype (half-precision weights take only their own).
        max_tokens: most tokens one request may generate.
        max_pending_bytes: most bytes (UTF-8) of undecided text a session may hold (see
            :class:`~.cursor.TextCursor`); an append that would leave more
            is refused with 413.
        max_request_tokens: most tokens one append or prompt may hold (413 beyond): bounds the
            memory of one request's answer (its per-token entries).
        job_tokens: about how many tokens one model job reads: longer texts are read in jobs of
            whole segments of about this size, between which other requests' jobs run.
        name: the model's name in responses.
        end_ids: where a sample ends, the token not shown (a fine-tuned model's end-of-completion marker,
            which ``rules.min_new_tokens`` holds back); finish_reason "stop".
        compile: sample through ``torch.compile`` (True, or a backend's name; see
            :func:`~txl.generation.generate_steps`): one graph for every memory fill, compiled by a warm-up
            request when the engine is made.

    Raises:
        TxlError: a ``dtype`` the weights cannot run with (:func:`txl.config.check_weights_dtype`), or
            ``compile`` with a half-precision ``dtype``.
    """

    model: Any
    tokenizer: Any
    span: AttentionSpan
    store: SessionStore
    dtype: str = "float32"
    max_tokens: int = 4096
    max_pending_bytes: int = 1 << 16
    max_request_tokens: int = 1 << 17
    job_tokens: int = 256
    name: str = "txl"
    metrics: Metrics = field(default_factory=Metrics)
    compile: bool | str = False
    end_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        weight = next(self.model.parameters())
        # refused here, not by every request: the pair would fail each model call
        check_weights_dtype(str(weight.dtype).removeprefix("torch."), self.dtype)
        self.device = weight.device
        self.worker = ModelWorker(self.device, self.dtype)
        c = self.model.config
        self.session_bytes = session_memory_bytes(c, self.span, next(self.model.parameters()).dtype,
                                                  self.max_pending_bytes)
        if self.compile and self.dtype != "float32":
            raise TxlError(f"compiled sampling takes float32 without autocast, not dtype {self.dtype!r}: drop "
                           "compile or the dtype")
        if self.compile:  # the step compiled now, not in the first user's request
            ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
            for _ in generate_steps(self.model, ids, 2, span=self.span, rules=DecodingRules(temperature=0),
                                    compile=self.compile):
                pass

    # --- shared pieces -------------------------------------------------------------------------

    def check_sampling(self, p: SamplingParams) -> None:
        """Raise :class:`ServeError` 400 for sampling settings out of range (``max_tokens`` above the
        server's bound, more than :data:`MAX_STOPS` stop strings, an empty one or one longer than
        :data:`MAX_STOP_CHARS` characters; the decoding rules checked themselves when made)."""
        if p.max_tokens > self.max_tokens:
            raise ServeError(400, f"max_tokens must be <= {self.max_tokens} (this server's --max-tokens), "
                                  f"got {p.max_tokens}")
        if len(p.stop) > MAX_STOPS:
            raise ServeError(400, f"stop takes at most {MAX_STOPS} strings, got {len(p.stop)}")
        for s in p.stop:
            if not s:
                raise ServeError(400, "a stop string must not be empty")
            if len(s) > MAX_STOP_CHARS:
                raise ServeError(400, f"a stop string may hold at most {MAX_STOP_CHARS} characters, got one of "
                                      f"{len(s):,}")
        if not isinstance(p.rules, DecodingRules):
            raise ServeError(400, "the decoding rules must be a DecodingRules")

    async def encode(self, text: str) -> np.ndarray:
        """Token ids of a whole text (400 for text the tokenizer cannot encode), encoded off the event loop."""
        try:
            ids = await asyncio.to_thread(self.tokenizer.encode, text)
        except TxlError as err:
            raise ServeError(400, str(err)) from None
        return np.asarray(ids, dtype=np.int64)

    def check_length(self, ids: np.ndarray, what: str, advice: str) -> None:
        """413 when ``ids`` holds more than ``max_request_tokens`` tokens (``what``: "this append", "the
        prompt"; ``advice``: what to do instead)."""
        if ids.size > self.max_request_tokens:
            raise ServeError(413, f"{what} holds {ids.size:,} tokens, over this server's limit of "
                                  f"{self.max_request_tokens:,} per request (--max-request-tokens): {advice}")

    def token_entries(self, ids, logprobs) -> list[dict[str, Any]]:
        """``[{"id", "text", "logprob"}]`` per token (logprob None where not scored)."""
        return [{"id": int(i), "text": token_text(self.tokenizer, int(i)), "logprob": None if lp != lp else float(lp)}
                for i, lp in zip(ids, logprobs)]

    def _job_size(self, state: SessionState, left: int) -> int:
        """Tokens of the next read job: whole segments of the session's grid, about ``job_tokens``."""
        budget = max(1, self.job_tokens // self.span.tgt_len) * self.span.tgt_len
        return min(left, budget + 1 - state.tail.size)  # ends on the grid: the next job re-reads nothing

    async def read(self, state: SessionState, ids: np.ndarray,
                   session: Session | None = None) -> tuple[np.ndarray, SessionState]:
        """:func:`~txl_recipes.serve.sessions.read_tokens` on the worker, in jobs of whole segments (about
        ``job_tokens`` tokens each; the scores equal one read of the whole, see
        :mod:`txl_recipes.serve.sessions`), so other requests' jobs run between them. Counts the tokens.

        Args:
            state: the session state to read on from. ids: int64 [k] token ids.
            session: the session the state belongs to (checked for deletion after every job), or None.

        Returns:
            (float64 [k] log-probabilities in nats, NaN for a stream's very first token; the new state).

        Raises:
            ServeError: 400 for ids outside the vocabulary or non-finite scores; 404 when ``session``
                is deleted meanwhile (its result would be lost).
        """
        if ids.size == 0:
            return np.zeros(0, dtype=np.float64), state
        parts, done = [], 0
        while True:
            n = self._job_size(state, ids.size - done)
            try:
                lp, state = await self.worker.run(partial(read_tokens, span=self.span, dtype=self.dtype), self.model,
                                                  state, ids[done:done + n])
            except TxlError as err:
                raise ServeError(400, str(err)) from None
            parts.append(lp)
            done += n
            self.metrics.add_tokens(read=n)
            if session is not None and session.deleted:
                raise SessionGone(session.id)
            if done >= ids.size:
                return np.concatenate(parts), state

    async def sample(self, context: np.ndarray, mems, p: SamplingParams,
                     session: Session | None = None) -> AsyncIterator[Piece]:
        """Sample ``p.max_tokens`` tokens after ``context`` (int64 [T >= 1], the last tokens of the
        text, read with memory ``mems``): :func:`txl.generation.generate_steps` with a
        ``torch.Generator`` seeded with ``p.seed``, one worker job per token. Each job also decodes the
        token and cuts the text at the stop strings (:class:`~txl.generation.StopText`), so nothing
        of that work runs on the event loop. Yields a :class:`Piece` per token; ends early at a stop
        string (the last piece then has the text up to it and ``stopped``).

        Raises:
            ServeError: 400 for a refused setting; :class:`SessionGone` when ``session`` is deleted
                between two tokens.
        """
        generator = torch.Generator(device=self.device)
        generator.manual_seed(p.seed if p.seed is not None else torch.seed() % (2**63))
        ids = torch.as_tensor(context, device=self.device)[None]
        steps = generate_steps(self.model, ids, p.max_tokens, mems=mems, generator=generator, span=self.span,
                               rules=p.rules, end_ids=self.end_ids, compile=self.compile)
        text = self.tokenizer.text_stream()
        cut = StopText(p.stop)
        self.metrics.add_tokens(read=int(context.size))
        try:
            for n in range(p.max_tokens):
                try:
                    cut.armed = n + 1 >= p.rules.min_new_tokens  # stops count from min_tokens tokens on
                    piece = await self.worker.run(_next_piece, steps, text, cut, context if n == 0 else None,
                                                  n == p.max_tokens - 1, self.end_ids)
                except TxlError as err:
                    raise ServeError(400, str(err)) from None
                self.metrics.add_tokens(generated=1)
                if session is not None and session.deleted:
                    raise SessionGone(session.id)
                yield piece
                if piece.stopped:
                    return
        finally:
            with contextlib.suppress(ServeError):  # a stopping server drops the generator unclosed
                self.worker.submit(steps.close)  # on the worker: it may be running the generator now

    # --- sessions ------------------------------------------------------------------------------

    def new_session(self) -> dict[str, Any]:
        """Create a session; returns its description (503 when every slot is busy)."""
        try:
            session = self.store.create(SessionState(TextCursor(self.tokenizer)))
        except StoreFull as err:
            raise ServeError(503, str(err)) from None
        return self.describe(session)

    def session(self, session_id: str) -> Session:
        """The session ``session_id`` or :class:`ServeError` 404."""
        session = self.store.get(session_id)
        if session is None:
            raise ServeError(404, f"no session {quoted(session_id)}: it was never created, was deleted, or was dropped "
                                  f"after {self.store.idle_timeout:g} s idle or to make room for newer sessions")
        return session

    @contextlib.asynccontextmanager
    async def using(self, session_id: str) -> AsyncIterator[Session]:
        """Hold a session for one request: counted as in use from now (a session with requests queued
        or running is never evicted or expired), then its lock, in arrival order.

        Raises:
            ServeError: 404 when there is no such session, or :class:`SessionGone` when it was
                deleted while the request waited.
        """
        session = self.session(session_id)
        session.users += 1
        try:
            async with session.lock:
                if session.deleted:
                    raise SessionGone(session.id)
                yield session
        finally:
            session.users -= 1
            session.last_used = self.store.clock()

    def describe(self, session: Session) -> dict[str, Any]:
        """A session's id, length and memory use."""
        s = session.state
        return {"id": session.id, "object": "session", "n_tokens": s.n_tokens, "pending_text": s.cursor.pending,
                "memory_bytes": s.memory_bytes(), "idle_s": round(self.store.clock() - session.last_used, 3)}

    async def _feed(self, cursor: TextCursor, text: str, final: bool) -> tuple[np.ndarray, TextCursor]:
        """``cursor.feed`` off the event loop; 400 for text the tokenizer cannot encode, 413 for more
        pending text than ``max_pending_bytes``."""
        try:
            ids, new = await asyncio.to_thread(cursor.feed, text, final)
        except TxlError as err:
            raise ServeError(400, str(err)) from None
        pending = len(new.pending.encode("utf-8", "surrogatepass"))
        if pending > self.max_pending_bytes:
            raise ServeError(413, f"this append would leave {pending:,} bytes of undecided text pending in the "
                                  f"session (for a {self.tokenizer.kind} tokenizer: {_PENDING[self.tokenizer.kind]}), "
                                  f"over this server's limit of {self.max_pending_bytes:,} (--max-pending-bytes); "
                                  "send text that ends it, or append with flush")
        return ids, new

    async def append(self, session_id: str, text: str, flush: bool = False) -> dict[str, Any]:
        """Append ``text`` to a session and score the tokens it decides (see :class:`TextCursor`);
        ``flush`` reads the pending text as if the stream ended. Returns the session's description with
        ``tokens`` (an entry per decided token), ``n_scored``, ``logprob`` (nats), ``surprise_bits`` and
        ``bits_per_token``. A refused or failed append leaves the session as it was.

        Raises:
            ServeError: 404 (no such session, or deleted meanwhile), 400 (text the tokenizer cannot
                encode), 413 (over ``max_request_tokens`` or ``max_pending_bytes``), 503 (out of memory).
        """
        async with self.using(session_id) as session:
            state = session.state
            ids, cursor = await self._feed(state.cursor, text, flush)
            self.check_length(ids, "this append", "send the text in several appends (a session reads them exactly as "
                                                  "one)")
            logprobs, new = await self.read(state, ids, session)
            session.state = replace(new, cursor=cursor)
            scored = int((~np.isnan(logprobs)).sum())
            surprise = bits(logprobs)
            entries = await asyncio.to_thread(self.token_entries, ids, logprobs)
            return {**self.describe(session), "tokens": entries, "n_scored": scored,
                    "logprob": float(np.nansum(logprobs)), "surprise_bits": surprise,
                    "bits_per_token": surprise / scored if scored else None}

    async def generate(self, session_id: str, p: SamplingParams, append: bool = True) -> AsyncIterator[Piece | dict]:
        """Sample after a session's text, continuing its memory; yields :class:`Piece` objects, then the
        session's description (a dict). Pending text is first read as final. With ``append`` the
        sampled tokens (up to the one that completes a stop string) join the session (and the pending
        text is then read); without it, or when the generation does not finish (client gone), the
        session stays as it was, its pending text still pending.

        Raises:
            ServeError: 400/404 as the other session requests; :class:`SessionGone` when the session is
                deleted during the generation (nothing more is sampled).
        """
        self.check_sampling(p)
        async with self.using(session_id) as session:
            state = session.state
            ids, cursor = await self._feed(state.cursor, "", True)
            _, state = await self.read(state, ids, session)
            state = replace(state, cursor=cursor)
            if state.n_tokens == 0:
                raise ServeError(400, "the session holds no text yet: append some before generating")
            tokens = []
            async for piece in self.sample(state.tail, state.mems, p, session):
                tokens.append(piece.token)
                yield piece
            if append:  # without it the session keeps its text as it was, pending text included
                _, state = await self.read(state, np.asarray(tokens, dtype=np.int64), session)
                session.state = state
            yield self.describe(session)

    def delete(self, session_id: str) -> dict[str, Any]:
        """Delete a session at once (404 when there is none). Requests queued on it get 404; one in
        progress stops at its next model job (a streamed generation ends with a ``session_deleted`` event)."""
        if not self.store.delete(session_id):
            self.session(session_id)  # raises the 404
        return {"id": session_id, "object": "session", "deleted": True}

    # --- stateless -----------------------------------------------------------------------------

    async def score_prompt(self, ids: np.ndarray) -> tuple[np.ndarray, SessionState]:
        """Log-probabilities of a whole prompt read from an empty memory (as ``txl score --carry-memory``
        reads one stream) and the state after it."""
        return await self.read(SessionState(TextCursor(self.tokenizer)), ids)

    def stats(self) -> dict[str, Any]:
        """The metrics endpoint's numbers."""
        m = self.metrics
        self.store.expire()
        return {"uptime_s": round(m.clock() - m.started, 3), "requests": dict(m.requests),
                "responses_by_status": {str(k): v for k, v in sorted(m.statuses.items())},
                "requests_in_flight": m.in_flight, "queue_length": self.worker.waiting,
                "tokens_read": m.tokens_read, "tokens_generated": m.tokens_generated,
                "tokens_per_s": round(m.tokens_per_s(), 3), "tokens_per_s_window_s": m.window,
                "model_busy_s": round(self.worker.busy_s, 3),
                "sessions": len(self.store), "max_sessions": self.store.max_sessions,
                "session_idle_timeout_s": self.store.idle_timeout, "sessions_evicted": self.store.evicted,
                "sessions_expired": self.store.expired, "session_memory_bytes": self.store.memory_bytes(),
                "session_memory_bytes_max_each": self.session_bytes}


_PENDING = {"byte": "none", "char": "a trailing carriage return", "word": "the line not yet ended",
            "bpe": "the text after the last line start"}


def _next_piece(steps, text, cut: StopText, context: np.ndarray | None, last: bool, end: tuple[int, ...] = ()) -> Piece:
    """One token of :meth:`Engine.sample`, on the worker thread: draw it, decode it after the text so far
    (``context``: the tokens before the sample, given with the first token), cut at the stop strings;
    one of ``end`` ends the sample without adding text."""
    if context is not None:
        for i in context.tolist():
            text.push(i)  # the context's text: the output continues it
    step = next(steps)
    token = int(step.token[0])
    step.check()  # a fault noted on the device (its value is read with the token's, no further wait)
    if token in end:
        shown = cut.push(text.finish())
        return Piece(shown if cut.stopped else shown + cut.finish(), token, float(step.logprob[0]), True)
    shown = cut.push(text.push(token) + (text.finish() if last else ""))
    if last and not cut.stopped:
        shown += cut.finish()
    return Piece(shown, token, float(step.logprob[0]), cut.stopped)
