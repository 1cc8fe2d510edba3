"""What ``txl serve`` checks before FastAPI sees a request: the API key, how many requests run at once,
the body's size, how long it takes to arrive, and that it is one JSON object of a bounded number of fields.
A request refused here gets the same JSON error body as any other (:func:`txl_recipes.serve.http.error_response`)."""

from __future__ import annotations

import asyncio
import json
import secrets

from txl_recipes.serve.engine import Engine
from txl_recipes.serve.http import error_response


class Guard:
    """ASGI middleware: API key, request-size limit, request and status counters.

    Requests are counted by route template (:mod:`txl_recipes.serve.metrics`), so no path, method or
    failed key adds a counter. ``scope["txl_authorized"]`` tells the routes whether the request
    carried the key (``/health`` answers details only then).
    """

    def __init__(self, app, engine: Engine, api_key: str | None, max_request_bytes: int,
                 max_concurrent: int, read_timeout: float) -> None:
        self.app, self.engine, self.limit, self.max_concurrent = app, engine, max_request_bytes, max_concurrent
        self.key = None if api_key is None else api_key.encode("ascii")
        self.read_timeout = read_timeout

    def _authorized(self, header: bytes) -> bool:
        """``Authorization: Bearer KEY`` (the scheme in any case, as HTTP allows), compared as bytes: the
        key is ASCII (checked at start), so no decoding can differ."""
        if self.key is None:
            return True
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(b" "), self.key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        metrics = self.engine.metrics
        metrics.count_request(scope["method"], scope["path"])
        metrics.in_flight += 1

        async def counted_send(message):
            if message["type"] == "http.response.start":
                metrics.statuses[message["status"]] += 1
            await send(message)

        try:
            headers = dict(scope["headers"])
            authorized = self._authorized(headers.get(b"authorization", b""))
            scope["txl_authorized"] = authorized
            if metrics.in_flight > self.max_concurrent and scope["path"] != "/health":  # each holds up to a body
                return await reply(counted_send, 503, f"the server is handling {self.max_concurrent} requests, its "
                                                       "limit (--max-concurrent-requests); retry shortly",
                                    retry_after=True)
            if not authorized and scope["path"] != "/health":
                return await reply(counted_send, 401, "missing or wrong API key: send the header "
                                                       "'Authorization: Bearer KEY'")
            length = headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.limit:
                return await reply(counted_send, 413, f"request body of {int(length)} bytes is over this server's "
                                                       f"limit of {self.limit} bytes (--max-request-bytes)")
            chunks, size, more = [], 0, True
            while more:  # read the body here, so that a body without a length is bounded too
                try:  # a client that sends part of a body and stops must not hold its slot for good
                    message = await asyncio.wait_for(receive(), self.read_timeout)
                except asyncio.TimeoutError:
                    return await reply(counted_send, 408, f"the request body did not arrive within "
                                                           f"{self.read_timeout:g} s (--read-timeout)")
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                more = message.get("more_body", False)
                if size > self.limit:
                    return await reply(counted_send, 413, f"request body over this server's limit of {self.limit} "
                                                           "bytes (--max-request-bytes)")
            body = b"".join(chunks)
            if body.strip():  # parsed here, off the event loop, before FastAPI validates it there
                problem = await asyncio.to_thread(json_problem, body)
                if problem:
                    return await reply(counted_send, 400, problem)
                if headers.get(b"content-type", b"").split(b";")[0].strip().lower() != b"application/json":
                    # JSON sent without its type (curl -d sends form-encoded): read as the JSON it is
                    scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"] + [
                        (b"content-type", b"application/json")]
            sent = False

            async def replay():
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # the disconnect, for streaming responses

            try:
                await self.app(scope, replay, counted_send)
            except Exception as err:
                if not hasattr(err, "txl_request_id"):
                    raise
                # answered (500) and logged under its id; Starlette raises it again for the server to log, which
                # would log it twice and close a keep-alive connection under the client's next request
        finally:
            metrics.in_flight -= 1


MAX_FIELDS = 32  #: more keys than any request has: refused before validation (each unknown key costs an error)


def json_problem(body: bytes) -> str | None:
    """Why a request body cannot be a request (not JSON, not an object, too many fields), or None."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as err:  # also numbers Python refuses, nesting too deep
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err).split(":")[0]
        return f"the request body is not valid JSON ({reason})"
    if not isinstance(value, dict):
        return f"the request body must be a JSON object, not {type(value).__name__}"
    if len(value) > MAX_FIELDS:
        return f"the request body has {len(value):,} fields; no request takes more than {MAX_FIELDS}"
    return None


async def reply(send, status: int, message: str, retry_after: bool = False) -> None:
    """Answer a request with the JSON error body (before the application saw it)."""
    body, headers = error_response(status, message)
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"retry-after", b"1")] if retry_after else [])})
    await send({"type": "http.response.body", "body": body})
