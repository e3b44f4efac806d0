"""The one exception hierarchy of vllmmlxd.

Serving code raises these; each API family has one handler that turns them into
its own error shape (OpenAI's ``{"error": {...}}``, later Anthropic's).
"""

from __future__ import annotations


class VllmmlxdError(Exception):
    """Base of every error the product raises on purpose."""


class ConfigError(VllmmlxdError):
    """A configuration file or option is invalid. ``str()`` names file:line:column."""


class ModelLoadError(VllmmlxdError):
    """A model spec could not be resolved, fetched, converted or loaded."""


class StoreError(VllmmlxdError):
    """A model store operation that cannot be done: a source that names no model, a pull that does
    not fit the disk or failed, a model that is in use or not there."""


class StoreBusy(StoreError):
    """Too many pulls are running and waiting: try again once some have ended."""


class RequestError(VllmmlxdError):
    """A client request that cannot be served; carries the HTTP status to answer with."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequest(RequestError):
    """Bad parameters (400)."""


class UnprocessableBody(RequestError):
    """The body is not JSON, not an object, or lacks a required field (422)."""

    status_code = 422


class PayloadTooLarge(RequestError):
    """The body is larger than the model's ``max_body_mb`` (413)."""

    status_code = 413


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus the tokens asked for) does not fit the model's context (400)."""

    def __init__(self, message: str, *, param: str | None = "messages"):
        super().__init__(message, param=param, code="context_length_exceeded")


class KvBudgetExceeded(InvalidRequest):
    """The request's KV (prompt + max_tokens) could never fit the model's KV budget, even alone (400)."""

    def __init__(self, message: str, *, param: str | None = "max_tokens"):
        super().__init__(message, param=param, code="kv_budget_exceeded")


class ModelNotFound(RequestError):
    status_code = 404
    error_type = "not_found_error"

    def __init__(self, message: str, *, param: str | None = "model"):
        super().__init__(message, param=param, code="model_not_found")


class NotFound(RequestError):
    """Something a request names (a stored response) is not here, or not the caller's (404)."""

    status_code = 404
    error_type = "invalid_request_error"  # as OpenAI answers an unknown response id


class Unauthorized(RequestError):
    status_code = 401
    error_type = "authentication_error"


class Forbidden(RequestError):
    """A valid key that may not use this model (403)."""

    status_code = 403
    error_type = "permission_error"


class Conflict(RequestError):
    """What the request would change is busy or held (a model in use, another pull of it under way) (409)."""

    status_code = 409
    error_type = "conflict_error"


class BadGateway(RequestError):
    """Something the request needed from elsewhere failed (the hub, during a pull) (502)."""

    status_code = 502
    error_type = "upstream_error"


class RateLimited(RequestError):
    """The client is over one of its request or token limits (429); ``headers`` say which and until when."""

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int, headers: dict[str, str] | None = None):
        super().__init__(message, code="rate_limit_exceeded")
        self.retry_after = retry_after
        self.headers = headers or {"Retry-After": str(retry_after)}


class BudgetExceeded(RateLimited):
    """The key has used up one of its budgets (429); the message names it and when it resets."""

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message, retry_after=retry_after)
        self.code = "budget_exceeded"


class Overloaded(RequestError):
    """The engine queue is full (503); the client may retry after ``retry_after`` seconds."""

    status_code = 503
    error_type = "overloaded_error"

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message, code="overloaded")
        self.retry_after = retry_after


class NotServed(RequestError):
    """An endpoint an API family defines that this server does not serve (501)."""

    status_code = 501
    error_type = "not_implemented"


class RequestTimeout(RequestError):
    """The request ran past the model's ``timeout`` (504)."""

    status_code = 504
    error_type = "timeout_error"


class EngineFailure(VllmmlxdError):
    """The engine failed while generating; a server-side fault (500)."""
