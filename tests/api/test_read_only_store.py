"""A PostgreSQL that takes no writes for a while (`default_transaction_read_only`, as an
operator sets it, or a managed service whose storage is nearly full; a standby after a
failover answers the same): writes are answered `503 store_unavailable` and change
nothing, reads are still served, an operator command says what to check, and once the
server takes writes again the same processes (no restart) create, cancel and run
tasks. It was a 500 `internal_error` (and a traceback): psycopg raises the refusal as
an `InternalError`, not an `OperationalError`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
from sqlalchemy import func, select

from core.settings import Settings
from core.states import Status
from core.store.connect import open_database
from core.tables import tasks
from tests.api.helpers import register_test_model
from tests.api.served import TASKWARD, running_service
from tests.api.test_served import create, task_status, token_client
from tests.pg_cluster import PgCluster, migrated_cluster
from tests.scheduler.processes import wait_until

PROMPT = "a prompt that must not reach an error words=3"
LATER = "2999-01-01T00:00:00Z"  # a task that waits, to cancel


def test_a_store_that_takes_no_writes_answers_503_and_serves_again_after(
        tmp_path: Path) -> None:
    with migrated_cluster() as cluster:
        store = open_database(Settings(database_url=cluster.url))
        register_test_model(store, tmp_path / "models")
        with running_service(cluster.url, tmp_path, workers=1) as service:
            client, _ = token_client(service)
            with client:
                done = create(client).json()["id"]
                waiting = create(client, run_at=LATER).json()["id"]
                wait_until(lambda: task_status(client, done) == Status.COMPLETED, timeout=20,
                           what="a task before the store turned read-only")

                take_writes(cluster, False)
                refused = [create(client, PROMPT) for _ in range(3)]
                refused.append(client.post(f"/v1/responses/{waiting}/cancel"))
                assert [(a.status_code, a.json()["code"], a.headers.get("retry-after"))
                        for a in refused] == [(503, "store_unavailable", "1")] * 4
                assert not any("must not reach" in answer.text for answer in refused)
                assert task_status(client, done) == Status.COMPLETED  # reads are served
                assert task_status(client, waiting) == Status.QUEUED
                paired = subprocess.run([TASKWARD, "pair", "--token"], env=service.env,
                                        capture_output=True, text=True, timeout=60)
                assert paired.returncode == 1
                assert paired.stderr.startswith(
                    "Error: the store is unavailable (ReadOnlySqlTransaction: cannot execute "
                    "INSERT in a read-only transaction); check"), paired.stderr

                take_writes(cluster, True)
                wait_until(lambda: create(client).status_code == 202, timeout=20,
                           what="a creation once the store takes writes")
                assert client.post(f"/v1/responses/{waiting}/cancel").status_code == 200
                ids = [task["id"] for task in client.get("/v1/tasks").json()["data"]]
                wait_until(lambda: all(task_status(client, task_id) in (Status.COMPLETED,
                                                                   Status.CANCELLED)
                                       for task_id in ids),
                           timeout=30, what="the sweeper's work once the store takes writes")
        with store.read() as conn:
            stored = conn.execute(select(func.count()).select_from(tasks)).scalar_one()
        store.dispose()
    assert stored == len(ids) == 3  # nothing of what was refused


def take_writes(cluster: PgCluster, writable: bool) -> None:
    """Turn the server's `default_transaction_read_only` off or on for every session,
    and return once a session that was open before sees it."""
    with psycopg.connect(cluster.conninfo, autocommit=True) as watcher, \
            psycopg.connect(cluster.conninfo, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM RESET default_transaction_read_only" if writable
                     else "ALTER SYSTEM SET default_transaction_read_only = on")
        conn.execute("SELECT pg_reload_conf()")
        expected = "off" if writable else "on"
        wait_until(lambda: watcher.execute("SHOW default_transaction_read_only")
                   .fetchone() == (expected,), timeout=10, what="the reload")
