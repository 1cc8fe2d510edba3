"""What the HTTP side of ``txl serve`` shares without FastAPI or torch: the JSON error body of every
refusal (routes, middleware and malformed HTTP alike) and the API key rule."""

from __future__ import annotations

import json
from typing import Any

from txl.errors import TxlError, clip_message

__all__ = ["error_body", "error_response", "internal_error_message", "check_api_key"]

_KINDS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "request_timeout", 413: "request_too_large", 500: "internal_error",
          503: "overloaded_error"}


def error_body(status: int, message: str, kind: str | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response (``kind``: its ``type``, by default the status's; ``request_id``:
    the id under which the server's log holds an internal error's details). Runs of user input in
    ``message`` are cut to about 100 characters (:func:`txl.errors.clip_message`)."""
    body = {"message": clip_message(message), "type": kind or _KINDS.get(status, "error"), "code": status}
    if request_id is not None:
        body["request_id"] = request_id
    return {"error": body}


def error_response(status: int, message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """An error response sent below FastAPI (the guard, malformed HTTP): the encoded JSON of
    :func:`error_body` and its ``content-type`` and ``content-length`` headers."""
    body = json.dumps(error_body(status, message)).encode()
    return body, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


def internal_error_message(request_id: str) -> str:
    """What a client learns of a failure inside the server: that it happened, and the id to report (the
    exception itself stays in the server's log: it may hold paths and internals of the machine)."""
    return (f"internal error while handling this request (request id {request_id}); the server's log has the "
            "details under that id")


def check_api_key(api_key: str | None) -> None:
    """Refuse an API key that is empty or not printable ASCII without spaces at its ends.

    HTTP headers carry bytes: a key outside ASCII would be compared under one encoding and sent by
    clients under another, so it would never match.

    Raises:
        TxlError: one line naming the problem.
    """
    if api_key is None:
        return
    if not api_key.strip():
        raise TxlError("--api-key is empty: give a key clients will send, or leave the flag out")
    if not (api_key.isascii() and api_key.isprintable()) or api_key != api_key.strip():
        raise TxlError("--api-key must be printable ASCII without spaces at its ends (HTTP headers carry bytes, and "
                       "clients encode other characters differently): choose another key")
