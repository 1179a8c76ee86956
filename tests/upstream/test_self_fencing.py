"""Self-fencing: when the store goes away (a private PostgreSQL cluster, stopped
mid-generation), a worker stops generating once its lease has run out unrenewed, for
every engine, and an upstream stream is closed: the server's slot goes idle within one
lease."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.engines  # noqa: F401  registers the deterministic engine in this process
from core.clock import Clock
from core.settings import Settings
from core.store import claims
from core.store.connect import create_db_engine
from core.store.database import Database
from scheduler.attempt import Attempt
from scheduler.heartbeat import LeaseKeeper
from tests.api.helpers import register_test_model
from tests.pg_cluster import PgCluster, migrated_cluster
from tests.scheduler.helpers import output_text
from tests.scheduler.processes import wait_until
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.llama import LlamaServer
from tests.upstream.served import sweeper, upstream_env

LEASE_SECONDS = 3
# llama-server notices a closed connection only when it next sends a token, and frees
# the slot then: a tenth of a second on a quiet machine, most of a second on a busy one.
# A fresh-clone CI run on the slowest machine so far took 2.2 s over the lease once
# ([stopped], the sweeper having abandoned the attempt 1.2 s after the stop): what
# holds the stream open between the abandonment and the lease's end is not yet known
# (the closing note of the forty-fifth wave), so the bound here is not the yet.
SERVER_NOTICES_SECONDS = 3


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with migrated_cluster() as started:
        yield started


@pytest.fixture
def store(cluster: PgCluster) -> Iterator[Database]:
    db = Database(create_db_engine(Settings(database_url=cluster.url)), Clock())
    yield db
    db.dispose()


@contextlib.contextmanager
def outage_of(cluster: PgCluster, outage: str) -> Iterator[None]:
    """`stopped`: the server is gone, its connections refused. `stalled`: its processes
    are stopped, so whatever the sweeper asks of the store hangs rather than fails."""
    if outage == "stopped":
        cluster.stop()
        yield
    else:
        with cluster.stalled():
            yield


@pytest.mark.parametrize("outage", ["stopped", "stalled"])
def test_an_attempt_whose_lease_cannot_be_renewed_stops_when_it_runs_out(
    store: Database, cluster: PgCluster, tmp_path: Path, outage: str
) -> None:
    model = register_test_model(store, tmp_path / "models")
    enqueue(store, model=model)
    [claim] = claims.claim(store, limit=1, lease_ms=LEASE_SECONDS * 1000, node_id="node-a")
    attempt = Attempt(claim, clock=store.clock, timeout_ms=600_000,
                      lease_ms=LEASE_SECONDS * 1000)
    keeper = LeaseKeeper(store, lease_ms=LEASE_SECONDS * 1000, heartbeat_ms=500)
    keeper.hold(attempt)
    keeper.start()
    try:
        time.sleep(1.2)
        assert not attempt.should_stop()  # renewals work while the store is there
        with outage_of(cluster, outage):
            stopped_at = time.monotonic()
            wait_until(attempt.should_stop, timeout=2 * LEASE_SECONDS,
                       what="the engine told to stop")
            assert time.monotonic() - stopped_at <= LEASE_SECONDS
    finally:
        assert keeper.stop(timeout=5)  # the store answers again: the thread ends


@pytest.mark.parametrize("outage", ["stopped", "stalled"])
def test_the_upstream_stream_is_closed_within_one_lease(
    store: Database, cluster: PgCluster, tmp_path: Path, llama: LlamaServer, outage: str
) -> None:
    add_upstream(store, [llama.base_url])
    [task_id] = enqueue(store, input="Tell a very long story about a ship.",
                        max_output_tokens=800)
    child = sweeper(upstream_env(cluster.url, tmp_path, lease_seconds=LEASE_SECONDS),
                    tmp_path / "sweeper.log")
    try:
        wait_until(lambda: llama.busy_slots() == 1 and output_text(store, task_id),
                   timeout=60, what="generation with stored output")
        with outage_of(cluster, outage):
            stopped_at = time.monotonic()
            wait_until(lambda: llama.busy_slots() == 0, timeout=3 * LEASE_SECONDS,
                       what="the server's slot to go idle")
            assert time.monotonic() - stopped_at <= LEASE_SECONDS + SERVER_NOTICES_SECONDS
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
