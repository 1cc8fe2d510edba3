"""The serving engine: one model, one worker thread that runs every model call in turn, sessions, metrics.

Nothing here knows HTTP (see :mod:`txl.serving.app`): requests arrive as plain values, errors
leave as :class:`ServeError` with the HTTP status they stand for. All coroutines run on the
server's event loop; every model call is a job of the single :class:`ModelWorker` thread, so
calls of different requests never run at the same time, and a long generation is a sequence of
one-token jobs between which other requests' jobs run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from txl.data.tokenizers.incremental import TextCursor
from txl.errors import TxlError
from txl.evaluation.scoring import token_text
from txl.generation import check_sampling, generate_steps
from txl.model.span import AttentionSpan
from txl.runtime import autocast, out_of_memory
from txl.serving.sessions import SessionState, SessionStore, StoreFull, bits, read_tokens, session_memory_bytes

__all__ = ["ServeError", "SamplingParams", "Piece", "ModelWorker", "Metrics", "StopMatcher", "Engine"]


class ServeError(Exception):
    """A refused request: ``status`` (HTTP 4xx/5xx) and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: as :func:`txl.generation.sample_next` (``top_p`` None or 1: off), plus
    ``max_tokens`` to draw, ``stop`` strings that end the text, ``seed`` (None: random)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Piece:
    """One sampled token: its id, log-probability (nats) and the text it adds to the output ("" while
    a character or a possible stop string is incomplete)."""

    text: str
    token: int
    logprob: float


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
        """Queue ``fn(*args)``; returns its :class:`concurrent.futures.Future`."""
        with self._count:
            self.waiting += 1
        return self._pool.submit(self._call, fn, args)

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
        """Finish the queued jobs, then stop the thread."""
        self._pool.shutdown(wait=True)


class Metrics:
    """Request and token counters, and token throughput over a sliding window (seconds)."""

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.clock = window, clock
        self.started = clock()
        self.requests: Counter[str] = Counter()  # by route
        self.statuses: Counter[int] = Counter()
        self.in_flight = 0
        self.tokens_read = 0
        self.tokens_generated = 0
        self._recent: deque[tuple[float, int]] = deque()

    def add_tokens(self, read: int = 0, generated: int = 0) -> None:
        """Count tokens read (appended, prompts) and generated."""
        self.tokens_read += read
        self.tokens_generated += generated
        self._recent.append((self.clock(), read + generated))

    def tokens_per_s(self) -> float:
        """Tokens read + generated per second over the last ``window`` seconds (or since start)."""
        now = self.clock()
        while self._recent and self._recent[0][0] < now - self.window:
            self._recent.popleft()
        span = min(self.window, max(now - self.started, 1e-9))
        return sum(n for _, n in self._recent) / span


class StopMatcher:
    """Cuts streamed text at the first occurrence of any stop string.

    :meth:`push` returns the text that can be shown (text that may be the start of a stop string
    is held back) and whether a stop string was completed; the text before it is then the end.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text to emit, stopped)."""
        buf = self._held + text
        if not self.stops:
            return buf, False
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buf[:min(hits)], True
        keep = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def finish(self) -> str:
        """The held-back text when the output ends without a stop string."""
        held, self._held = self._held, ""
        return held


@dataclass
class Engine:
    """The model, its tokenizer and span, the worker thread, the sessions and the metrics of a server.

    Args:
        model: a :class:`~txl.model.TransformerXLLM` in eval mode (never changed).
        tokenizer: its tokenizer.
        span: the :class:`~txl.model.AttentionSpan` every request reads and samples with.
        dtype: "float32", or an autocast dtype.
        max_tokens: most tokens one request may generate.
        store: the session store.
        name: the model's name in responses.
    """

    model: Any
    tokenizer: Any
    span: AttentionSpan
    store: SessionStore
    dtype: str = "float32"
    max_tokens: int = 4096
    name: str = "txl"
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        self.device = next(self.model.parameters()).device
        self.worker = ModelWorker(self.device, self.dtype)
        c = self.model.config
        self.session_bytes = session_memory_bytes(c.n_layer, self.span.mem_len, c.d_model,
                                                  next(self.model.parameters()).dtype)

    # --- shared pieces -------------------------------------------------------------------------

    def check_sampling(self, p: SamplingParams) -> None:
        """Raise :class:`ServeError` 400 for sampling settings out of range."""
        if p.max_tokens > self.max_tokens:
            raise ServeError(400, f"max_tokens must be <= {self.max_tokens} (this server's --max-tokens), "
                                  f"got {p.max_tokens}")
        try:
            check_sampling(p.temperature, p.top_k, p.top_p)
        except TxlError as err:
            raise ServeError(400, str(err)) from None

    def encode(self, text: str) -> np.ndarray:
        """Token ids of a whole text (400 for text the tokenizer cannot encode)."""
        try:
            return np.asarray(self.tokenizer.encode(text), dtype=np.int64)
        except TxlError as err:
            raise ServeError(400, str(err)) from None

    def token_entries(self, ids, logprobs) -> list[dict[str, Any]]:
        """``[{"id", "text", "logprob"}]`` per token (logprob None where not scored)."""
        return [{"id": int(i), "text": token_text(self.tokenizer, int(i)), "logprob": None if lp != lp else float(lp)}
                for i, lp in zip(ids, logprobs)]

    async def read(self, state: SessionState, ids: np.ndarray) -> tuple[np.ndarray, SessionState]:
        """:func:`~txl.serving.sessions.read_tokens` on the worker; counts the tokens."""
        try:
            result = await self.worker.run(partial(read_tokens, span=self.span, dtype=self.dtype), self.model,
                                           state, ids)
        except TxlError as err:
            raise ServeError(400, str(err)) from None
        self.metrics.add_tokens(read=int(ids.size))
        return result

    async def sample(self, context: np.ndarray, mems, p: SamplingParams) -> AsyncIterator[Piece]:
        """Sample ``p.max_tokens`` tokens after ``context`` (int64 [T >= 1], the last tokens of the
        text, read with memory ``mems``): :func:`txl.generation.generate_steps` with a
        ``torch.Generator`` seeded with ``p.seed``, one worker job per token. Yields a :class:`Piece`
        per token; ends early at a stop string (the generator's last piece then has the text up to it).
        """
        generator = torch.Generator(device=self.device)
        generator.manual_seed(p.seed if p.seed is not None else torch.seed() % (2**63))
        ids = torch.as_tensor(context, device=self.device)[None]
        steps = generate_steps(self.model, ids, p.max_tokens, p.temperature, p.top_k, p.top_p, mems, generator,
                               span=self.span)
        text = self.tokenizer.text_stream()
        for i in context.tolist():
            text.push(i)  # the context's text: the output continues it
        matcher = StopMatcher(p.stop)
        self.metrics.add_tokens(read=int(context.size))
        try:
            for n in range(p.max_tokens):
                try:
                    step = await self.worker.run(next, steps, None)
                except TxlError as err:
                    raise ServeError(400, str(err)) from None
                token = int(step.token[0])
                self.metrics.add_tokens(generated=1)
                piece = text.push(token) + (text.finish() if n == p.max_tokens - 1 else "")
                shown, stopped = matcher.push(piece)
                if n == p.max_tokens - 1 and not stopped:
                    shown += matcher.finish()
                yield Piece(shown, token, float(step.logprob[0]))
                if stopped:
                    return
        finally:
            self.worker.submit(steps.close)  # on the worker: it may be running the generator now

    # --- sessions ------------------------------------------------------------------------------

    def new_session(self) -> dict[str, Any]:
        """Create a session; returns its description (503 when every slot is busy)."""
        try:
            session = self.store.create(SessionState(TextCursor(self.tokenizer)))
        except StoreFull as err:
            raise ServeError(503, str(err)) from None
        return self.describe(session)

    def session(self, session_id: str):
        """The session ``session_id`` or :class:`ServeError` 404."""
        session = self.store.get(session_id)
        if session is None:
            raise ServeError(404, f"no session {session_id!r}: it was never created, was deleted, or was dropped "
                                  f"after {self.store.idle_timeout:g} s idle or to make room for newer sessions")
        return session

    def describe(self, session) -> dict[str, Any]:
        """A session's id, length and memory use."""
        s = session.state
        return {"id": session.id, "object": "session", "n_tokens": s.n_tokens, "pending_text": s.cursor.pending,
                "memory_bytes": s.memory_bytes(), "idle_s": round(self.store.clock() - session.last_used, 3)}

    async def append(self, session_id: str, text: str, flush: bool = False) -> dict[str, Any]:
        """Append ``text`` to a session and score the tokens it decides (see :class:`TextCursor`)."""
        session = self.session(session_id)
        async with session.lock:
            state = session.state
            try:
                ids, cursor = state.cursor.feed(text, final=flush)
            except TxlError as err:
                raise ServeError(400, str(err)) from None
            logprobs, new = await self.read(state, ids)
            session.state = replace(new, cursor=cursor)
            session.last_used = self.store.clock()
            scored = int((~np.isnan(logprobs)).sum())
            surprise = bits(logprobs)
            return {**self.describe(session), "tokens": self.token_entries(ids, logprobs), "n_scored": scored,
                    "logprob": float(np.nansum(logprobs)), "surprise_bits": surprise,
                    "bits_per_token": surprise / scored if scored else None}

    async def generate(self, session_id: str, p: SamplingParams, append: bool = True) -> AsyncIterator[Piece | dict]:
        """Sample after a session's text, continuing its memory; yields :class:`Piece` objects, then the
        session's description (a dict). Pending text is first read as final. With ``append`` the
        sampled tokens (up to the one that completes a stop string) join the session (and the pending
        text is then read); without it, or when the generation does not finish (client gone), the
        session stays as it was, its pending text still pending."""
        self.check_sampling(p)
        session = self.session(session_id)
        async with session.lock:
            state = session.state
            ids, cursor = state.cursor.feed("", final=True)
            _, state = await self.read(state, ids)
            state = replace(state, cursor=cursor)
            if state.n_tokens == 0:
                raise ServeError(400, "the session holds no text yet: append some before generating")
            tokens = []
            async for piece in self.sample(state.tail, state.mems, p):
                tokens.append(piece.token)
                yield piece
            if append:  # without it the session keeps its text as it was, pending text included
                _, state = await self.read(state, np.asarray(tokens, dtype=np.int64))
                session.state = state
            session.last_used = self.store.clock()
            yield self.describe(session)

    def delete(self, session_id: str) -> dict[str, Any]:
        """Delete a session (404 when there is none)."""
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
