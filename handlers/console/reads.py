"""What each console page shows, read through the API's own `core` functions (a page
never runs SQL of its own).

Each function takes the store and the page's `now` and returns plain objects for a
template; `read_page` runs one on the store thread pool. A page reads only what it
shows: a page of rows, and the names of the clients of those rows (never the whole
clients table, which may hold tens of thousands). The overview uses the indexed
queries behind `/metrics` (`core.store.queue_stats`) and the per-minute counts of
`core.store.finished_per_minute`, so it costs the live tasks, not the history.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from core.clients import client_object
from core.objects import event_object, model_object, task_object
from core.schedules import list_schedules, schedule_object
from core.states import TERMINAL, Status
from core.store.clients import client_names, clients_page
from core.store.database import Database
from core.store.finished_per_minute import finished_per_minute
from core.store.models import list_models
from core.store.queue_stats import QueueStats, queue_stats
from core.store.tasks import list_tasks, recent_models, task_and_events
from handlers.console.chart import Chart, throughput_chart
from handlers.threads import blocking

T = TypeVar("T")
PAGE_SIZE = 50
EVENTS_SHOWN = 200  # a task page shows the latest this many events; the tail adds more
# The model filter offers the models of this many newest tasks besides the registered
# ones: a bounded read of the primary key, where every model tasks name is a full scan.
MODELS_SCANNED = 5000


async def read_page(db: Database, build: Callable[..., T], *args: Any) -> T:
    """`build(db, now, *args)` off the event loop."""
    return await blocking(build, db, db.clock.now_ms(), *args)


@dataclass(frozen=True)
class Overview:
    now: int
    stats: QueueStats
    chart: Chart

    @property
    def oldest_due_wait_ms(self) -> int | None:
        """Never below 0: a hand-back is stamped by the clock of the process that wrote
        it, which may run ahead of this one's (as `/metrics` reads it)."""
        at = self.stats.oldest_due_at
        return None if at is None else max(0, self.now - at)


def overview(db: Database, now: int) -> Overview:
    return Overview(now, queue_stats(db, now), throughput_chart(finished_per_minute(db, now)))


@dataclass(frozen=True)
class TaskFilters:
    """The task list's filters; None means any."""

    status: Status | None = None
    client_id: str | None = None
    model: str | None = None
    priority: int | None = None

    def query(self) -> dict[str, str]:
        """The filters as query parameters, for links to further pages."""
        wanted = {"status": self.status, "client": self.client_id, "model": self.model,
                  "priority": self.priority}
        return {key: str(value) for key, value in wanted.items() if value is not None}


@dataclass(frozen=True)
class ModelChoice:
    id: str
    registered: bool  # False: removed from the registry, though tasks still name it


@dataclass(frozen=True)
class TaskList:
    tasks: list[dict[str, Any]]
    next_cursor: str | None
    client_names: dict[str, str]  # of the clients of `tasks` only
    models: list[ModelChoice]  # for the model filter (the dead letters have none)


def task_list(db: Database, _now: int, filters: TaskFilters, after: str | None,
              dead_lettered: bool = False) -> TaskList:
    rows, cursor = list_tasks(db, filters.client_id, status=filters.status, model=filters.model,
                              priority=filters.priority, dead_lettered=dead_lettered,
                              limit=PAGE_SIZE, after=after)
    return TaskList([task_object(row) for row in rows], cursor,
                    client_names(db, {row.client_id for row in rows}),
                    [] if dead_lettered else model_choices(db, filters.model))


def model_choices(db: Database, chosen: str | None) -> list[ModelChoice]:
    """The model filter's choices: the registered models, those the newest tasks name
    (a removed model's tasks outlive its entry: the operator still filters them) and
    the one filtered on (from the URL), so the form shows it and sends it again."""
    registered = {row.id for row in list_models(db)}
    named = recent_models(db, MODELS_SCANNED) | ({chosen} if chosen else set())
    return [ModelChoice(model, model in registered) for model in sorted(registered | named)]


@dataclass(frozen=True)
class TaskPage:
    task: dict[str, Any]
    output_text: str
    events: list[dict[str, Any]]
    client_name: str
    retry_of: str | None
    active: bool


def task_page(db: Database, _now: int, task_id: str) -> TaskPage:
    """The task, its output so far and its latest events, as of one snapshot: the live
    tail then starts right after `task["last_seq"]`, and nothing is shown twice.

    The latest `EVENTS_SHOWN` are wanted: a longer log is read again from where its
    last `EVENTS_SHOWN` begin, until a read's events reach that read's `last_seq`. A
    read that ends short of it without being full is the log as stored: retention
    removes a finished task's newest events first, batch by batch, and such a task,
    read again from the same place for ever, held a store thread and the page (red
    team). Where none of the newest are left, the read goes on from the last event
    read; each read ends further on, so the reads end.
    """
    row, rows = task_and_events(db, task_id, None, after=0, limit=EVENTS_SHOWN)
    while len(rows) == EVENTS_SHOWN and rows[-1].seq < row.last_seq:
        newer_row, newer = task_and_events(db, task_id, None, after=row.last_seq - EVENTS_SHOWN,
                                           limit=EVENTS_SHOWN)
        if not newer:  # the newest are gone: on from the last event read
            newer_row, newer = task_and_events(db, task_id, None, after=rows[-1].seq,
                                               limit=EVENTS_SHOWN)
        if not newer or newer[-1].seq <= rows[-1].seq:
            break
        row, rows = newer_row, newer
    events = [event_object(row, row, event) for event in rows]
    name = client_names(db, [row.client_id]).get(row.client_id, "")
    return TaskPage(task_object(row), row.output_text or "", events, name, row.retry_of,
                    Status(row.status) not in TERMINAL)


def schedule_list(db: Database, _now: int,
                  after: str | None) -> tuple[list[dict[str, Any]], str | None]:
    rows, cursor = list_schedules(db, None, limit=PAGE_SIZE, after=after)
    return [schedule_object(row) for row in rows], cursor


def client_list(db: Database, _now: int,
                after: str | None) -> tuple[list[dict[str, Any]], str | None]:
    rows, cursor = clients_page(db, limit=PAGE_SIZE, after=after)
    return [client_object(row) for row in rows], cursor


def model_list(db: Database, _now: int) -> list[dict[str, Any]]:
    return [model_object(row) for row in list_models(db)]


def event_summary(event: dict[str, Any]) -> str:
    """One line about an event for the log table: its text, or why it happened."""
    data = event["data"]
    if "delta" in data:
        return json.dumps(data["delta"], ensure_ascii=False)
    if "reason" in data:
        return f"reason: {data['reason']}"
    error = (data.get("response") or {}).get("error")
    return f"error: {error['code']}" if error else ""
