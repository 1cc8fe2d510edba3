"""The HTTP application of ``txl serve`` (FastAPI on uvicorn; see docs/serving.md for the protocol).

Routes: ``GET /health``, ``GET /metrics``, ``POST /v1/completions`` (stateless, OpenAI-style,
server-sent events with ``stream``), and the sessions ``POST /v1/sessions``,
``GET|DELETE /v1/sessions/{id}``, ``POST /v1/sessions/{id}/append``,
``POST /v1/sessions/{id}/generate``. Every error is a JSON body
``{"error": {"message", "type", "code"}}`` with a 4xx status (503 when every session slot is busy);
:mod:`txl_recipes.serve.server` answers malformed HTTP in the same form. A failure inside the server is a
500 whose body says only that it happened and a ``request_id``; the exception and its traceback go to
the server's log under that id. A stream that fails after its first event ends with an error event
and ``[DONE]``, never a cut connection. Answers that grow with a text (per-token entries) are
rendered to JSON off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from txl.errors import TxlError, quoted
from txl.generation import DecodingRules
from txl_recipes.serve.engine import MAX_STOPS, Engine, Piece, SamplingParams, ServeError, SessionGone
from txl_recipes.serve.guard import Guard
from txl_recipes.serve.heap import release_free_memory
from txl_recipes.serve.http import check_api_key, error_body, internal_error_message

__all__ = ["create_app", "error_body"]

LOG = logging.getLogger("uvicorn.error")  # the server's log: uvicorn's, on stderr


def log_internal_error(err: BaseException) -> str:
    """Log ``err`` with its traceback under a new request id and return the id (the exception is marked
    with it: once answered, it goes no further than the application, see :class:`~txl_recipes.serve.guard.Guard`)."""
    request_id = uuid.uuid4().hex[:16]
    LOG.error("request %s failed: %s", request_id, type(err).__name__, exc_info=err)
    with contextlib.suppress(AttributeError, TypeError):  # an exception type without a __dict__ keeps none
        err.txl_request_id = request_id
    return request_id


def _stream_error(err: Exception) -> bytes:
    """The server-sent event that ends a stream which failed after it began: the refusal of a
    :class:`ServeError`, else an internal error (logged, see :func:`log_internal_error`)."""
    if isinstance(err, SessionGone):  # deleted during the generation (or while it waited)
        return _sse(error_body(err.status, err.message, kind="session_deleted"))
    if isinstance(err, ServeError):
        return _sse(error_body(err.status, err.message))
    request_id = log_internal_error(err)
    return _sse(error_body(500, internal_error_message(request_id), request_id=request_id))

class _Sampling(BaseModel):
    """Sampling fields shared by completions and session generation: OpenAI's names, and txl's decoding
    rules (``repetition_penalty``, ``no_repeat_ngram_size``; ``min_tokens``, vLLM's name: stop strings
    count only from that many tokens on), as :class:`~txl.generation.DecodingRules`."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    # types here; the values' rules are the decoding rules' own (txl.config.check_sampling, check_decoding),
    # the same for the command line, the library and this server
    max_tokens: int = Field(16, ge=0)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_tokens: int = 0
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None  # a long list: refused unread
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False

    def params(self) -> SamplingParams:
        """The sampling settings (checked by :meth:`Engine.check_sampling`)."""
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        try:
            rules = DecodingRules(temperature=self.temperature, top_k=self.top_k,
                                  top_p=None if self.top_p == 1 else self.top_p,
                                  repetition_penalty=self.repetition_penalty,
                                  no_repeat_ngram_size=self.no_repeat_ngram_size, min_new_tokens=self.min_tokens)
        except TxlError as err:  # (named as this request names it)
            raise ServeError(400, str(err).replace("min_new_tokens", "min_tokens")) from None
        return SamplingParams(self.max_tokens, rules, tuple(stop), self.seed)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: OpenAI's legacy completions fields (``n`` must be 1)."""

    prompt: str
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=0)
    model: str | None = None
    user: str | None = None
    n: int = Field(1, ge=1, le=1)


class GenerateRequest(_Sampling):
    """``POST /v1/sessions/{id}/generate``: sampling fields, ``append`` the sample to the session."""

    append: bool = True


class AppendRequest(BaseModel):
    """``POST /v1/sessions/{id}/append``: ``text``; ``flush`` reads pending text as if the stream ended."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    flush: bool = False


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _num(x: float) -> float | None:
    return None if x != x else x


LARGE_ANSWER_BYTES = 1 << 20  # answers this long had a peak of temporary objects worth handing back


async def _json(build) -> Response:
    """A JSON response of ``build()``, built and serialised on a thread (answers may hold a token entry
    per token of a long text: the event loop stays free meanwhile). After an answer of
    ``LARGE_ANSWER_BYTES`` or more is sent, and the handler's objects behind it are gone, the C heap's
    free pages go back to the system on a worker thread (:func:`.heap.release_free_memory`):
    its temporary objects were many times its size, and without this the server's resident memory
    would keep such peaks (docs/serving.md, "Measured: hostile traffic")."""
    def render() -> bytes:
        return json.dumps(build(), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")

    body = await asyncio.to_thread(render)
    after = BackgroundTask(release_free_memory) if len(body) >= LARGE_ANSWER_BYTES else None  # a sync task: threadpool
    return Response(body, media_type="application/json", background=after)


async def _prepend(first, rest):
    """``first``, then the items of the async generator ``rest``."""
    yield first
    async for item in rest:
        yield item


async def _collect(items, request: Request) -> list:
    """The items of an async generator for a response sent whole; when the client has gone, the
    generator is closed there, as a stream's is (no tokens generated for nobody)."""
    out = []
    try:
        async for item in items:
            out.append(item)
            if await request.is_disconnected():
                break
    finally:
        await items.aclose()
    return out


def _finish(pieces: list[Piece]) -> str:
    """``finish_reason``: "stop" when the last token completed a stop string (the last allowed one
    included), else "length"."""
    return "stop" if pieces and pieces[-1].stopped else "length"


async def _sweep_sessions(engine: Engine, every_s: float) -> None:
    """Drop ``engine``'s idle sessions every ``every_s`` seconds, until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        engine.store.expire()


def _lifespan(engine: Engine, sweep_s: float):
    """FastAPI's ``lifespan`` for ``engine``: sweeps idle sessions every ``sweep_s`` seconds while the
    application runs, and shuts the engine's worker thread down (off the event loop) when it stops."""
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(_sweep_sessions(engine, sweep_s))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.get_running_loop().run_in_executor(None, engine.worker.shutdown)

    return lifespan


async def _serve_error(_request, err: ServeError) -> JSONResponse:
    """A refusal (:class:`ServeError`): its status and message; ``Retry-After: 1`` with a 503."""
    headers = {"Retry-After": "1"} if err.status == 503 else None
    return JSONResponse(error_body(err.status, err.message), status_code=err.status, headers=headers)


async def _invalid(_request, err: RequestValidationError) -> JSONResponse:
    """A request FastAPI's validation refused: 400, naming at most three problems by field."""
    problems = []
    for e in err.errors()[:3]:
        if e.get("type") == "json_invalid":
            return JSONResponse(error_body(400, "the request body is not valid JSON"), status_code=400)
        where = ".".join(quoted(p) if len(str(p)) > 40 else str(p) for p in e.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {e.get('msg', 'invalid')}")
    return JSONResponse(error_body(400, "invalid request: " + "; ".join(problems)), status_code=400)


async def _http(_request, err: StarletteHTTPException) -> JSONResponse:
    """Starlette's HTTP errors (an unknown route: 404, a wrong method: 405): their status and detail."""
    return JSONResponse(error_body(err.status_code, str(err.detail)), status_code=err.status_code)


async def _bug(_request, err: Exception) -> JSONResponse:
    """Any other exception: 500 with a ``request_id`` (also in ``X-Request-Id``); the details go to the
    log under that id (:func:`log_internal_error`), never in the answer."""
    request_id = log_internal_error(err)
    return JSONResponse(error_body(500, internal_error_message(request_id), request_id=request_id),
                        status_code=500, headers={"X-Request-Id": request_id})


def _event_stream(events) -> StreamingResponse:
    """The server-sent events response of the async generator ``events`` (of encoded events)."""
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


class _Completion:
    """One ``POST /v1/completions`` answer in the making, for a prompt already encoded and checked.

    Takes the engine, the request, its prompt's token ids (``ids``, a 1-D array of at least one id)
    and its sampling settings. :meth:`read_prompt` reads the prompt (scored when ``echo`` and
    ``logprobs`` ask); then :meth:`events` streams the answer, or :meth:`whole` returns it.
    """

    def __init__(self, engine: Engine, req: CompletionRequest, ids: np.ndarray, params: SamplingParams) -> None:
        self.engine, self.req, self.ids, self.params = engine, req, ids, params
        self.header = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                       "model": engine.name}
        self.context, self.mems, self.prompt_lp = ids, None, None
        self.prefix = req.prompt if req.echo else ""

    async def read_prompt(self) -> None:
        """Score the prompt when asked, or read a long one ahead; sampling then goes on from the state
        after it (``context``, ``mems``). A prompt's log-probabilities go to ``prompt_lp``."""
        scored = self.req.echo and self.req.logprobs is not None
        if scored or self.ids.size > self.engine.job_tokens:
            # a scored or long prompt is read first in jobs of whole segments (on the grid generate reads it
            # with), others' jobs between them
            lp, state = await self.engine.score_prompt(self.ids)
            self.context, self.mems, self.prompt_lp = state.tail, state.mems, lp if scored else None

    def choice(self, text: str, finish: str | None, tokens=None, lps=None) -> dict[str, Any]:
        """An entry of ``choices``: ``logprobs`` has an entry per token of ``tokens`` (their log-probabilities
        ``lps``, nats) when the request asked for them and ``tokens`` is given, else it is None."""
        logprobs = None
        if self.req.logprobs is not None and tokens is not None:
            entries = self.engine.token_entries(tokens, lps)
            logprobs = {"tokens": [e["text"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                        "top_logprobs": None}
        return {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}

    def usage(self, n: int) -> dict[str, int]:
        """The ``usage`` counts for ``n`` sampled tokens."""
        return {"prompt_tokens": int(self.ids.size), "completion_tokens": n, "total_tokens": int(self.ids.size) + n}

    async def events(self):
        """The answer as server-sent events (bytes): the echoed prompt, a token each, the finish with the
        usage, ``[DONE]``; a failure ends the stream with an error event (:func:`_stream_error`)."""
        n, finish = 0, "length"
        try:
            if self.prefix:  # a token entry per prompt token: built off the event loop
                tokens = self.ids if self.prompt_lp is not None else None
                yield await asyncio.to_thread(_sse, {**self.header, "choices": [
                    self.choice(self.prefix, None, tokens, self.prompt_lp)]})
            async for piece in self.engine.sample(self.context, self.mems, self.params):
                n += 1
                finish = "stop" if piece.stopped else "length"
                yield _sse({**self.header, "choices": [self.choice(piece.text, None, [piece.token], [piece.logprob])]})
            yield _sse({**self.header, "choices": [self.choice("", finish)], "usage": self.usage(n)})
        except Exception as err:  # the status (200) is sent: the stream ends with the error instead
            yield _stream_error(err)
        yield b"data: [DONE]\n\n"

    async def whole(self, request: Request) -> Response:
        """The answer as one JSON response (sampling stops when the client of ``request`` has gone)."""
        pieces = await _collect(self.engine.sample(self.context, self.mems, self.params), request)
        tokens = [x.token for x in pieces]
        lps = [x.logprob for x in pieces]
        if self.prompt_lp is not None:
            tokens, lps = [*self.ids.tolist(), *tokens], [*self.prompt_lp.tolist(), *lps]
        finish = _finish(pieces)
        text = self.prefix + "".join(x.text for x in pieces)
        return await _json(lambda: {**self.header, "choices": [self.choice(text, finish, tokens, lps)],
                                    "usage": self.usage(len(pieces))})


def _token_entry(piece: Piece) -> dict[str, Any]:
    """A sampled token as a session answer lists it: ``text``, ``id``, ``logprob`` (nats; None for NaN)."""
    return {"text": piece.text, "id": piece.token, "logprob": _num(piece.logprob)}


async def _generation_events(first, items):
    """A session generation as server-sent events (bytes): ``first`` and the rest of ``items`` (pieces,
    then the session's description), then ``[DONE]``; a failure ends the stream with an error event.
    ``items`` is closed in the end."""
    finish = "length"
    try:
        async for item in _prepend(first, items):
            if isinstance(item, Piece):
                finish = "stop" if item.stopped else "length"
                yield _sse({"object": "session.token", **_token_entry(item)})
            else:
                yield _sse({"object": "session.generation", "finish_reason": finish, "session": item})
    except Exception as err:  # the status (200) is sent: the stream ends with the error instead
        yield _stream_error(err)
    finally:
        await items.aclose()
    yield b"data: [DONE]\n\n"


def _generation_answer(items: list) -> dict[str, Any]:
    """The whole answer of a session generation from its collected ``items`` (pieces, then the session's
    description): text, finish reason, token entries, total log-probability (nats) and surprise (bits)."""
    pieces = [x for x in items if isinstance(x, Piece)]
    info = next((x for x in items if not isinstance(x, Piece)), None)
    finish = _finish(pieces)
    lps = [x.logprob for x in pieces]
    return {"text": "".join(x.text for x in pieces), "finish_reason": finish,
            "tokens": [_token_entry(x) for x in pieces], "logprob": float(np.sum(lps)) if lps else 0.0,
            "surprise_bits": -float(np.sum(lps)) / math.log(2) if lps else 0.0, "session": info}


class _Routes:
    """The application's routes, as methods over one :class:`Engine`; :meth:`add_to` registers them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add_to(self, app: FastAPI) -> None:
        """Register every route on ``app``."""
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/metrics", self.metrics, methods=["GET"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/sessions", self.create_session, methods=["POST"], status_code=201)
        app.add_api_route("/v1/sessions/{session_id}", self.session_info, methods=["GET"])
        app.add_api_route("/v1/sessions/{session_id}", self.delete_session, methods=["DELETE"])
        app.add_api_route("/v1/sessions/{session_id}/append", self.append, methods=["POST"])
        app.add_api_route("/v1/sessions/{session_id}/generate", self.generate, methods=["POST"])

    async def health(self, request: Request):
        """``GET /health``: the model's details with the key (or without a key set), else only the status."""
        if not request.scope.get("txl_authorized", True):
            return {"status": "ok"}  # nothing about the model or the machine without the key
        engine = self.engine
        c = engine.model.config
        return {"status": "ok", "model": engine.name, "tokenizer": engine.tokenizer.kind,
                "vocab_size": c.vocab_size, "span": engine.span.to_dict(), "n_layer": c.n_layer, "d_model": c.d_model}

    async def metrics(self):
        """``GET /metrics``: the engine's counters (:meth:`Engine.stats`)."""
        return self.engine.stats()

    async def completions(self, req: CompletionRequest, request: Request):
        """``POST /v1/completions``: 400 for an empty or too long prompt or refused sampling settings."""
        p = req.params()
        self.engine.check_sampling(p)
        ids = await self.engine.encode(req.prompt)
        if ids.size == 0:
            raise ServeError(400, "the prompt is empty (it encodes to no tokens); give at least one character")
        self.engine.check_length(ids, "the prompt", "shorten it, or read a long text into a session, whose appends "
                                                    "together may be any length")
        completion = _Completion(self.engine, req, ids, p)
        await completion.read_prompt()
        if req.stream:
            return _event_stream(completion.events())
        return await completion.whole(request)

    async def create_session(self, request: Request):
        """``POST /v1/sessions`` (201): a new session; a body with any field is refused (400)."""
        body = (await request.body()).strip()
        if body and json.loads(body):  # the guard checked it is a JSON object
            raise ServeError(400, "POST /v1/sessions takes no fields: send no body, or {}")
        return self.engine.new_session()

    async def session_info(self, session_id: str):
        """``GET /v1/sessions/{id}``: the session's description."""
        return self.engine.describe(self.engine.session(session_id))

    async def delete_session(self, session_id: str):
        """``DELETE /v1/sessions/{id}``."""
        return self.engine.delete(session_id)

    async def append(self, session_id: str, req: AppendRequest):
        """``POST /v1/sessions/{id}/append``: the engine's reply (a token entry per token read)."""
        reply = await self.engine.append(session_id, req.text, req.flush)
        return await _json(lambda: reply)

    async def generate(self, session_id: str, req: GenerateRequest, request: Request):
        """``POST /v1/sessions/{id}/generate``: streamed, or whole (:func:`_generation_answer`)."""
        p = req.params()
        self.engine.check_sampling(p)
        if req.stream:
            # the stream's status is sent before its first event: run the generation up to its first item
            # here, so that a session that is gone (or empty) gets its 404 (or 400), never a 200
            items = self.engine.generate(session_id, p, req.append)
            first = await items.__anext__()
            return _event_stream(_generation_events(first, items))
        items = await _collect(self.engine.generate(session_id, p, req.append), request)
        return _generation_answer(items)


def create_app(engine: Engine, *, api_key: str | None = None, max_request_bytes: int = 1 << 20,
               max_concurrent_requests: int = 64, read_timeout: float = 30.0,
               sweep_s: float = 30.0) -> Any:
    """The ASGI application serving ``engine``.

    Args:
        engine: the :class:`~txl_recipes.serve.engine.Engine` (model, sessions, worker thread).
        api_key: when given, every route but ``/health`` needs ``Authorization: Bearer KEY`` (401 otherwise).
        max_request_bytes: larger request bodies get 413.
        max_concurrent_requests: requests handled at once (waiting for a session or the model
            included); more get 503 with ``Retry-After`` (``/health`` always answers). With
            ``max_request_bytes`` it bounds the memory requests in progress hold.
        read_timeout: seconds a request body may take to arrive (a client that stops sending it gets
            408 and its connection is closed).
        sweep_s: how often idle sessions are dropped in the background (they are also dropped on access).

    Raises:
        TxlError: an API key that is empty or not printable ASCII (HTTP headers carry bytes; a key
            outside ASCII would be compared under one encoding and sent under another).
    """
    check_api_key(api_key)
    app = FastAPI(title="txl serve", lifespan=_lifespan(engine, sweep_s), docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_exception_handler(ServeError, _serve_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _bug)
    _Routes(engine).add_to(app)
    return Guard(app, engine, api_key, max_request_bytes, max_concurrent_requests, read_timeout)
