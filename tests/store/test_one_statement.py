"""PostgreSQL's one-statement claim and completion (`core.store.pg_claims`,
`core.store.pg_completion`) write exactly what the separate statements write.

The same tasks are set up twice with a fixed clock, then claimed and completed once
through each path; every row of tasks, responses and task_events must agree, and so
must the claims and the per-task failures. Owner tokens are random per claim, so
only whether a task holds one is compared; ids are compared by their role.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH
from sqlalchemy import select
from sqlalchemy.dialects import postgresql

from core.engines.base import Usage
from core.models_registry import register
from core.settings import Settings
from core.states import OnRestart, Status
from core.store import claims, completion, worker_writes
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.pg_claims import _CLAIM
from core.store.pg_completion import _COMPLETE
from core.store.transitions import Event, encoded
from core.tables import responses, task_events, tasks
from tests.clocks import HandClock
from tests.databases import truncate_all
from tests.store.helpers import assert_log_sound, force, new_task

LEASE = 30_000
NOW = 1_800_000_000_000


class _Separate(Database):
    """The same store, claiming and completing through the separate statements."""

    @property
    def data_modifying_ctes(self) -> bool:
        return False


def _scenario(
    db: Database, worker: Database, settings: Settings
) -> tuple[dict[str, str], list[Any], list[Any]]:
    """Tasks in every state a claim meets, claimed and completed through `worker`;
    (ids by role, the claims, the completion failures)."""
    (settings.models_dir / "words.bin").write_bytes(b"test engine model\n")
    register(db, settings.models_dir, "words.bin", model_id="words", engine="test.words")
    ids: dict[str, str] = {}
    for role, on_restart in (("resume", OnRestart.RESUME), ("resume_spent", OnRestart.RESUME),
                             ("retry", OnRestart.RETRY)):
        ids[role] = new_task(db, "words", client=f"client-{role}", on_restart=on_restart)
        [held] = claims.claim(worker, limit=1, lease_ms=LEASE, node_id="n")
        worker_writes.append_output(
            db, held.task_id, held.owner_token,
            [Event("response.output_item.added", {"output_index": 0}),
             Event("response.output_text.delta", {"delta": "ab"})],
            text="ab", snapshot_json='{"tokens":[1]}', usage=Usage(3, 1), start=True)
    worker_writes.requeue(db, ids["retry"], held.owner_token, delay_ms=0,
                          code="engine_error", message="boom")
    ids["fresh"] = new_task(db, "words", client="client-fresh")
    ids["spent"] = new_task(db, "words", client="client-spent")
    force(db, ids["spent"], attempts=3, max_attempts=3)
    force(db, ids["resume"], lease_expires_at=NOW - 1)
    force(db, ids["resume_spent"], lease_expires_at=NOW - 1, attempts=3, max_attempts=3)
    taken = claims.claim(worker, limit=10, lease_ms=LEASE, node_id="n")
    by_id = {c.task_id: c for c in taken}
    fresh, resumed = by_id[ids["fresh"]], by_id[ids["resume"]]
    force(db, ids["retry"], status=Status.CANCELLING.value)  # a cancel came meanwhile
    retry = by_id[ids["retry"]]
    # Data that JSON must escape or may leave raw, and the separator of the events'
    # parameters (`pg_completion._SEPARATOR`): stored as `encoded` writes it.
    closing = [Event("response.output_text.done", {"text": 'x "q" \\ é 🙂\n\u0001\u001f'}),
               Event("response.output_item.done", {"item": {"content": [], "n": 1.5}})]
    failures = completion.complete_all(worker, [
        completion.Completion(fresh.task_id, fresh.owner_token, closing, Usage(1, 1), "x",
                              start=True),
        completion.Completion(resumed.task_id, resumed.owner_token, [], Usage(4, 2), "c"),
        completion.Completion(retry.task_id, retry.owner_token, closing, Usage(1, 1), "x",
                              start=True),
        completion.Completion(resumed.task_id, "stale-owner", [], Usage(9, 9), "z"),
    ])
    return ids, taken, [type(f).__name__ if f else None for f in failures]


def _dump(db: Database, ids: dict[str, str]) -> dict[str, Any]:
    role = {task_id: name for name, task_id in ids.items()}
    with db.read() as conn:
        task_rows = {role[r.id]: {**r._asdict(), "id": role[r.id],
                                  "owner_token": r.owner_token is not None}
                     for r in conn.execute(select(tasks))}
        answers = {role[r.task_id]: {**r._asdict(), "task_id": role[r.task_id]}
                   for r in conn.execute(select(responses))}
        events = sorted((role[r.task_id], r.seq, r.type, r.created_at, r.data)
                        for r in conn.execute(select(task_events)))
    return {"tasks": task_rows, "responses": answers, "events": events}


def _claims(taken: list[Any], ids: dict[str, str]) -> list[dict[str, Any]]:
    role = {task_id: name for name, task_id in ids.items()}
    return [{**vars(c), "task_id": role[c.task_id], "owner_token": None} for c in taken]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_one_statement_claim_and_completion_write_what_the_separate_ones_write(
    database_url: str, settings: Settings
) -> None:
    results = []
    for at_once in (False, True):
        truncate_all(database_url)
        clock = HandClock(NOW)
        db = Database(create_db_engine(settings), clock)
        worker = Database(db.engine, clock) if at_once else _Separate(db.engine, clock)
        try:
            ids, taken, failures = _scenario(db, worker, settings)
            for task_id in ids.values():
                assert_log_sound(db, task_id)
            results.append((_claims(taken, ids), failures, _dump(db, ids)))
        finally:
            db.dispose()
    separate, at_once_ = results
    assert separate[0] == at_once_[0]  # the claims, in claim order
    assert separate[1] == at_once_[1] == [None, None, "CancelRequested", "LeaseLost"]
    assert separate[2] == at_once_[2]
    [done_data] = [data for name, _, kind, _, data in at_once_[2]["events"]
                   if (name, kind) == ("fresh", "response.output_text.done")]
    assert done_data == encoded({"text": 'x "q" \\ é 🙂\n\u0001\u001f'})
    states = {name: row["status"] for name, row in at_once_[2]["tasks"].items()}
    assert states == {"fresh": "completed", "retry": "cancelling", "spent": "failed",
                      "resume": "completed", "resume_spent": "failed"}


def test_the_one_statements_are_short_enough_for_psycopg_to_cache_their_parsing() -> None:
    """Past `MAX_CACHED_STATEMENT_LENGTH` characters psycopg parses a statement again
    on every execution: the claim, run for every batch, must stay below it."""
    dialect = postgresql.psycopg.dialect()
    for statement in [*_CLAIM.values(), _COMPLETE]:
        assert len(str(statement.compile(dialect=dialect))) <= MAX_CACHED_STATEMENT_LENGTH


def test_the_one_statement_modules_leave_psycopg_unloaded_in_a_sqlite_process() -> None:
    """They run on psycopg's cursors, but a SQLite sweeper imports them too: loading
    psycopg there would only lengthen its start-up."""
    code = ("import sys, core.store.claims, core.store.completion, scheduler.loop; "
            "print('psycopg' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "False"
