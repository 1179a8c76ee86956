"""The console's pages (GET, and HEAD as `handlers.heads` answers it): overview,
tasks, one task, dead letters, schedules, clients, models. Each reads one snapshot
through `handlers.console.reads` and renders one template; forms on them post to
`handlers.console.actions`."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from litestar import get
from litestar.params import Parameter

from core.errors import InvalidInput
from core.ids import could_be_id
from core.models_registry import could_be_model_id
from core.objects import LIFECYCLE_STATUS, TERMINAL_EVENTS
from core.priorities import HIGHEST_PRIORITY, LOWEST_PRIORITY
from core.states import Status
from handlers.console import reads
from handlers.console.render import html
from handlers.console.session import Session
from handlers.heads import head_of
from handlers.params import Cursor, TaskId
from handlers.services import Services

Filter = Annotated[str | None, Parameter(max_length=200)]
PRIORITY_NAMES = [str(p) for p in range(HIGHEST_PRIORITY, LOWEST_PRIORITY + 1)]
# Every event type a task's log can hold (docs/events.md), for the live tail's listeners.
EVENT_TYPES = (*LIFECYCLE_STATUS, "response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done")


def task_filters(status: str | None, client: str | None, model: str | None,
                 priority: str | None = None) -> reads.TaskFilters:
    """The list's filters from the query; an empty field means any (the filter form
    sends every field), a value no task can have is a 422."""
    status, client, model, priority = (value or None
                                       for value in (status, client, model, priority))
    if status is not None and status not in set(Status):
        raise InvalidInput("validation_error", "status: not one of the task states",
                           extra={"field": "status"})
    if client is not None and not could_be_id(client):
        raise InvalidInput("validation_error", "client: not a client id",
                           extra={"field": "client"})
    if model is not None and not could_be_model_id(model):
        raise InvalidInput("validation_error", "model: not a model id",
                           extra={"field": "model"})
    if priority is not None and priority not in PRIORITY_NAMES:
        raise InvalidInput("validation_error", "priority: not one of 0..9",
                           extra={"field": "priority"})
    return reads.TaskFilters(Status(status) if status else None, client, model,
                             None if priority is None else int(priority))


def next_page(path: str, query: dict[str, str], cursor: str | None) -> str | None:
    return None if cursor is None else f"{path}?{urlencode({**query, 'after': cursor})}"


@get("/")
async def overview(session: Session, services: Services) -> Any:
    data = await reads.read_page(services.db, reads.overview)
    return html("overview.html", session=session, page="overview", view=data)


@get("/tasks")
async def tasks(
    session: Session, services: Services, status: Filter = None,
    client: Filter = None, model: Filter = None, priority: Filter = None,
    after: Cursor = None,
) -> Any:
    filters = task_filters(status, client, model, priority)
    data = await reads.read_page(services.db, reads.task_list, filters, after)
    return html("tasks.html", session=session, page="tasks", view=data, filters=filters,
                statuses=list(Status), priorities=PRIORITY_NAMES,
                next_url=next_page("/console/tasks", filters.query(), data.next_cursor))


@get("/tasks/{task_id:str}")
async def task(session: Session, services: Services, task_id: TaskId) -> Any:
    data = await reads.read_page(services.db, reads.task_page, task_id)
    return html("task.html", session=session, page="tasks", view=data,
                summary=reads.event_summary, event_types=list(EVENT_TYPES),
                lifecycle={name: status.value for name, status in LIFECYCLE_STATUS.items()},
                terminal_events=sorted(TERMINAL_EVENTS))


@get("/dead-letters")
async def dead_letters(session: Session, services: Services,
                       after: Cursor = None) -> Any:
    data = await reads.read_page(services.db, reads.task_list, reads.TaskFilters(), after, True)
    return html("dead_letters.html", session=session, page="dead-letters", view=data,
                next_url=next_page("/console/dead-letters", {}, data.next_cursor))


@get("/schedules")
async def schedules(session: Session, services: Services, after: Cursor = None) -> Any:
    rows, cursor = await reads.read_page(services.db, reads.schedule_list, after)
    return html("schedules.html", session=session, page="schedules", schedules=rows,
                next_url=next_page("/console/schedules", {}, cursor))


@get("/clients")
async def clients(session: Session, services: Services, after: Cursor = None) -> Any:
    rows, cursor = await reads.read_page(services.db, reads.client_list, after)
    return html("clients.html", session=session, page="clients", clients=rows,
                next_url=next_page("/console/clients", {}, cursor))


@get("/models")
async def models(session: Session, services: Services) -> Any:
    rows = await reads.read_page(services.db, reads.model_list)
    return html("models.html", session=session, page="models", models=rows)


@get("/login")
async def login_form() -> Any:
    return html("login.html", session=None, page="login", error=None)


_PAGES = [overview, tasks, task, dead_letters, schedules, clients, models, login_form]
ROUTES = [*_PAGES, *map(head_of, _PAGES)]
