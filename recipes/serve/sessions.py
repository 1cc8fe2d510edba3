"""Server sessions: a text stream whose Transformer-XL memory persists between requests.

A session reads its text exactly as ``txl score --carry-memory`` reads one long stream (paper §3.2,
the evaluation procedure): the stream's inputs are cut into segments of ``tgt_len`` tokens starting
at the first token, each read with the memory of the previous one. Appending text must give the
scores of that reading whatever the sizes of the pieces, so the session keeps the grid:

- ``mems``: the memory after the last *complete* segment of the grid (``n_layer`` tensors
  [1, <= mem_len, d_model]);
- ``tail``: the tokens after it (1 to ``tgt_len`` tokens once the stream has begun): the inputs of
  the unfinished segment, plus the stream's last token, which is the next segment's first input.

Appending k tokens reads the tail's inputs again together with the new tokens: complete segments
move the memory on, an unfinished last one gives the scores of its tokens and is read again by
the next append. Causal attention makes a token's score in an unfinished segment equal to its
score in the complete one (same memory, same earlier tokens, same relative distances; the
``same_length`` mask does not depend on the segment's length), so the scores equal the whole
stream's, and each append costs k + at most ``tgt_len`` - 1 tokens of reading, whatever the length
of the history. A session's state is a value: every operation returns a new one, so a request
that fails leaves its session as it was.

Text is tokenised with a :class:`~.cursor.TextCursor` (text that later
text could still tokenise differently waits, pending).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from txl.errors import TxlError
from txl.segments import segments
from txl.model.memory import Mems
from txl.config import AttentionSpan
from txl.kernels.cpu import check_reading_fits
from txl_recipes.serve.config import ServeConfig
from txl_recipes.serve.cursor import TextCursor

__all__ = ["SessionState", "Session", "SessionStore", "StoreFull", "read_tokens", "session_memory_bytes"]


@dataclass(frozen=True)
class SessionState:
    """The state of one session (immutable: operations return a new state).

    Attributes:
        cursor: the tokenising state of the session's text (its pending text).
        mems: memory after the last complete segment, ``n_layer`` tensors [1, <= mem_len, d_model], or None.
        tail: int64 [t] tokens after that segment (t in [1, tgt_len] once the stream has begun, else 0).
        n_tokens: tokens in the stream so far.
    """

    cursor: TextCursor
    mems: Mems | None = None
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    n_tokens: int = 0

    def memory_bytes(self) -> int:
        """Bytes held by this state: the memory tensors, the tail ids and the pending text (UTF-8)."""
        mem = sum(m.numel() * m.element_size() for m in self.mems) if self.mems is not None else 0
        return int(mem + self.tail.nbytes + len(self.cursor.pending.encode("utf-8", "surrogatepass")))


def session_memory_bytes(config, span: AttentionSpan, dtype: torch.dtype = torch.float32,
                         max_pending_bytes: int = 0) -> int:
    """Upper bound of the bytes one session holds (what :meth:`SessionState.memory_bytes` counts).

    Per layer, a [1, slots, d_model] memory with ``slots = mem_len`` plus, for a compressed memory,
    ``cmem_len`` compressed slots and at most ``cmem_ratio - 1`` states pending compression; then
    the tail ids (at most ``tgt_len``, int64) and the pending text (at most ``max_pending_bytes``).

    Args:
        config: the model's config (``n_layer``, ``d_model``, ``cmem_ratio``).
        span: the span the session reads with (``mem_len``, ``cmem_len``, ``tgt_len``).
        dtype: the dtype of the memory tensors (the parameters').
    """
    slots = span.mem_len + (span.cmem_len + config.cmem_ratio - 1 if span.cmem_len else 0)
    tensors = config.n_layer * slots * config.d_model * torch.empty(0, dtype=dtype).element_size()
    return tensors + span.tgt_len * 8 + max_pending_bytes


@torch.no_grad()
def read_tokens(model, state: SessionState, ids: np.ndarray, *, span: AttentionSpan,
                dtype: str = "float32") -> tuple[np.ndarray, SessionState]:
    """Append the token ids ``ids`` (int64 [k]) to the session's stream and score them.

    Returns:
        (float64 [k] log p(ids[i] | everything before it) in nats, NaN for the stream's very first
        token; the new state, with ``cursor`` unchanged).

    Raises:
        TxlError: ids outside the vocabulary, or non-finite scores (broken weights, float16 overflow).
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= model.config.vocab_size):
        raise TxlError(f"token id outside the vocabulary [0, {model.config.vocab_size})")
    if ids.size == 0:
        return np.zeros(0, dtype=np.float64), state
    stream = np.concatenate([state.tail, ids])
    old = state.tail.size
    n_in = stream.size - 1
    logprobs = np.full(stream.size, np.nan)  # logprobs[j]: score of stream[j]
    mems = state.mems
    if n_in > 0:
        device = next(model.parameters()).device
        inputs = torch.from_numpy(stream[:-1]).to(device)[None]
        labels = torch.from_numpy(stream[1:]).to(device)[None]
        check_reading_fits(model, inputs, span, state.mems, dtype=dtype)
        for seg in segments(model, inputs, labels, span=span, mems=state.mems, dtype=dtype):
            cols = slice(seg.start + 1, seg.start + 1 + seg.inputs.size(1))
            logprobs[cols] = -seg.output.token_loss[0].detach().to(torch.float64).cpu().numpy()
            if seg.inputs.size(1) == span.tgt_len:  # a complete segment of the grid: the memory moves on
                mems = seg.output.mems
    new = logprobs[old:]
    if not np.isfinite(new[1:] if old == 0 else new).all():  # only the stream's first token is unscored
        raise TxlError("the model produced non-finite log-probabilities (NaN or inf): its weights are broken, or "
                       "float16 overflowed (use --dtype float32)")
    done = (n_in // span.tgt_len) * span.tgt_len
    return new, replace(state, mems=mems, tail=stream[done:].copy(), n_tokens=state.n_tokens + ids.size)


class StoreFull(Exception):
    """Every session slot is taken by a session with a request in progress (none can be evicted)."""


@dataclass
class Session:
    """One session of a :class:`SessionStore`: its id, state, times (seconds), request lock, the
    number of requests holding or waiting for it (``users``) and whether it was deleted.

    A session with ``users`` cannot be evicted or expire. They are counted from the moment a request finds
    the session, not only while it holds the lock: a lock alone misses the requests waiting for it and the
    moment between one request's release and the next one's acquire."""

    id: str
    state: SessionState
    created: float
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    deleted: bool = False


class SessionStore:
    """Sessions by id, bounded in number and idle time, least recently used evicted first.

    Used from the server's event loop only (not thread-safe). Ids are 128-bit random strings, so
    one client cannot guess another's session.

    Args:
        max_sessions: most sessions kept (>= 1); creating one more evicts the least recently used
            session that has no request in progress.
        idle_timeout: seconds after its last use at which a session is dropped (> 0).
        clock: the time source in seconds (monotonic).
    """

    def __init__(self, max_sessions: int, idle_timeout: float, clock=time.monotonic) -> None:
        ServeConfig(max_sessions=max_sessions, idle_timeout=idle_timeout).check()
        self.max_sessions, self.idle_timeout, self.clock = max_sessions, float(idle_timeout), clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self.evicted = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, state: SessionState) -> Session:
        """Add a session holding ``state``; returns it.

        Raises:
            StoreFull: ``max_sessions`` sessions exist and all of them have a request in progress.
        """
        self.expire()
        while len(self._sessions) >= self.max_sessions:
            victim = next((s for s in self._sessions.values() if not s.users), None)
            if victim is None:
                raise StoreFull(f"all {self.max_sessions} sessions are in use; try again later")
            del self._sessions[victim.id]
            victim.deleted = True
            self.evicted += 1
        now = self.clock()
        session = Session(secrets.token_urlsafe(16), state, created=now, last_used=now)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        """The session ``session_id`` (marked as just used), or None when there is none (never
        created, deleted, expired or evicted)."""
        self.expire()
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_used = self.clock()
            self._sessions.move_to_end(session_id)
        return session

    def delete(self, session_id: str) -> bool:
        """Remove a session, marked ``deleted`` for the requests that still hold it; False when there was none."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.deleted = True
        return True

    def expire(self) -> int:
        """Drop the sessions idle for longer than ``idle_timeout`` (not those with a request in
        progress); returns how many were dropped."""
        limit = self.clock() - self.idle_timeout
        stale = [s.id for s in self._sessions.values() if s.last_used < limit and not s.users]
        for sid in stale:
            self._sessions.pop(sid).deleted = True
        self.expired += len(stale)
        return len(stale)

    def memory_bytes(self) -> int:
        """Bytes held by all sessions' states (see :meth:`SessionState.memory_bytes`)."""
        return sum(s.state.memory_bytes() for s in self._sessions.values())


def bits(logprobs: np.ndarray) -> float:
    """Surprise in bits of the scored tokens of ``logprobs`` (nats; NaN = not scored): -sum / ln 2."""
    scored = logprobs[~np.isnan(logprobs)]
    return float(-scored.sum() / math.log(2)) if scored.size else 0.0
