"""Domain errors: one hierarchy, each error with a stable machine-readable `code`.

Handlers map the classes to HTTP statuses in one place; messages are for humans and
never carry a prompt, an output or a token.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base of every error the domain raises on purpose; `status` is its HTTP status
    (a 4xx for the caller's mistakes, 503 for a store whose schema is not ours)."""

    status = 400

    def __init__(self, code: str, message: str, *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra or {}


class InvalidInput(DomainError):
    status = 422


def unstorable_value() -> InvalidInput:
    """A value the store refused that no check caught (PostgreSQL takes no NUL character
    in text): the caller's mistake, told alike by the API (422) and the CLI."""
    return InvalidInput("validation_error", "a value contains a character that cannot be stored")


class NotFound(DomainError):
    status = 404


class Conflict(DomainError):
    status = 409


class Unauthorized(DomainError):
    status = 401


class Forbidden(DomainError):
    status = 403


class TooManyRequests(DomainError):
    """A client is over one of its limits (`core.quotas`): it may try again later.

    `limit` and `remaining` are in the limit's own unit (tasks, requests per second,
    streams); `retry_after` is when trying again may succeed, in seconds."""

    status = 429

    def __init__(self, code: str, message: str, *, limit: float, remaining: int = 0,
                 retry_after: float = 1.0) -> None:
        super().__init__(code, message)
        self.limit = limit
        self.remaining = remaining
        self.retry_after = retry_after


class LeaseLost(DomainError):
    """A worker's fenced write changed nothing: another owner or state holds the task."""

    status = 409

    def __init__(self, task_id: str) -> None:
        super().__init__("lease_lost", f"task {task_id} is no longer held by this worker")
        self.task_id = task_id


class CancelRequested(DomainError):
    """The worker still owns the task, but a client asked to cancel it."""

    status = 409

    def __init__(self, task_id: str) -> None:
        super().__init__("cancel_requested", f"task {task_id} is being cancelled")
        self.task_id = task_id


class ForbiddenTransition(DomainError):
    status = 409


class SchemaMismatch(DomainError):
    """The database schema is not the one this code knows; start-up must stop."""

    status = 503
