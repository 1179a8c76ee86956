"""The console's forms (POST): log in and out, cancel, retry, delete a schedule, revoke
a client. Each calls the same `core` function as its API route and answers with a
redirect (303) back to a page, so a reload never repeats the action.

Every form but the login carries the session's CSRF token; every form, the login
included, is refused when the browser says it was posted from another origin. The
login is the one form read before a session is checked, so its body is held to
`PUBLIC_BODY_BYTES` (413 above): Litestar's parser of a url-encoded megabyte of empty
fields took a second or two.
"""

from __future__ import annotations

import math
from typing import Any

from litestar import Request, post
from litestar.exceptions import ClientException
from litestar.response import Redirect

from core.bodies import PUBLIC_BODY_BYTES
from core.console_sessions import ConsoleSession
from core.errors import InvalidInput
from core.store.clients import revoke
from core.store.console_sessions import log_in, log_out
from core.store.new_tasks import retry_failed
from core.store.schedules import delete_schedule
from core.store.tasks import cancel
from handlers.console.session import (
    COOKIE,
    CsrfRefused,
    Session,
    cleared_cookie,
    from_this_origin,
    session_cookie,
)
from handlers.params import ClientId, ScheduleId, TaskId
from handlers.services import Services
from handlers.threads import blocking, writing

AnyRequest = Request[Any, Any, Any]
_MAX_TOKEN_LENGTH = 512


async def _field(request: AnyRequest, name: str, max_length: int) -> str:
    """One text field of a url-encoded or multipart form ('' when absent).

    Litestar decodes a multipart part by the charset it names, and lets the error of a
    part its charset cannot decode, or of a charset Python does not know, escape: a
    form no browser sends, answered 400 like any other malformed body."""
    try:
        form = await request.form()
    except (UnicodeError, LookupError):
        raise ClientException("the form could not be decoded") from None
    value = form.get(name, "")
    if not isinstance(value, str) or len(value) > max_length:
        raise InvalidInput("validation_error", f"{name}: not a valid value",
                           extra={"field": name})
    return value


async def _checked(request: AnyRequest, session: ConsoleSession) -> None:
    """Refuse a state change that lacks this session's CSRF token or another origin's."""
    if not from_this_origin(request) or not session.accepts(await _field(request, "csrf", 128)):
        raise CsrfRefused()


def _back(path: str) -> Redirect:
    return Redirect(path, status_code=303)


@post("/login", request_max_body_size=PUBLIC_BODY_BYTES)
async def login(request: AnyRequest, services: Services) -> Redirect:
    """Exchange an admin token for a session cookie; the token is not kept anywhere."""
    if not from_this_origin(request):
        raise CsrfRefused()
    token = (await _field(request, "token", _MAX_TOKEN_LENGTH)).strip()
    hours = services.settings.console_session_hours
    secret = await blocking(log_in, services.db, token, ttl_ms=int(hours * 3_600_000))
    answer = _back("/console")
    # Rounded up: a session shorter than a second (TASKWARD_CONSOLE_SESSION_HOURS under
    # 1/3600) must not get `Max-Age=0`, a cookie the browser drops at once, unexplained.
    answer.cookies.append(session_cookie(request, secret, math.ceil(hours * 3600)))
    return answer


@post("/logout")
async def logout(request: AnyRequest, session: Session, services: Services) -> Redirect:
    await _checked(request, session)
    await blocking(log_out, services.db, request.cookies.get(COOKIE, ""))
    answer = _back("/console/login")
    answer.cookies.append(cleared_cookie(request))
    return answer


@post("/tasks/{task_id:str}/cancel")
async def cancel_task(request: AnyRequest, session: Session, services: Services,
                      task_id: TaskId) -> Redirect:
    await _checked(request, session)
    await writing(services.db, cancel, services.db, task_id, None)
    return _back(f"/console/tasks/{task_id}")


@post("/tasks/{task_id:str}/retry")
async def retry_task(request: AnyRequest, session: Session, services: Services,
                     task_id: TaskId) -> Redirect:
    """A new task with the failed one's request; the browser lands on the new task."""
    await _checked(request, session)
    new = await blocking(retry_failed, services.db, task_id,
                         services.settings.max_attempts_default)
    return _back(f"/console/tasks/{new.id}")


@post("/schedules/{schedule_id:str}/delete")
async def remove_schedule(request: AnyRequest, session: Session, services: Services,
                          schedule_id: ScheduleId) -> Redirect:
    await _checked(request, session)
    await blocking(delete_schedule, services.db, schedule_id, None)
    return _back("/console/schedules")


@post("/clients/{client_id:str}/revoke")
async def revoke_client(request: AnyRequest, session: Session, services: Services,
                        client_id: ClientId) -> Redirect:
    """Revoke a client; its tokens and its console sessions end at once."""
    await _checked(request, session)
    await blocking(revoke, services.db, client_id)
    services.tokens.forget()
    return _back("/console/clients")


ROUTES = [login, logout, cancel_task, retry_task, remove_schedule, revoke_client]
