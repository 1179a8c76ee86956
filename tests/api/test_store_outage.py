"""A store that stops answering without closing its connections (a stalled PostgreSQL,
a network cut that drops packets; here a private cluster whose processes are stopped
with SIGSTOP): `taskward serve` answers `503 store_unavailable` within the store bound
instead of holding every request, drops the creations it never got to write, and
serves again once the store answers, without a restart; a sweeper works on then too."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ContextManager

import httpx
import pytest
from sqlalchemy import func, select

import tests.engines  # noqa: F401  registers the deterministic engine in this process
from core.clock import Clock
from core.settings import Settings
from core.states import Status
from core.store.connect import create_db_engine
from core.store.database import Database
from core.tables import tasks
from handlers.enqueuing import PARALLEL_BATCHES
from scheduler.workers import ENGINE_JOIN_SECONDS, HAND_BACK_GRACE_SECONDS
from tests.api.helpers import register_test_model
from tests.api.served import Service, process, running_service, service_env
from tests.pg_cluster import PgCluster, migrated_cluster
from tests.scheduler.helpers import enqueue_many
from tests.scheduler.processes import wait_until
from tests.store.helpers import task_row

WAIT_SECONDS = 1.0  # TASKWARD_STORE_WAIT_SECONDS of the served process
SLACK_SECONDS = 3.0  # a loaded machine's scheduling on top of the bound
DRAIN_SECONDS = 1  # TASKWARD_DRAIN_SECONDS of the stopped sweeper


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with migrated_cluster() as started:
        yield started


@pytest.fixture
def store(cluster: PgCluster, tmp_path: Path) -> Iterator[Database]:
    """The cluster's store, with the deterministic test engine's model `words`."""
    db = Database(create_db_engine(Settings(database_url=cluster.url)), Clock())
    register_test_model(db, tmp_path / "models")
    yield db
    db.dispose()


def serving(cluster: PgCluster, workdir: Path, **settings: str) -> ContextManager[Service]:
    """`taskward serve` (one worker, no sweeper) over the cluster, its store bound
    `WAIT_SECONDS`."""
    return running_service(cluster.url, workdir, sweeper=False, workers=1, settings={
        "TASKWARD_STORE_WAIT_SECONDS": str(WAIT_SECONDS), **settings})


@pytest.fixture
def service(cluster: PgCluster, store: Database, tmp_path: Path) -> Iterator[Service]:
    """The token cache re-reads the revocations at most every poll interval: at its
    longest, the requests of a stalled second are authenticated from it and reach the
    store calls behind it."""
    with serving(cluster, tmp_path, TASKWARD_POLL_INTERVAL_MS="10000") as service:
        yield service


def ready_again(service: Service) -> None:
    wait_until(lambda: httpx.get(f"{service.base_url}/readyz", timeout=5).status_code == 200,
               timeout=30, what="readiness once the store answers again")


def create(service: Service, token: str, **fields: object) -> httpx.Response:
    return httpx.post(f"{service.base_url}/v1/responses", timeout=30,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"model": "words", "input": "one two", **fields})


def task_count(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(tasks)).scalar_one())


def test_a_store_that_stops_answering_gets_503_within_the_bound(
    cluster: PgCluster, service: Service
) -> None:
    token = service.admin_token()
    headers = {"Authorization": f"Bearer {token}"}
    assert create(service, token).status_code == 202

    with cluster.stalled():
        for method, path in (("GET", "/readyz"), ("GET", "/v1/tasks"),
                             ("POST", "/v1/responses")):
            started = time.monotonic()
            answer = httpx.request(method, service.base_url + path, headers=headers,
                                   json={"model": "words", "input": "one two"}
                                   if method == "POST" else None, timeout=30)
            took = time.monotonic() - started
            assert answer.status_code == 503, (path, answer.text)
            assert answer.json()["code"] == "store_unavailable"
            assert answer.headers["retry-after"] == "1"
            assert WAIT_SECONDS * 0.9 <= took <= WAIT_SECONDS + SLACK_SECONDS, (path, took)
        assert httpx.get(f"{service.base_url}/healthz", timeout=5).status_code == 200
        unready = httpx.head(f"{service.base_url}/readyz", timeout=30)
        assert (unready.status_code, unready.content) == (503, b"")
        assert httpx.head(f"{service.base_url}/healthz", timeout=5).status_code == 200

    ready_again(service)
    assert httpx.head(f"{service.base_url}/readyz", timeout=5).status_code == 200
    assert httpx.get(f"{service.base_url}/v1/tasks", headers=headers,
                     timeout=10).status_code == 200


def test_an_outage_is_one_line_in_the_log_not_one_per_answer(
    cluster: PgCluster, service: Service, tmp_path: Path
) -> None:
    """Clients retry a 503 every second: a server process logs the outage's first
    answer, then one reminder a minute (`core.failure_streak.FailureTally`)."""
    token = service.admin_token()
    assert create(service, token).status_code == 202

    cluster.stop()
    try:
        answers = [create(service, token).status_code for _ in range(20)]
    finally:
        cluster.start()

    assert answers == [503] * 20
    logged = logged_once(tmp_path / "serve.log",
                         "store unavailable (OperationalError): requests are answered 503")
    assert len([line for line in logged.splitlines() if "store unavailable" in line]) == 1
    assert "Traceback" not in logged


def logged_once(log: Path, line: str) -> str:
    """The server's log once `line` is in it, exactly once. A worker logs through a
    queue its own thread writes out, so the line may land after the answer did."""
    wait_until(lambda: line in log.read_text(), timeout=10, what=f"{line!r} in the log")
    time.sleep(0.5)  # what else the queue held is written by now
    logged = log.read_text()
    assert logged.count(line) == 1, logged
    return logged


def test_a_creation_still_queued_at_the_bound_is_never_written(
    cluster: PgCluster, store: Database, service: Service
) -> None:
    """Sent 200 ms apart while the store is stalled, the first `PARALLEL_BATCHES`
    creations each take a batch of their own, whose commit hangs (and may land once the
    store is back: they were on their way); the rest wait in the queue, and leave it
    with their 503: they are never written."""
    token = service.admin_token()
    assert create(service, token).status_code == 202
    sent = PARALLEL_BATCHES + 3
    answers: list[httpx.Response] = []

    with cluster.stalled():
        posts = []
        for _ in range(sent):
            post = threading.Thread(target=lambda: answers.append(create(service, token)))
            post.start()
            posts.append(post)
            # Far enough apart that each finds its batch already sent, even on a loaded
            # machine: two arriving before a drain loop took its batch share one (at
            # 50 ms apart, under four test processes, one landed beyond the bound).
            time.sleep(0.2)
        for post in posts:
            post.join(30)

    assert [a.status_code for a in answers] == [503] * sent
    ready_again(service)
    time.sleep(1)  # the hung batches commit or fail
    assert 1 <= task_count(store) <= 1 + PARALLEL_BATCHES


def test_a_stream_the_stalled_store_cuts_off_ends_whole_and_resumes(
    cluster: PgCluster, store: Database, tmp_path: Path
) -> None:
    """A stream's status went out long before the store stalled: it ends with the
    chunked body's end (no broken connection, no traceback in the log), and the
    client resumes from the last id it read once the store answers. (An idle stream
    asks the store when its token is checked again: every poll interval, here the
    default, by the token cache.)"""
    with serving(cluster, tmp_path) as service:
        token = service.admin_token()
        headers = {"Authorization": f"Bearer {token}"}
        created = create(service, token, background=True)
        url = f"{service.base_url}/v1/tasks/{created.json()['id']}/events"
        ids: list[str] = []
        ended: list[float] = []

        def follow() -> None:  # no sweeper runs: the task stays queued, the stream idle
            with httpx.stream("GET", url, timeout=30,
                              headers={**headers, "Accept": "text/event-stream"}) as stream:
                ids.extend(line[4:] for line in stream.iter_lines() if line.startswith("id: "))
            ended.append(time.monotonic())

        reader = threading.Thread(target=follow)
        reader.start()
        wait_until(lambda: bool(ids), timeout=10, what="the stream's first event")
        with cluster.stalled():
            stalled_at = time.monotonic()
            reader.join(WAIT_SECONDS + SLACK_SECONDS + 2)
            assert ended, "the stream did not end"
            assert ended[0] - stalled_at <= WAIT_SECONDS + SLACK_SECONDS + 1  # + its auth recheck

        assert ids == ["1"]
        logged = logged_once(tmp_path / "serve.log",
                             "event streams end: store unavailable (StoreTimeout)")
        assert "Traceback" not in logged
        ready_again(service)
        resumed = httpx.get(url, timeout=10, headers=headers, params={"after": ids[-1]})
        assert resumed.status_code == 200 and resumed.json()["data"] == []


def sweeper_env(cluster: PgCluster, workdir: Path, **settings: str) -> dict[str, str]:
    """A sweeper's environment over the cluster, its leases short (3 s, renewed each
    second) so a stall outlasts one; `settings`: more `TASKWARD_*` variables."""
    return {**service_env(cluster.url, workdir / "models"), "TASKWARD_LEASE_SECONDS": "3",
            "TASKWARD_HEARTBEAT_SECONDS": "1", **settings}


def test_a_sweeper_works_on_once_a_stalled_store_answers(
    cluster: PgCluster, store: Database, tmp_path: Path
) -> None:
    env = sweeper_env(cluster, tmp_path)
    with process(["sweeper"], env, tmp_path / "sweeper.log"):
        before = enqueue_many(store, "words", 5)
        wait_until(lambda: all(task_row(store, t).status == Status.COMPLETED for t in before),
                   timeout=30, what="the tasks before the stall")
        with cluster.stalled():
            time.sleep(2 * WAIT_SECONDS + 1)
        after = enqueue_many(store, "words", 5)
        wait_until(lambda: all(task_row(store, t).status == Status.COMPLETED for t in after),
                   timeout=30, what="the tasks after the stall, with no restart")


def test_a_busy_sweeper_stops_within_its_bounds_while_the_store_stalls(
    cluster: PgCluster, store: Database, tmp_path: Path
) -> None:
    """SIGTERM mid-stream with the store stalled: the drain, the hand-back's grace and
    the lease keeper's join are each bounded, so the process exits instead of waiting
    on the store for good; its tasks are finished by the next sweeper once it answers."""
    env = sweeper_env(cluster, tmp_path, TASKWARD_DRAIN_SECONDS=str(DRAIN_SECONDS))
    streaming = enqueue_many(store, "words", 2, input="words=60 delay=0.1")  # both slots
    with process(["sweeper"], env, tmp_path / "sweeper.log") as child:
        wait_until(lambda: all(task_row(store, t).status == Status.RUNNING for t in streaming),
                   timeout=30, what="the tasks streaming")
        with cluster.stalled():
            stopping_at = time.monotonic()
            os.killpg(child.pid, signal.SIGTERM)
            child.wait(timeout=DRAIN_SECONDS + HAND_BACK_GRACE_SECONDS + ENGINE_JOIN_SECONDS
                       + SLACK_SECONDS)
            stopped_in = time.monotonic() - stopping_at
    assert child.returncode == 0
    assert stopped_in >= DRAIN_SECONDS  # it did wait for the drain
    with process(["sweeper"], env, tmp_path / "sweeper-after.log"):
        wait_until(lambda: all(task_row(store, t).status == Status.COMPLETED for t in streaming),
                   timeout=60, what="the handed-over tasks finished once the store answers")


def test_serve_stops_at_once_while_a_request_it_gave_up_on_still_waits_on_the_store(
    cluster: PgCluster, tmp_path: Path
) -> None:
    """The request was answered 503 at the bound; its store thread still waits on the
    stalled store. SIGTERM ends the process anyway: that thread does not hold its exit."""
    with serving(cluster, tmp_path) as service:
        server = service.server
        assert server is not None
        with cluster.stalled():
            assert httpx.get(f"{service.base_url}/readyz", timeout=30).status_code == 503
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10 * SLACK_SECONDS)
    assert server.returncode == 0
