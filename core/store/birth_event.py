"""The one event every task is born with, in one place: the births' statements write it
as constants of their text (`core.store.sqlite_births`, `core.store.pg_births`), and a
stream of the request that created the task sends it without reading it back
(`handlers.sse`)."""

from __future__ import annotations

from types import SimpleNamespace

from core.store.database import LoggedEvent

SEQ = 1
TYPE = "response.created"
DATA = "{}"  # no data of its own: the stream renders the response object around it


def birth_event(task: SimpleNamespace) -> LoggedEvent:
    """The birth event of `task`, as created (its row not read back)."""
    return LoggedEvent(SEQ, TYPE, task.created_at, DATA)
