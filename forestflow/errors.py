"""One error hierarchy for the whole gateway.

The core raises these; each front-end maps an error's :class:`Kind` once to its own status
(HTTP status, gRPC code, GraphPipe error code). ``envelope_key`` and ``fields`` reproduce
ForestFlow's error envelopes (``{"UnknownContract": {"contract": ...}}``); ``message`` is a
fixed, safe text for clients: never a stack trace.
"""

from __future__ import annotations

import enum
from typing import Any


class Kind(enum.Enum):
    """What class of failure an error is; front-ends map this to their status codes."""

    INVALID = "invalid"  # malformed input: HTTP 400, gRPC INVALID_ARGUMENT
    NOT_FOUND = "not_found"  # HTTP 404, NOT_FOUND
    METHOD_NOT_ALLOWED = "method_not_allowed"  # HTTP 405
    CONFLICT = "conflict"  # HTTP 409, ALREADY_EXISTS
    UNPROCESSABLE = "unprocessable"  # well-formed but cannot be done: HTTP 422, FAILED_PRECONDITION
    TOO_LARGE = "too_large"  # HTTP 413, RESOURCE_EXHAUSTED
    OVERLOADED = "overloaded"  # HTTP 503 + Retry-After, RESOURCE_EXHAUSTED
    UNAVAILABLE = "unavailable"  # HTTP 503, UNAVAILABLE
    DEADLINE = "deadline"  # HTTP 504, DEADLINE_EXCEEDED
    CANCELLED = "cancelled"  # the client went away: 499 in the prediction log, gRPC CANCELLED
    UNAUTHENTICATED = "unauthenticated"  # HTTP 401
    FORBIDDEN = "forbidden"  # HTTP 403
    INTERNAL = "internal"  # HTTP 500, INTERNAL
    BAD_GATEWAY = "bad_gateway"  # a remote backend failed: HTTP 502, INTERNAL


#: The HTTP-style status of each kind (HTTP front-ends, GraphPipe error codes, prediction-log events).
HTTP_STATUS: dict[Kind, int] = {
    Kind.INVALID: 400,
    Kind.UNAUTHENTICATED: 401,
    Kind.FORBIDDEN: 403,
    Kind.NOT_FOUND: 404,
    Kind.METHOD_NOT_ALLOWED: 405,
    Kind.CONFLICT: 409,
    Kind.TOO_LARGE: 413,
    Kind.UNPROCESSABLE: 422,
    Kind.INTERNAL: 500,
    Kind.BAD_GATEWAY: 502,
    Kind.OVERLOADED: 503,
    Kind.UNAVAILABLE: 503,
    Kind.DEADLINE: 504,
    Kind.CANCELLED: 499,
}


def http_status(error: GatewayError) -> int:
    """The HTTP-style status code of an error."""
    return HTTP_STATUS[error.kind]


class GatewayError(Exception):
    """Base of every error the gateway answers with.

    Subclasses set ``kind`` and build ``message`` (safe to show a client) and ``fields``
    (the body of the ForestFlow-style envelope).
    """

    kind: Kind = Kind.INTERNAL

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields

    @property
    def envelope_key(self) -> str:
        """The JSON key ForestFlow wraps this error in (the class name)."""
        return type(self).__name__

    @property
    def code(self) -> str:
        """A stable machine-readable code (same as the envelope key)."""
        return self.envelope_key


class InvalidInput(GatewayError):
    """A request body, parameter or tensor that cannot be understood."""

    kind = Kind.INVALID


class PayloadTooLarge(GatewayError):
    """A body, tensor or batch over a configured limit."""

    kind = Kind.TOO_LARGE


class UnknownContract(GatewayError):
    """No contract with this id is registered."""

    kind = Kind.NOT_FOUND

    def __init__(self, contract: Any) -> None:
        super().__init__(f"unknown contract {contract}", contract=contract)


class UnknownServable(GatewayError):
    """No servable with this FQRV is registered."""

    kind = Kind.NOT_FOUND

    def __init__(self, fqrv: Any) -> None:
        super().__init__(f"unknown servable {fqrv}", fqrv=fqrv)


class NotFound(GatewayError):
    """A route or resource that does not exist."""

    kind = Kind.NOT_FOUND


class MethodNotAllowed(GatewayError):
    """A known route called with the wrong HTTP method."""

    kind = Kind.METHOD_NOT_ALLOWED


class ServableAlreadyExistsError(GatewayError):
    """A create for an FQRV that is already deployed."""

    kind = Kind.CONFLICT

    def __init__(self, fqrv: Any, servable_settings: Any = None) -> None:
        super().__init__(f"servable {fqrv} already exists", fqrv=fqrv, servableSettings=servable_settings)


class NoActiveServablesForContract(GatewayError):
    """The contract exists but no servable is valid to answer."""

    kind = Kind.UNPROCESSABLE

    def __init__(self, contract: Any) -> None:
        super().__init__(f"no active servable for contract {contract}", contract=contract)


class ContractNotReady(NoActiveServablesForContract):
    """The contract has nothing loaded to answer with right now (a release still loading here, or
    failed to load): a 503 with Retry-After, not the 422 of a contract whose servables are all
    invalid by policy. A subclass, so code that falls back when nothing is active still does."""

    kind = Kind.UNAVAILABLE

    def __init__(self, contract: Any, reason: str = "its servables are still loading") -> None:
        GatewayError.__init__(self, f"no servable of contract {contract} is ready to answer: {reason}", contract=contract)


class ContractValidationError(GatewayError):
    """Contract settings that cannot be applied (already exists, or invalid)."""

    kind = Kind.UNPROCESSABLE

    def __init__(self, contract: Any, msg: str) -> None:
        super().__init__(msg, contract=contract, msg=msg)


class CreateServableRequestInvalidError(GatewayError):
    """A servable definition that is invalid or whose artifact failed to load."""

    kind = Kind.UNPROCESSABLE

    def __init__(self, msg: str, serve_request: Any = None) -> None:
        super().__init__(msg, serveRequest=serve_request, errorMessage=msg)


class CannotExplain(GatewayError):
    """The release that answered can be explained neither exactly (trees) nor by a declared explainer."""

    kind = Kind.UNPROCESSABLE


class ServableNotReady(GatewayError):
    """The servable is registered but not loaded (yet, or any more)."""

    kind = Kind.UNAVAILABLE


class Overloaded(GatewayError):
    """A queue is full: the request is refused at once; retry after ``retry_after`` seconds."""

    kind = Kind.OVERLOADED

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(GatewayError):
    """The request's deadline passed while it was queued or being scored."""

    kind = Kind.DEADLINE


class ClientClosedRequest(GatewayError):
    """The caller disconnected (or cancelled) before its answer was ready; nobody receives a reply."""

    kind = Kind.CANCELLED


class StoreUnavailable(GatewayError):
    """The shared registry store cannot be written now (e.g. Redis is away)."""

    kind = Kind.UNAVAILABLE


class Unauthenticated(GatewayError):
    """An admin request without credentials."""

    kind = Kind.UNAUTHENTICATED


class Forbidden(GatewayError):
    """An admin request with wrong credentials."""

    kind = Kind.FORBIDDEN


class PredictionFailed(GatewayError):
    """Model code raised while scoring (or answered something unusable): the server's failure, a 500.

    The cause (exception type and traceback) goes to the gateway log, never to the client;
    release gates count these as failures. What the gateway itself rejects while decoding a
    request stays an :class:`InvalidInput` (400).
    """

    kind = Kind.INTERNAL

    def __init__(self, fqrv: Any, message: str = "the model failed to score the request") -> None:
        super().__init__(message, fqrv=fqrv, errorMessage=message)


class InternalError(GatewayError):
    """An unexpected failure in the gateway itself (not in model code); the detail is logged."""

    kind = Kind.INTERNAL

    def __init__(self, fqrv: Any, message: str = "internal error") -> None:
        super().__init__(message, fqrv=fqrv, errorMessage=message)


class BackendUnavailable(GatewayError):
    """A remote backend cannot be reached (refused, reset, circuit open): 503 with Retry-After.

    ``detail`` (what the backend said) goes to the log and the release's metadata, not to clients.
    """

    kind = Kind.UNAVAILABLE

    def __init__(self, fqrv: Any, backend: str, reason: str, retry_after: float = 1.0, detail: str = "") -> None:
        super().__init__(f"backend {backend} of {fqrv} is unavailable: {reason}", fqrv=fqrv, backend=backend)
        self.retry_after = retry_after
        self.detail = detail


class BackendFailed(GatewayError):
    """A remote backend answered with a failure of its own (a 5xx, a broken answer): 502.

    ``detail`` (what the backend said: its exception text, say) goes to the log and the release's
    metadata, not to clients.
    """

    kind = Kind.BAD_GATEWAY

    def __init__(self, fqrv: Any, backend: str, reason: str, detail: str = "") -> None:
        super().__init__(f"backend {backend} of {fqrv} failed: {reason}", fqrv=fqrv, backend=backend)
        self.detail = detail
