"""Cold-start recovery (docs/state-machine.md) and lease expiry, cell by cell, on both stores."""

from __future__ import annotations

import json
import os
import stat

import pytest
from freezegun import freeze_time

from core.states import OnRestart, Status
from core.store import claims, worker_writes
from core.store.database import Database
from core.store.recovery import RESTART_POLICY, SweepersAlive, expire_leases, recover, sweeping
from tests.store.helpers import assert_log_sound, event_types, events_of, new_task, task_row

LEASE = 30_000


def task_in(db: Database, model_id: str, state: Status, policy: OnRestart,
            node: str = "node-a") -> str:
    """A task brought to `state` through the real operations, as a crash would leave it."""
    task_id = new_task(db, model_id, on_restart=policy)
    if state is Status.QUEUED:
        return task_id
    (claimed,) = claims.claim(db, limit=1, lease_ms=LEASE, node_id=node)
    if state is Status.RUNNING:
        worker_writes.start_running(db, task_id, claimed.owner_token)
        worker_writes.append_output(db, task_id, claimed.owner_token, [], text="w0 ",
                                    snapshot_json='{"pos": 1}')
    if state is Status.CANCELLING:
        worker_writes.start_running(db, task_id, claimed.owner_token)
        from core.store.tasks import cancel

        cancel(db, task_id, None)
    return task_id


CELLS = sorted(RESTART_POLICY.items(), key=lambda item: (item[0][0].value, item[0][1].value))
NEW_EVENT = {Status.FAILED: "response.failed", Status.QUEUED: "response.queued",
             Status.CANCELLED: "response.cancelled"}


@pytest.mark.parametrize(("cell", "target"), CELLS, ids=[f"{s}-{p}" for (s, p), _ in CELLS])
def test_recovery_applies_each_cell_of_the_restart_table(
    db: Database, model_id: str, cell: tuple[Status, OnRestart], target: Status
) -> None:
    state, policy = cell
    task_id = task_in(db, model_id, state, policy)
    before = event_types(db, task_id)

    recover(db, node_id=None)

    row = task_row(db, task_id)
    assert row.status == target.value
    assert row.owner_token is None and row.lease_expires_at is None
    added = event_types(db, task_id)[len(before):]
    if target is state:
        assert added == []
    else:
        assert added == [NEW_EVENT[target]]
    if target is Status.FAILED:
        assert row.error_code == "server_restarted"
        data = json.loads(events_of(db, task_id)[-1].data)
        assert data["error"]["code"] == "server_restarted" and data["dead_lettered"] is False
    if target is Status.QUEUED and state is not Status.QUEUED:
        assert json.loads(events_of(db, task_id)[-1].data)["reason"] == "server_restarted"
    assert_log_sound(db, task_id)


def test_a_second_recovery_changes_nothing(db: Database, model_id: str) -> None:
    # Queued ones last: each claim takes the oldest due task.
    cells = sorted(RESTART_POLICY, key=lambda cell: cell[0] is Status.QUEUED)
    ids = [task_in(db, model_id, state, policy) for (state, policy) in cells]
    first = recover(db, node_id=None)
    snapshot = [(task_row(db, i).status, task_row(db, i).last_seq) for i in ids]
    second = recover(db, node_id=None)
    assert first == {"failed": 3, "queued": 3, "running": 1, "cancelled": 3}
    assert second == {"failed": 0, "queued": 0, "running": 0, "cancelled": 0}
    assert [(task_row(db, i).status, task_row(db, i).last_seq) for i in ids] == snapshot


def test_a_recovered_resume_task_is_claimed_again_from_its_snapshot(
    db: Database, model_id: str
) -> None:
    task_id = task_in(db, model_id, Status.RUNNING, OnRestart.RESUME)
    recover(db, node_id=None)
    (claimed,) = claims.claim(db, limit=1, lease_ms=LEASE, node_id="node-b")
    assert claimed.task_id == task_id and claimed.resumed
    assert claimed.snapshot_json == '{"pos": 1}' and claimed.output_text == "w0 "
    assert claimed.attempt == 2


def test_node_scoped_recovery_leaves_other_nodes_tasks(db: Database, model_id: str) -> None:
    mine = task_in(db, model_id, Status.RUNNING, OnRestart.RETRY, node="node-a")
    theirs = task_in(db, model_id, Status.RUNNING, OnRestart.RETRY, node="node-b")
    recover(db, node_id="node-a")
    assert task_row(db, mine).status == "queued"
    assert task_row(db, theirs).status == "running"
    recover(db, node_id=None)
    assert task_row(db, theirs).status == "queued"


@pytest.mark.parametrize(("policy", "state", "target", "event"), [
    (OnRestart.FAIL, Status.RUNNING, Status.FAILED, "response.failed"),
    (OnRestart.RETRY, Status.RUNNING, Status.QUEUED, "response.queued"),
    (OnRestart.RETRY, Status.LOADING, Status.QUEUED, "response.queued"),
    (OnRestart.RESUME, Status.LOADING, Status.QUEUED, "response.queued"),
    (OnRestart.RESUME, Status.RUNNING, Status.RUNNING, None),
    (OnRestart.RETRY, Status.CANCELLING, Status.CANCELLED, "response.cancelled"),
])
def test_expired_leases_follow_the_policy(
    db: Database, model_id: str, policy: OnRestart, state: Status, target: Status,
    event: str | None,
) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        task_id = task_in(db, model_id, state, policy)
        before = event_types(db, task_id)
    with freeze_time("2026-01-01 00:00:29"):
        expire_leases(db)
        assert task_row(db, task_id).status == state.value  # not yet expired
    with freeze_time("2026-01-01 00:00:31"):
        expire_leases(db)
    row = task_row(db, task_id)
    assert row.status == target.value and row.owner_token is None
    assert event_types(db, task_id)[len(before):] == ([event] if event else [])
    if target is Status.FAILED:
        assert row.error_code == "worker_lost"
    assert_log_sound(db, task_id)


def test_recovery_never_touches_finished_tasks(db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id, on_restart=OnRestart.FAIL)
    from core.store.tasks import cancel

    cancel(db, task_id, None)
    recover(db, node_id=None)
    assert task_row(db, task_id).status == "cancelled"
    assert event_types(db, task_id) == ["response.created", "response.cancelled"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_on_sqlite_recovery_is_refused_while_a_process_is_sweeping(
    db: Database, model_id: str
) -> None:
    task_id = task_in(db, model_id, Status.RUNNING, OnRestart.RETRY)
    before = task_row(db, task_id)
    with sweeping(db), pytest.raises(SweepersAlive):
        recover(db, node_id=None)
    assert task_row(db, task_id) == before
    assert recover(db, node_id=None)["queued"] == 1  # the sign went with the process
    assert stat.S_IMODE(os.stat(f"{db.engine.url.database}.sweepers").st_mode) == 0o600


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_sweeping_is_no_sign_and_recovery_goes_by_node(
    db: Database, model_id: str
) -> None:
    theirs = task_in(db, model_id, Status.RUNNING, OnRestart.RETRY, node="node-b")
    with sweeping(db):
        assert recover(db, node_id="node-a")["queued"] == 0
        assert task_row(db, theirs).status == Status.RUNNING
        assert recover(db, node_id="node-b")["queued"] == 1
