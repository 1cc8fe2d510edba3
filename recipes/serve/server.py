"""Run the server: build the engine of a loaded checkpoint, listen, serve until SIGTERM or SIGINT.

uvicorn handles the signals. The first SIGTERM or SIGINT starts a graceful shutdown: no new
connections, the requests in progress may finish (a streaming response included) for up to
``shutdown_timeout`` seconds; after that the requests still running are cancelled (a client that
sends half a body or stops reading a stream cannot hold the process), the model worker finishes its
current job and the server returns. A second SIGTERM or SIGINT during the shutdown exits at once.
Malformed HTTP (``Content-Length: -1``, a broken request line) is answered with the same JSON error
body as every other error. Serving needs FastAPI and uvicorn (the ``serve`` extra), which ``txl serve``
checks for before loading anything.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any

from txl.errors import TxlError
from txl_recipes.serve.config import ServeConfig

if TYPE_CHECKING:  # nothing here imports torch: txl serve checks its flags before loading anything
    from txl.config import AttentionSpan

__all__ = ["is_loopback", "build_engine", "listen", "serve", "FORCED_EXIT"]

LIMITS = ServeConfig()  # the defaults of the limits
FORCED_EXIT = 1  #: exit status after a second signal cut the shutdown short


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_engine(model, tokenizer, *, span: AttentionSpan, dtype: str = "float32",
                 max_sessions: int = LIMITS.max_sessions, idle_timeout: float = LIMITS.idle_timeout,
                 max_tokens: int = LIMITS.max_tokens, max_pending_bytes: int = LIMITS.max_pending_bytes,
                 max_request_tokens: int = LIMITS.max_request_tokens, name: str = "txl", compile: bool | str = False,
                 end_ids: tuple[int, ...] = ()):
    """The :class:`~txl_recipes.serve.engine.Engine` serving ``model`` (eval mode) and ``tokenizer``; ``compile``:
    sample through ``torch.compile`` (compiled here, before the first request); ``end_ids``: where a sample
    ends (a fine-tuned model's end-of-completion marker).

    Raises:
        TxlError: bounds out of range, or a span the model cannot read with
            (``cmem_len`` > 0 for a model without a compressed memory), a ``dtype`` the weights cannot run
            with (bfloat16 weights and "float16"); with ``compile``, what compiled decoding refuses
            (:func:`~txl.generation.generate_steps`).
    """
    from txl_recipes.serve.engine import Engine
    from txl_recipes.serve.sessions import SessionStore

    ServeConfig(max_tokens=max_tokens, max_pending_bytes=max_pending_bytes,  # (the store checks its own two)
                max_request_tokens=max_request_tokens).check()
    from txl.config import check_readable

    check_readable(model.config, span)
    model.eval()
    return Engine(model=model, tokenizer=tokenizer, span=span, store=SessionStore(max_sessions, idle_timeout),
                  dtype=dtype, max_tokens=max_tokens, max_pending_bytes=max_pending_bytes,
                  max_request_tokens=max_request_tokens, name=name, compile=compile, end_ids=tuple(end_ids))


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


MAX_HEAD_BYTES = 256 * 1024
"""The longest request line with headers the server reads (h11's own bound, 16 KB, answered a longer URL
with 404 or with a reset connection depending on how its bytes arrived); a longer one is refused with a
JSON 400, however it arrives."""


def uvicorn_config(app, *, log_level: str = "warning", shutdown_timeout: float = 10.0):
    """uvicorn's config for ``app``: the h11 protocol answering malformed HTTP with a JSON error,
    a graceful shutdown bounded by ``shutdown_timeout`` seconds, and request heads of up to
    :data:`MAX_HEAD_BYTES` read whole however the network cuts them."""
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, access_log=log_level in ("debug", "info"), lifespan="on",
                          timeout_keep_alive=5, http=_json_errors_protocol(),
                          timeout_graceful_shutdown=max(shutdown_timeout, 0.001),
                          h11_max_incomplete_event_size=MAX_HEAD_BYTES)


def serve(engine, sock: socket.socket, *, api_key: str | None = None,
          max_request_bytes: int = LIMITS.max_request_bytes,
          max_concurrent_requests: int = LIMITS.max_concurrent_requests, read_timeout: float = LIMITS.read_timeout,
          log_level: str = "warning", announce: str | None = None,
          shutdown_timeout: float = LIMITS.shutdown_timeout) -> int:
    """Serve ``engine`` on the listening socket ``sock`` until SIGTERM/SIGINT, then shut down
    gracefully for at most ``shutdown_timeout`` seconds (see the module's description).
    ``announce`` is printed on stderr once the server accepts connections.

    Returns:
        0 after a graceful shutdown, or :data:`FORCED_EXIT` when a second SIGTERM or SIGINT cut it short
        (the model thread may still be in a job then: a command should exit without waiting for it,
        as ``txl serve`` does with ``os._exit``).

    Raises:
        TxlError: a limit out of range (:class:`~txl_recipes.serve.config.ServeConfig`).
        KeyboardInterrupt: after a graceful shutdown started by SIGINT (Ctrl-C), as every txl command.
    """
    from txl_recipes.serve.app import create_app

    ServeConfig(max_request_bytes=max_request_bytes, max_concurrent_requests=max_concurrent_requests,
                read_timeout=read_timeout, shutdown_timeout=shutdown_timeout).check()

    app = create_app(engine, api_key=api_key, max_request_bytes=max_request_bytes,
                     max_concurrent_requests=max_concurrent_requests, read_timeout=read_timeout)
    server = _uvicorn_server(uvicorn_config(app, log_level=log_level, shutdown_timeout=shutdown_timeout), announce)
    logging.getLogger("uvicorn.error").addFilter(_no_cancelled_tracebacks)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the handler found
    # at start: with this one the process then ends normally (exit status 0) instead of dying of it
    previous = signal.signal(signal.SIGTERM, _ignore) if threading.current_thread() is threading.main_thread() else None
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raises the caught SIGINT again once it has stopped
        if not server.force_exit:
            raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return FORCED_EXIT if server.force_exit else 0


def _no_cancelled_tracebacks(record: logging.LogRecord) -> bool:
    """Drop uvicorn's traceback for a request cut off by the shutdown (its task was cancelled on purpose;
    uvicorn's own line says how many were)."""
    if record.exc_info and record.exc_info[0] is not None:
        return not issubclass(record.exc_info[0], asyncio.CancelledError)
    text = str(record.msg)  # the application's lifespan reports its failure as a formatted traceback
    return not (text.startswith("Traceback") and text.rstrip().endswith("CancelledError"))


def _ignore(_signum, _frame) -> None:
    """A signal handler that does nothing."""


def _uvicorn_server(config: Any, announce: str | None):
    """uvicorn's server for ``config``, printing ``announce`` on stderr once it listens (the class is made
    here: uvicorn is optional)."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server with a line on stderr once it listens, and a second SIGTERM (not only a
        second SIGINT) that stops the shutdown's waiting at once."""

        def __init__(self, config: Any, announce: str | None) -> None:
            super().__init__(config)
            self.announce = announce

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.announce and self.started:
                print(self.announce, file=sys.stderr, flush=True)

        def handle_exit(self, sig: int, frame) -> None:
            if self.should_exit and sig in (signal.SIGINT, signal.SIGTERM):
                self._captured_signals.append(sig)
                self.force_exit = True
                return
            super().handle_exit(sig, frame)

    return Server(config, announce)


def _json_errors_protocol():
    """uvicorn's h11 protocol whose answer to malformed HTTP is the server's JSON error body (uvicorn
    sends plain text there)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from txl_recipes.serve.http import error_response

    class JsonErrorsH11(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            body, headers = error_response(400, f"malformed HTTP request: {msg.rstrip('.')}")
            headers.append((b"connection", b"close"))
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
            self.transport.close()

    return JsonErrorsH11
