"""kill -9 of `taskward run` in the middle of a real generation, then a restart: a
`resume` task continues from its last snapshot and its output is exactly what an
uninterrupted run produces, with nothing repeated or lost (docs/state-machine.md,
docs/events.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import Settings
from core.store.connect import open_database
from tests.scheduler.helpers import streamed_text
from tests.scheduler.processes import wait_until
from tests.service.running import (
    STORY,
    Runs,
    assert_log_sound,
    create,
    deltas,
    events,
    finished,
    output_text,
    response,
    run_env,
)
from tests.store.helpers import task_row

pytestmark = pytest.mark.model

REQUEST = {**STORY, "max_output_tokens": 64}


def test_a_resume_task_killed_mid_generation_ends_as_an_uninterrupted_run_would(
    runs: Runs, tmp_path: Path
) -> None:
    env = run_env(tmp_path, flush_interval_ms=20, drain_seconds=1)
    first = runs.start(env)
    token = first.pair()
    with first.client(token) as client:
        task_id = create(client, **REQUEST, on_restart="resume")["id"]
        wait_until(lambda: sum(e["type"] == "response.output_text.delta"
                               for e in events(client, task_id)) >= 3,
                   timeout=60, what="three persisted deltas")
    first.kill9()

    db = open_database(Settings(database_url=env["TASKWARD_DATABASE_URL"]))
    try:
        row = task_row(db, task_id)
        before_crash = streamed_text(db, task_id)
    finally:
        db.dispose()
    assert row.status == "running", "the task finished before the kill: nothing was tested"

    second = runs.start(env)
    assert "running 1" in second.log()  # recovered, to be continued from its snapshot
    with second.client(token) as client:
        reference_id = create(client, **REQUEST)["id"]  # runs beside the resumed task
        task = finished(client, task_id)
        log = events(client, task_id)
        resumed = response(client, task_id)
        assert finished(client, reference_id)["status"] == "completed"
        uninterrupted = response(client, reference_id)

    assert (task["status"], task["attempts"]) == ("completed", 2)
    assert_log_sound(log, task["last_seq"])
    assert [e["type"] for e in log].count("response.output_item.added") == 1
    text = output_text(resumed)
    assert before_crash and text.startswith(before_crash)
    assert text == deltas(log) == output_text(uninterrupted)
    assert resumed["usage"] == uninterrupted["usage"]  # tokens counted once, not per attempt

