"""Every failure becomes one RFC 9457 problem document, in this one place.

`problem_of` maps domain errors, Litestar's HTTP errors and anything unexpected to
`{"type", "title", "status", "detail", "code", ...}` served as
`application/problem+json` through Litestar's problem-details plugin. `code` sits at
the top level, where OpenAI's SDK error classes read it. Details are written here or
by the domain, never copied from the request, so no prompt, output or token is ever
echoed. Answers that repeating cannot fix carry `x-should-retry: false`, which tells
OpenAI's SDKs not to retry them.
"""

from __future__ import annotations

import logging
import math
from http import HTTPStatus
from typing import Any

from litestar.exceptions import HTTPException, ValidationException
from litestar.exceptions.base_exceptions import SerializationException
from litestar.plugins.problem_details import (
    ProblemDetailsConfig,
    ProblemDetailsException,
    ProblemDetailsPlugin,
)
from sqlalchemy import Row
from sqlalchemy.exc import DataError, DBAPIError

from core.bodies import field_path
from core.errors import DomainError, TooManyRequests, Unauthorized, unstorable_value
from core.failure_streak import FailureTally
from core.objects import task_object
from core.store.outage import drop_cause, is_connection_dropped, outage_cause
from handlers.limits import limit_header, reset_header
from handlers.slow_clients import BodyTimeout, ClientDisconnected
from handlers.threads import store_unavailable

log = logging.getLogger("taskward.http")

# Clients retry a 503 every second (`Retry-After: 1`): one line per answer would be
# one per client a second for as long as the store is out. One tally per cause
# (`core.store.outage.outage_cause`): a new cause (a full server where it was down) is told at once.
_OUTAGE_ANSWERS: dict[tuple[str, str], FailureTally] = {}
_RETRYABLE_4XX = frozenset({408, 429})
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
}
_MAX_LISTED_ERRORS = 10
_VALIDATION_ERROR = "validation_error"
_WHOLE_BODY = "body"  # the field a fault of the whole request is told under


def problem_details_plugin() -> ProblemDetailsPlugin:
    return ProblemDetailsPlugin(ProblemDetailsConfig(
        exception_to_problem_detail_map={Exception: problem_of},
    ))


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> ProblemDetailsException:
    """A problem with our shape: type derived from `code`, title from the status."""
    headers = dict(headers or {})
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        headers["x-should-retry"] = "false"
    return ProblemDetailsException(
        status_code=status,
        type_=f"urn:taskward:problem:{code}",
        title=HTTPStatus(status).phrase,
        detail=detail,
        extra={"code": code, **(extra or {})},
        headers=headers,
    )


def problem_of(exc: Exception) -> ProblemDetailsException:
    """The problem document for any exception that reached the top of a request."""
    if isinstance(exc, ClientDisconnected):
        return problem(400, "client_disconnected", "the request body could not be read: "
                       "the client left or sent a malformed body")
    if isinstance(exc, BodyTimeout):
        return problem(408, exc.code, exc.message, headers={"Connection": "close"})
    if isinstance(exc, DomainError):
        return _domain_problem(exc)
    if isinstance(exc, ValidationException):
        return _validation_problem(exc)
    if isinstance(exc, HTTPException):
        return _http_problem(exc)
    if isinstance(exc, DataError):
        return _domain_problem(unstorable_value())
    if store_unavailable(exc):
        _outage_answered(exc)
        return problem(503, "store_unavailable", "the store is unavailable; try again",
                       headers={"Retry-After": "1"})
    log.exception("unhandled %s", type(exc).__name__)
    return problem(500, "internal_error", "the server failed to answer this request")


def _outage_answered(exc: Exception) -> None:
    """Count a `503 store_unavailable` answered for `exc` in its tally; its lines name
    the driver's error class and what `outage_cause` may say of it, or for a connection
    the store dropped, `drop_cause`: psycopg's "the connection is lost" has no SQLSTATE
    of its own, the one the server ended the session with is on the error before it."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc
    said = drop_cause(exc) if is_connection_dropped(exc) else outage_cause(cause)
    said = said.replace("%", "%%")
    said = f"; {said}" if said else ""
    tally = _OUTAGE_ANSWERS.get((type(cause).__name__, said))
    if tally is None:
        tally = _OUTAGE_ANSWERS[type(cause).__name__, said] = FailureTally(
            log, f"store unavailable (%s): requests are answered 503 store_unavailable{said}",
            f"store still unavailable (%s): %d more requests answered 503 "
            f"store_unavailable{said}")
    tally.failed(cause)


def _domain_problem(exc: DomainError) -> ProblemDetailsException:
    extra = {key: task_object(value) if isinstance(value, Row) else value
             for key, value in exc.extra.items()}
    if exc.code == _VALIDATION_ERROR:
        extra.update(_field_errors([_domain_field_error(exc)]))
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    if isinstance(exc, TooManyRequests):
        headers = limit_headers(exc)
    return problem(exc.status, exc.code, exc.message, extra=extra, headers=headers)


def limit_headers(exc: TooManyRequests) -> dict[str, str]:
    """`Retry-After` and the `x-ratelimit-*` headers OpenAI's SDKs read: they wait that
    long (up to a minute) and retry by themselves."""
    return {"Retry-After": str(max(1, math.ceil(exc.retry_after))),
            "retry-after-ms": str(max(1, math.ceil(exc.retry_after * 1000))),
            "x-ratelimit-limit-requests": limit_header(exc.limit),
            "x-ratelimit-remaining-requests": str(exc.remaining),
            "x-ratelimit-reset-requests": reset_header(exc.retry_after)}


def _validation_problem(exc: ValidationException) -> ProblemDetailsException:
    """Litestar's parameter and body validation: 422 naming each field, never its value."""
    listed = exc.extra if isinstance(exc.extra, list) else []
    errors = [_field_error(item) for item in listed[:_MAX_LISTED_ERRORS] if isinstance(item, dict)]
    if not errors:
        errors = [{"field": _WHOLE_BODY, "message": "the request is not valid"}]
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return problem(422, _VALIDATION_ERROR, detail, extra=_field_errors(errors))


def _field_errors(errors: list[dict[str, str]]) -> dict[str, Any]:
    """The members every `validation_error` carries, whoever found the fault (the schema
    or the domain): `field`, the first offending one, and `errors`, each as
    `{"field", "message"}`."""
    return {"field": errors[0]["field"], "errors": errors}


def _domain_field_error(exc: DomainError) -> dict[str, str]:
    """The one fault a domain `validation_error` names (`extra={"field": …}`), its
    message without the `field: ` the detail starts with; a fault that names no field
    is the body's, as the schema's would be."""
    field = str(exc.extra.get("field") or _WHOLE_BODY)
    message = exc.message.removeprefix(f"{field}: ")
    return {"field": field, "message": message}


def _field_error(item: dict[str, Any]) -> dict[str, str]:
    field = str(item.get("key") or item.get("source") or _WHOLE_BODY)
    if field == "data":  # Litestar's name for the body when it is missing entirely
        return {"field": _WHOLE_BODY, "message": "a JSON object is required"}
    message = str(item.get("message", "invalid value"))
    if message.startswith("Invalid enum value"):  # msgspec quotes the value it was sent
        message = "not one of the allowed values"
    return {"field": field_path([field]), "message": message[:200]}


def _http_problem(exc: HTTPException) -> ProblemDetailsException:
    status = exc.status_code
    if status == 400 and isinstance(exc.__cause__, SerializationException):
        return problem(400, "malformed_json", "the request body is not valid JSON")
    if status == 413:
        return problem(413, "body_too_large", "the request body is larger than the limit")
    if status >= 500:
        log.error("HTTP %s raised inside the framework", status)
    code = _HTTP_CODES.get(status, "http_error")
    return problem(status, code, HTTPStatus(status).phrase, headers=exc.headers)
