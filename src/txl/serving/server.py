"""Run the server: build the engine of a loaded checkpoint, listen, serve until SIGTERM or SIGINT.

uvicorn handles the signals: it stops accepting connections, lets the requests in progress finish
(a streaming response included), runs the application's shutdown (the model worker finishes its
queued jobs) and returns.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
import threading
from typing import Any

from txl.errors import TxlError
from txl.model.span import AttentionSpan

__all__ = ["is_loopback", "build_engine", "listen", "serve"]


def _require_stack():
    """Import uvicorn and FastAPI, or say how to install them."""
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise TxlError("txl serve needs FastAPI and uvicorn: pip install 'txl[serve]' "
                       "(or pip install fastapi uvicorn)") from None
    return uvicorn


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_engine(model, tokenizer, *, span: AttentionSpan, dtype: str = "float32", max_sessions: int = 64,
                 idle_timeout: float = 600.0, max_tokens: int = 4096, name: str = "txl"):
    """The :class:`~txl.serving.engine.Engine` serving ``model`` (eval mode) and ``tokenizer``.

    Raises:
        TxlError: FastAPI/uvicorn missing, or bounds out of range.
    """
    _require_stack()
    from txl.serving.engine import Engine
    from txl.serving.sessions import SessionStore

    if max_tokens < 0:
        raise TxlError(f"max_tokens must be >= 0, got {max_tokens}")
    model.eval()
    return Engine(model=model, tokenizer=tokenizer, span=span, store=SessionStore(max_sessions, idle_timeout),
                  dtype=dtype, max_tokens=max_tokens, name=name)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port).

    Raises:
        TxlError: the address cannot be used (in use, not this machine's, no permission).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise TxlError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    family, kind, proto, _, address = infos[0]
    # proto IPPROTO_TCP (not 0) matters: asyncio sets TCP_NODELAY only on such sockets, and without it
    # a response written in two pieces waits for the client's delayed ACK (40 ms per request)
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        raise TxlError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


def serve(engine, sock: socket.socket, *, api_key: str | None = None, max_request_bytes: int = 1 << 20,
          log_level: str = "warning", announce: str | None = None) -> None:
    """Serve ``engine`` on the listening socket ``sock`` until SIGTERM/SIGINT (then finish the requests
    in progress and return). ``announce`` is printed on stderr once the server accepts connections."""
    uvicorn = _require_stack()
    from txl.serving.app import create_app

    app = create_app(engine, api_key=api_key, max_request_bytes=max_request_bytes)
    config = uvicorn.Config(app, log_level=log_level, access_log=log_level in ("debug", "info"), lifespan="on",
                            timeout_keep_alive=5)
    server = _Server(config, announce)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the handler found
    # at start: with this one the process then ends normally (exit status 0) instead of dying of it
    previous = signal.signal(signal.SIGTERM, _ignore) if threading.current_thread() is threading.main_thread() else None
    try:
        server.run(sockets=[sock])
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _ignore(_signum, _frame) -> None:
    """A signal handler that does nothing."""


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server with a line on stderr once it listens."""

        def __init__(self, config: Any, announce: str | None) -> None:
            super().__init__(config)
            self.announce = announce

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.announce and self.started:
                print(self.announce, file=sys.stderr, flush=True)

    return Server


def _Server(config: Any, announce: str | None):  # noqa: N802 - builds the subclass lazily (uvicorn is optional)
    return _server_class()(config, announce)
