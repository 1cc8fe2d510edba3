"""The limits of ``txl serve``: one field per flag of the same name, their defaults and their rules,
used by the command line, :func:`txl_recipes.serve.server.build_engine`, :func:`~txl_recipes.serve.server.serve` and
the session store (docs/serving.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from txl.config.fields import _named, check_fields
from txl.errors import TxlError

# field -> (the smallest value, whether the value must exceed it), in the order messages check them
_LOWEST = {"max_sessions": (1, False), "idle_timeout": (0, True), "max_tokens": (0, False),
           "max_request_bytes": (1, False), "max_request_tokens": (1, False), "max_pending_bytes": (0, False),
           "max_concurrent_requests": (1, False), "read_timeout": (0, True), "shutdown_timeout": (0, False)}


@dataclass
class ServeConfig:
    """The limits of a server (``txl serve``), each the flag of the same name.

    Attributes:
        max_sessions: sessions kept at once (>= 1); a new one evicts the least recently used.
        idle_timeout: seconds after its last use at which a session is dropped (> 0).
        max_tokens: most tokens one request may generate (>= 0).
        max_request_bytes: larger request bodies get 413 (>= 1).
        max_request_tokens: an append or prompt of more tokens gets 413 (>= 1).
        max_pending_bytes: most bytes of undecided text a session holds (>= 0).
        max_concurrent_requests: requests handled at once; more get 503 (>= 1).
        read_timeout: seconds a request body may take to arrive (> 0).
        shutdown_timeout: seconds the requests in progress may take to finish after SIGTERM (>= 0).
    """

    max_sessions: int = 64
    idle_timeout: float = 600.0
    max_tokens: int = 4096
    max_request_bytes: int = 4 << 20
    max_request_tokens: int = 1 << 17
    max_pending_bytes: int = 1 << 16
    max_concurrent_requests: int = 64
    read_timeout: float = 30.0
    shutdown_timeout: float = 10.0

    def check(self, named=_named) -> ServeConfig:
        """Return ``self`` once every field has its type and range; ``named(field)`` gives the name a
        message uses (the command line passes its flag's).

        Raises:
            TxlError: the first field of a wrong type, not finite, or out of range.
        """
        values = dataclasses.asdict(self)
        for field, value in values.items():
            try:
                check_fields(type(self), {field: value}, "serve")
            except TxlError:
                kind = "a finite number" if field.endswith("timeout") else "an integer"
                raise TxlError(f"{named(field)} must be {kind}, got {value!r}") from None
            lowest, strict = _LOWEST[field]
            if value <= lowest if strict else value < lowest:
                unit = " seconds" if field.endswith("timeout") else ""
                raise TxlError(f"{named(field)} must be {'>' if strict else '>='} {lowest}{unit}, got {value!r}")
        return self
