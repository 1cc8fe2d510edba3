"""``txl serve``: a local HTTP server for a checkpoint (stateless completions, sessions with memory)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys

from txl.cli.checks import check_exists, finite_float, flag_name, require_installed
from txl.cli.common import (add_checkpoint, add_checkpoint_name, add_device, add_dtype, add_quantize, add_span, end_ids,
                            interrupted_by, load_checkpoint, model_name, print_notes, span_args)
from txl.errors import TxlError
from txl_recipes.serve.config import ServeConfig

NAME = "serve"
HELP = "HTTP server: OpenAI-style completions, and sessions whose memory persists between requests"
EXAMPLE = "txl serve runs/default --port 8000   # then: curl -s localhost:8000/v1/sessions -X POST"
LIMITS = ServeConfig()  # the defaults
DETAILS = ("Serves POST /v1/completions (stateless, OpenAI-style, streaming with server-sent events) and sessions "
           "(POST /v1/sessions, then /v1/sessions/ID/append, /generate, GET and DELETE /v1/sessions/ID) that keep "
           "their memory between requests, so a request costs the same after a million tokens as after ten; "
           "GET /health and /metrics. Loopback only unless --api-key (or TXL_API_KEY) is set. SIGTERM or "
           "Ctrl-C let the requests in progress finish for up to --shutdown-timeout seconds, then exit; a second "
           "signal exits at once. Needs the serve extra (FastAPI, uvicorn): in the txl folder, "
           ".venv/bin/python -m pip install -e '.[serve]'. See docs/serving.md.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``serve`` flags (no torch import here)."""
    add_checkpoint(p, text="run or checkpoint directory (uses its best/)")
    add_checkpoint_name(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; any other needs --api-key)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health (default: the TXL_API_KEY "
                        "environment variable, else none)")
    p.add_argument("--max-sessions", type=int, default=LIMITS.max_sessions, metavar="N",
                   help="sessions kept at once; a new one evicts the least recently used (default %(default)s)")
    p.add_argument("--idle-timeout", type=finite_float, default=LIMITS.idle_timeout, metavar="S",
                   help="seconds after which an unused session is dropped (default %(default)g)")
    p.add_argument("--max-tokens", type=int, default=LIMITS.max_tokens, metavar="N",
                   help="most tokens one request may generate (default %(default)s)")
    p.add_argument("--max-request-bytes", type=int, default=LIMITS.max_request_bytes, metavar="N",
                   help="larger request bodies get 413 (default %(default)s, 4 MiB)")
    p.add_argument("--max-request-tokens", type=int, default=LIMITS.max_request_tokens, metavar="N",
                   help="an append or prompt of more tokens gets 413 (default %(default)s); a session reads several "
                        "appends exactly as one")
    p.add_argument("--max-pending-bytes", type=int, default=LIMITS.max_pending_bytes, metavar="N",
                   help="most bytes of undecided text a session holds, e.g. a word session's unfinished line "
                        "(default %(default)s); an append that would leave more gets 413")
    p.add_argument("--max-concurrent-requests", type=int, default=LIMITS.max_concurrent_requests, metavar="N",
                   help="requests handled at once, those waiting for a session or the model included; more get 503 "
                        "(default %(default)s; with --max-request-bytes it bounds the memory requests hold)")
    p.add_argument("--read-timeout", type=finite_float, default=LIMITS.read_timeout, metavar="S",
                   help="seconds a request body may take to arrive; a client that stops sending gets 408 "
                        "(default %(default)g)")
    p.add_argument("--shutdown-timeout", type=finite_float, default=LIMITS.shutdown_timeout, metavar="S",
                   help="on SIGTERM/Ctrl-C, seconds the requests in progress may take to finish before they are "
                        "cut off (default %(default)g)")
    add_span(p)
    add_dtype(p)
    add_quantize(p)
    p.add_argument("--compile", action="store_true",
                   help="sample through torch.compile: the ring step of docs/export.md, one graph for every memory "
                        "fill, float32 or --quantize int8, compiled before the server starts listening "
                        "(docs/compile.md)")
    add_device(p)
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="warning",
                   help="uvicorn's log level; info and debug also log every request (default warning)")


def run(args: argparse.Namespace) -> int:
    """Run ``txl serve`` until SIGTERM or SIGINT; returns the exit status."""
    # the span flags: txl.cli.checks.check_shared_flags
    given = limits(args)
    if not 0 <= args.port <= 65535:
        raise TxlError(f"--port must be in [0, 65535], got {args.port}")
    if args.compile:
        for flag, on in (("a half-precision --dtype", args.dtype not in (None, "float32")),
                         ("--quantize bf16", args.quantize == "bf16")):
            if on:
                raise TxlError(f"--compile does not take {flag} yet; drop one of them")
    # the arguments, the path and the optional packages before torch
    check_exists(args.checkpoint, "checkpoint", kind="folder")
    require_installed("fastapi", "uvicorn", message="txl serve needs FastAPI and uvicorn: in the txl folder, "
                                                    ".venv/bin/python -m pip install -e '.[serve]' (or pip install "
                                                    "fastapi uvicorn)")
    from txl_recipes.serve.http import check_api_key
    from txl_recipes.serve.server import is_loopback

    api_key = args.api_key if args.api_key is not None else os.environ.get("TXL_API_KEY") or None
    check_api_key(api_key)
    if not is_loopback(args.host) and api_key is None:
        raise TxlError(f"--host {args.host} lets other machines reach the server: give --api-key KEY (or set "
                       "TXL_API_KEY), or keep the default 127.0.0.1")

    # SIGTERM while loading (before uvicorn handles it): stop with the one line of an interrupted command
    with interrupted_by(signal.SIGTERM):
        return _run(args, api_key, given)


def limits(args: argparse.Namespace) -> ServeConfig:
    """The server's limits given by the flags, checked (messages name the flags).

    Raises:
        TxlError: as :meth:`~txl_recipes.serve.config.ServeConfig.check`.
    """
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(ServeConfig)}
    return ServeConfig(**given).check(named=lambda field: flag_name(args, field))


def _run(args: argparse.Namespace, api_key: str | None, given: ServeConfig) -> int:
    """:func:`run` once the flags are checked: load, build, listen, serve."""
    from txl.config import resolve_span
    from txl_recipes.serve.server import build_engine, listen, serve

    ckpt, _ = load_checkpoint(args, announce=True)
    span = resolve_span(ckpt.model.config, **span_args(args, ckpt.run.eval))
    if args.compile:  # what the ring step cannot hold, refused in one line before the compilation
        from txl.model.graphs import check_exportable

        check_exportable(ckpt.model.config, span, "--compile", reader=False)
        print("txl: compiling the decoder (torch.compile) before serving: a minute or so on a CPU", file=sys.stderr,
              flush=True)
    engine = build_engine(ckpt.model, ckpt.tokenizer, span=span, dtype=args.dtype, max_sessions=given.max_sessions,
                          idle_timeout=given.idle_timeout, max_tokens=given.max_tokens,
                          max_pending_bytes=given.max_pending_bytes, max_request_tokens=given.max_request_tokens,
                          name=model_name(ckpt.path), compile=args.compile, end_ids=end_ids(ckpt))
    from txl.runtime import available_memory_bytes, format_bytes

    have = available_memory_bytes()
    if engine.session_bytes > have:
        raise TxlError(f"one session with mem_len {span.mem_len:,} would hold {format_bytes(engine.session_bytes)}, "
                       f"more than the {format_bytes(have)} of memory available: use a smaller --mem-len")
    if engine.session_bytes * args.max_sessions > have:  # sessions grow with their text: possible, not certain
        print(f"txl: note: {args.max_sessions} sessions with full memories would hold "
              f"{format_bytes(engine.session_bytes * args.max_sessions)}, more than the {format_bytes(have)} "
              "available; lower --max-sessions or --mem-len if many sessions may grow long", file=sys.stderr)
    sock = listen(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print_notes(args)
    shown = f"[{host}]" if ":" in host else host
    cmem = f", cmem_len={span.cmem_len}" if span.cmem_len else ""
    announce = (f"txl: serving on http://{shown}:{port} (tgt_len={span.tgt_len}, mem_len={span.mem_len}{cmem}; up "
                f"to {args.max_sessions} sessions of at most {format_bytes(engine.session_bytes)} each, dropped "
                f"after {args.idle_timeout:g} s idle); Ctrl-C or SIGTERM to stop")
    code = serve(engine, sock, api_key=api_key, max_request_bytes=args.max_request_bytes,
                 max_concurrent_requests=args.max_concurrent_requests, read_timeout=args.read_timeout,
                 log_level=args.log_level,
                 announce=announce, shutdown_timeout=args.shutdown_timeout)
    if code:  # a second signal: out now, without waiting for a model job in progress
        print("txl: stopped at once by a second signal; requests still in progress were cut off", file=sys.stderr,
              flush=True)
        os._exit(code)
    return code
