"""Completed and failed tasks per minute, as the console's overview charts them."""

from __future__ import annotations

from core.states import Status
from core.store.database import Database
from core.store.finished_per_minute import MINUTE_MS, finished_per_minute
from tests.store.helpers import force, new_task


def test_finished_tasks_are_counted_in_the_minute_they_finished(db: Database,
                                                                model_id: str) -> None:
    now = 1_800_000_000_000 + 30_000  # half a minute into a minute
    minute = now - now % MINUTE_MS
    finished = [
        (Status.COMPLETED, now - 1_000),  # this minute
        (Status.COMPLETED, now - 2_000),
        (Status.FAILED, now - 5_000),
        (Status.COMPLETED, minute - 1),  # the minute before
        (Status.CANCELLED, now - 1_000),  # neither completed nor failed
        (Status.COMPLETED, minute - 60 * MINUTE_MS),  # an hour ago: outside the window
    ]
    for status, at in finished:
        force(db, new_task(db, model_id), status=status.value, finished_at=at)
    new_task(db, model_id)  # still queued

    minutes = finished_per_minute(db, now)

    assert len(minutes) == 60
    assert minutes[-1].start_ms == minute
    assert (minutes[-1].completed, minutes[-1].failed) == (2, 1)
    assert (minutes[-2].completed, minutes[-2].failed) == (1, 0)
    assert sum(m.completed + m.failed for m in minutes) == 4
    assert [m.start_ms for m in minutes] == [minute - (59 - i) * MINUTE_MS for i in range(60)]
