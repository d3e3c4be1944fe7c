"""Exceptions raised by the PandaStack SDK.

Every error the SDK raises is a :class:`PandaError`. Errors answered by the
server carry the HTTP status and the ``code`` of the API's error body
(``{"error": {"code": ..., "message": ...}}``) and are raised as the subclass
for that code, so callers can write ``except NotFoundError:``.
"""

from __future__ import annotations

import builtins
import json
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = [
    "PandaError",
    "ConfigurationError",
    "PandaConnectionError",
    "RequestTimeoutError",
    "BadRequestError",
    "AuthenticationError",
    "ForbiddenError",
    "NotFoundError",
    "ConflictError",
    "CorruptError",
    "PayloadTooLargeError",
    "InvalidArgumentError",
    "QuotaExceededError",
    "TooManyRequestsError",
    "InsufficientStorageError",
    "UnavailableError",
    "ForkError",
    "error_from_response",
    "error_from_body",
]


class PandaError(Exception):
    """Base class of every error raised by the SDK.

    Attributes:
        message: Human-readable description, written for users.
        status: HTTP status of the response, or ``None`` when the error did not
            come from an HTTP response (network failure, bad configuration, an
            error event in an exec stream).
        code: The API error code (``"not_found"``, ``"conflict"``...), or
            ``None`` when the server sent none.
    """

    def __init__(self, message: str, *, status: Optional[int] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message: str = message
        self.status: Optional[int] = status
        self.code: Optional[str] = code

    def __str__(self) -> str:
        parts = []
        if self.code:
            parts.append(self.code)
        if self.status:
            parts.append("HTTP %d" % self.status)
        if parts:
            return "%s (%s)" % (self.message, ", ".join(parts))
        return self.message

    def __repr__(self) -> str:
        return "%s(message=%r, status=%r, code=%r)" % (type(self).__name__, self.message, self.status, self.code)


class ConfigurationError(PandaError):
    """The SDK is not configured well enough to talk to a server (e.g. no API key)."""


class PandaConnectionError(PandaError, builtins.ConnectionError):
    """The server could not be reached, or the connection broke mid-request.

    Also a built-in :class:`ConnectionError`. Exported as
    ``pandastack.ConnectionError`` too.
    """


class RequestTimeoutError(PandaConnectionError, builtins.TimeoutError):
    """The server did not answer within the client's timeout."""


class BadRequestError(PandaError):
    """400 ``bad_request``: malformed JSON, unknown fields, wrong types, a bad network policy entry (the message names it)."""


class AuthenticationError(PandaError):
    """401 ``unauthorized``: missing, unknown or revoked API key."""


class ForbiddenError(PandaError):
    """403 ``forbidden``: the key may not do this (admin-only endpoint, permission denied in the guest)."""


class NotFoundError(PandaError):
    """404 ``not_found``: unknown sandbox, snapshot, file or template, or not yours."""


class ConflictError(PandaError):
    """409 ``conflict``: wrong state for this (exec on a stopped sandbox, file exists, directory not empty)."""


class CorruptError(ConflictError):
    """409 ``corrupt``: a paused sandbox's or a snapshot's saved files fail their checksums.

    The server did not restore it. A paused sandbox stays paused with its files,
    for an operator to look at; a corrupt snapshot should be deleted.
    """


class PayloadTooLargeError(PandaError):
    """413 ``payload_too_large``: the request body is over the server's limit."""


class InvalidArgumentError(PandaError):
    """422 ``invalid``: a well-formed request with a bad value (relative path, TTL too long...)."""


class QuotaExceededError(PandaError):
    """429 ``quota_exceeded``: over one of the key's quotas (sandboxes, memory, vCPUs, disk); or ``template_limit``: the key owns its limit of templates."""


class TooManyRequestsError(PandaError):
    """429 ``too_many_requests``: too many commands, streams or file operations in flight
    on one sandbox or key at once; retry when some have finished."""


class InsufficientStorageError(PandaError):
    """507 ``insufficient_storage``: the host (or the sandbox's disk) is out of space."""


class UnavailableError(PandaError):
    """503 ``unavailable``: the server is shutting down or a host is unreachable."""


class ForkError(PandaError):
    """Some children of a multi-child fork failed.

    The children that were created are running and are yours: they are in
    :attr:`children` (kill them if you do not want them). The failures are in
    :attr:`errors`, one :class:`PandaError` per failed child, in request order.

    Attributes:
        children: The sandboxes that were created.
        errors: One error per child that could not be created.
    """

    def __init__(
        self,
        message: str,
        *,
        children: "List[Sandbox]",
        errors: List[PandaError],
        status: Optional[int] = None,
        code: Optional[str] = None,
    ) -> None:
        super().__init__(message, status=status, code=code)
        self.children: "List[Sandbox]" = list(children)
        self.errors: List[PandaError] = list(errors)


# Error code of the API -> exception class.
CODE_TO_CLASS: Dict[str, Type[PandaError]] = {
    "bad_request": BadRequestError,
    "unauthorized": AuthenticationError,
    "forbidden": ForbiddenError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "corrupt": CorruptError,
    "payload_too_large": PayloadTooLargeError,
    "invalid": InvalidArgumentError,
    "quota_exceeded": QuotaExceededError,
    "template_limit": QuotaExceededError,
    "too_many_requests": TooManyRequestsError,
    "insufficient_storage": InsufficientStorageError,
    "unavailable": UnavailableError,
}

# Used when a response has no (known) code: HTTP status -> exception class.
STATUS_TO_CLASS: Dict[int, Type[PandaError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidArgumentError,
    429: QuotaExceededError,
    503: UnavailableError,
    507: InsufficientStorageError,
}

# Canonical status of each code, for errors that arrive without a status
# (error events inside a 200 stream, per-child fork errors).
CODE_TO_STATUS: Dict[str, int] = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "corrupt": 409,
    "payload_too_large": 413,
    "invalid": 422,
    "method_not_allowed": 405,
    "quota_exceeded": 429,
    "template_limit": 429,
    "too_many_requests": 429,
    "internal": 500,
    "not_implemented": 501,
    "guest_error": 502,
    "bad_gateway": 502,
    "unavailable": 503,
    "timeout": 504,
    "insufficient_storage": 507,
}


def error_class(code: Optional[str], status: Optional[int]) -> Type[PandaError]:
    """Return the exception class for an API error code, falling back on the HTTP status."""
    if code and code in CODE_TO_CLASS:
        return CODE_TO_CLASS[code]
    if status is not None and status in STATUS_TO_CLASS:
        return STATUS_TO_CLASS[status]
    return PandaError


def error_from_body(body: Any, status: Optional[int] = None) -> PandaError:
    """Build the exception for an error object.

    ``body`` is either the whole error body ``{"error": {"code", "message"}}``
    or its inner ``{"code", "message"}`` object. ``status`` is the HTTP status
    when there is one.
    """
    inner: Any = body
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        inner = body["error"]
    code: Optional[str] = None
    message = ""
    if isinstance(inner, Mapping):
        c = inner.get("code")
        code = c if isinstance(c, str) and c else None
        m = inner.get("message")
        message = m if isinstance(m, str) else ""
    if status is None and code is not None:
        status = CODE_TO_STATUS.get(code)
    if not message:
        message = "the server reported an error" if code else "unexpected response from the server"
    cls = error_class(code, status)
    return cls(message, status=status, code=code)


def error_from_response(status: int, body: bytes, reason: str = "") -> PandaError:
    """Build the exception for a non-2xx HTTP response with raw ``body``.

    A body that is not the API's JSON error object (a proxy's HTML page, an
    empty body) still gives the class for ``status`` and a message that shows
    the start of the body.
    """
    try:
        parsed = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError):
        parsed = None
    if isinstance(parsed, Mapping) and isinstance(parsed.get("error"), Mapping):
        return error_from_body(parsed, status)
    text = body[:200].decode("utf-8", "replace").strip()
    message = "HTTP %d %s" % (status, reason or "")
    message = message.strip()
    if text:
        message += ": " + text
    return error_class(None, status)(message, status=status, code=None)
