"""What the HTTP side of ``txl serve`` shares without FastAPI or torch: the JSON error body of every
refusal (routes, middleware and malformed HTTP alike) and the API key rule."""

from __future__ import annotations

from typing import Any

from txl.errors import TxlError

__all__ = ["error_body", "check_api_key"]

_KINDS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "request_timeout", 413: "request_too_large", 503: "overloaded_error"}


def error_body(status: int, message: str, kind: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response (``kind``: its ``type``, by default the status's)."""
    return {"error": {"message": message, "type": kind or _KINDS.get(status, "error"), "code": status}}


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
