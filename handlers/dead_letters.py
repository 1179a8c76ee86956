"""Dead letters (failed tasks whose attempts are spent) and retrying failed tasks: admin."""

from __future__ import annotations

from typing import Any

from litestar import Response, get, post

from core.objects import task_object
from core.store.new_tasks import retry_failed
from core.store.tasks import list_tasks
from handlers.answers import page, task_location
from handlers.auth import requires
from handlers.params import Cursor, PageLimit, TaskId
from handlers.services import Services
from handlers.threads import blocking


@get("/v1/dead-letters", opt=requires("admin"), tags=["dead letters"])
async def dead_letters_list(
    services: Services, limit: PageLimit = 20, after: Cursor = None
) -> dict[str, Any]:
    rows, cursor = await blocking(list_tasks, services.db, None, dead_lettered=True,
                                  limit=limit, after=after)
    return page([task_object(row) for row in rows], cursor)


@post("/v1/tasks/{task_id:str}/retry", opt=requires("admin"), status_code=202,
      tags=["dead letters"])
async def task_retry(task_id: TaskId, services: Services) -> Response[Any]:
    """A new task with the failed task's request (202 with `Location`); the failed one
    stays as it was, and the new one points back to it through `retry_of`."""
    new = await blocking(retry_failed, services.db, task_id,
                         services.settings.max_attempts_default)
    return Response(task_object(new), status_code=202, headers=task_location(new.id))


ROUTES = [dead_letters_list, task_retry]
