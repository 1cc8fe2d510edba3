"""The counters of ``txl serve``'s ``GET /metrics``, bounded whatever the traffic.

Every key a request can create comes from a fixed set: requests are counted by method and route
template (an unknown method counts as ``OTHER``, an unknown path as ``other``), responses by status
code, and the token rate over a sliding window lives in a fixed ring of one-second buckets. So a
client sending a million distinct paths, methods or tokens grows none of them (tested).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["Metrics", "ROUTES", "route_of"]

#: The route templates of the server (``{id}``: a session id); any other path counts as "other".
ROUTES = ("/health", "/metrics", "/v1/completions", "/v1/sessions", "/v1/sessions/{id}",
          "/v1/sessions/{id}/append", "/v1/sessions/{id}/generate")
_METHODS = frozenset({"GET", "POST", "DELETE", "HEAD", "OPTIONS", "PUT", "PATCH"})
_SESSION = re.compile(r"/v1/sessions/[^/]+(/append|/generate)?")


def route_of(method: str, path: str) -> str:
    """``"POST /v1/sessions/{id}/append"``: the method (``OTHER`` when not a standard one) and the
    route template the path belongs to (``other`` for a path no route serves)."""
    method = method if method in _METHODS else "OTHER"
    if path in ROUTES:
        return f"{method} {path}"
    match = _SESSION.fullmatch(path)
    if match:
        return f"{method} /v1/sessions/{{id}}{match.group(1) or ''}"
    return f"{method} other"


class _Window:
    """Counts over the last ``seconds`` seconds in a ring of one-second buckets (fixed size)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self._stamp = [-1] * seconds  # the second each bucket counts
        self._count = [0] * seconds

    def add(self, now: float, n: int) -> None:
        second = int(now)
        i = second % self.seconds
        if self._stamp[i] != second:
            self._stamp[i], self._count[i] = second, 0
        self._count[i] += n

    def total(self, now: float) -> int:
        oldest = int(now) - self.seconds
        return sum(c for s, c in zip(self._stamp, self._count) if s > oldest)


class Metrics:
    """Request and token counters, and token throughput over a sliding window.

    Args:
        window: the throughput window in seconds (an integer number of one-second buckets).
        clock: the time source in seconds (monotonic).

    Attributes:
        requests: requests by ``"METHOD /route"`` (:func:`route_of`); statuses: responses by status code.
        in_flight: requests being handled now. tokens_read, tokens_generated: totals since start.
    """

    def __init__(self, window: int = 60, clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.clock = int(window), clock
        self.started = clock()
        self.requests: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.in_flight = 0
        self.tokens_read = 0
        self.tokens_generated = 0
        self._recent = _Window(self.window)

    def count_request(self, method: str, path: str) -> None:
        """Count one request under its route template."""
        self.requests[route_of(method, path)] += 1

    def add_tokens(self, read: int = 0, generated: int = 0) -> None:
        """Count tokens read (appended, prompts) and generated."""
        self.tokens_read += read
        self.tokens_generated += generated
        self._recent.add(self.clock(), read + generated)

    def tokens_per_s(self) -> float:
        """Tokens read + generated per second over the last ``window`` seconds (or since start)."""
        now = self.clock()
        span = min(self.window, max(now - self.started, 1e-9))
        return self._recent.total(now) / span
