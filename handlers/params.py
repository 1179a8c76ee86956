"""Path and query parameters shared by several routes, with their bounds.

A path id is never refused for its shape: a client cannot know our id grammar, so an
id that names nothing is `404` with the route's own not-found code, whatever it looks
like. `unknown_ids_are_not_found` (the app's `before_request`) answers that before the
handler runs for any id that cannot be one, so no odd value (a NUL, which PostgreSQL
refuses outright, or a megabyte of text) ever reaches a query; the rest are looked up.
A cursor is ours to hand out, so a malformed one stays a validation error.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request
from litestar.params import Parameter

from core.errors import NotFound
from core.ids import could_be_id
from core.models_registry import could_be_model_id

ID_PATTERN = r"^[a-z]{1,12}_[0-9a-z]{1,40}$"

TaskId = Annotated[str, Parameter(description="a task id (the same as its response id)")]
ClientId = Annotated[str, Parameter(description="a client id")]
ScheduleId = Annotated[str, Parameter(description="a schedule id")]
Cursor = Annotated[str | None, Parameter(pattern=ID_PATTERN, max_length=64,
                                         description="`next_cursor` of the previous page")]
PageLimit = Annotated[int, Parameter(ge=1, le=100)]

# Every path parameter that names a stored thing: its not-found code and its grammar.
_ID_PARAMS = {
    "task_id": ("task_not_found", could_be_id),
    "response_id": ("task_not_found", could_be_id),
    "client_id": ("client_not_found", could_be_id),
    "schedule_id": ("schedule_not_found", could_be_id),
    "model_id": ("model_not_found", could_be_model_id),
}


def model_id_of(path_value: str) -> str:
    """A model id from a `{model_id:path}` parameter, which keeps the leading `/`."""
    return path_value.removeprefix("/")


async def unknown_ids_are_not_found(request: Request[Any, Any, Any]) -> None:
    """Async on purpose: Litestar runs a sync `before_request` on a worker thread, a
    thread hop on every request for a check that takes microseconds."""
    for name, value in request.path_params.items():
        known = _ID_PARAMS.get(name)
        if known is None:
            continue
        code, could_be = known
        text = model_id_of(value) if name == "model_id" else value
        if not isinstance(text, str) or not could_be(text):
            raise NotFound(code, "no such " + name.removesuffix("_id"))
