"""The claim admits upstream tasks only within their model's `max_concurrency`, and fills
upstream and local slots apart (both stores)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from litestar.testing import TestClient
from sqlalchemy import event

from core.settings import Settings
from core.store import claims, worker_writes
from core.store.database import Database
from core.store.models import read_entries, remove
from infra.app import serving_app
from tests.store.helpers import event_types, task_row
from tests.upstream.helpers import add_upstream, enqueue

LEASE_MS = 60_000


def claim(db: Database, *, local: int = 0, upstream: int = 0) -> list[claims.Claim]:
    return claims.claim(db, limit=local, upstream_limit=upstream, lease_ms=LEASE_MS,
                        node_id="node-a")


def test_a_claim_takes_no_more_than_the_model_admits(db: Database) -> None:
    model = add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=2)
    enqueue(db, 5, model=model)

    first = claim(db, upstream=10)
    assert len(first) == 2 and all(c.upstream for c in first)
    assert claim(db, upstream=10) == []  # the bound holds across claims, not per claim


def test_a_finished_attempt_frees_its_place(db: Database) -> None:
    model = add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=1)
    enqueue(db, 2, model=model)
    [held] = claim(db, upstream=4)
    worker_writes.fail(db, held.task_id, held.owner_token, "x", "done with it")
    assert len(claim(db, upstream=4)) == 1


def test_local_and_upstream_tasks_fill_their_own_slots(
    db: Database, settings: Settings, model_id: str
) -> None:
    upstream_model = add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=8)
    enqueue(db, 3, model=upstream_model)
    enqueue(db, 3, model=model_id)

    local_only = claim(db, local=5)
    assert [c.model for c in local_only] == [model_id] * 3  # no upstream task in local slots
    upstream_only = claim(db, upstream=5)
    assert [(c.model, c.upstream) for c in upstream_only] == [(upstream_model, True)] * 3


def test_every_claim_carries_its_models_registry_entry_and_none_once_it_is_gone(
    db: Database, settings: Settings, model_id: str
) -> None:
    upstream_model = add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=8)
    enqueue(db, 2, model=upstream_model)
    enqueue(db, 2, model=model_id)
    stored = read_entries(db, [model_id, upstream_model])

    taken = claim(db, local=5, upstream=5)
    assert sorted((c.model, c.model_entry) for c in taken) == sorted(
        [(model_id, stored[model_id])] * 2 + [(upstream_model, stored[upstream_model])] * 2)
    assert stored[upstream_model].upstream_json is not None
    assert (stored[model_id].engine, stored[model_id].path) == ("test.words", "words.bin")
    enqueue(db, 1, model=model_id)
    remove(db, model_id)
    [orphan] = claim(db, local=5)
    assert (orphan.model, orphan.model_entry) == (model_id, None)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_with_no_local_slot_free_and_no_upstream_model_a_claim_is_one_statement(
    db: Database, model_id: str
) -> None:
    enqueue(db, 2, model=model_id)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        taken = claim(db, local=0, upstream=8)
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    assert (taken, len(statements)) == ([], 1)
    assert len(claim(db, local=8)) == 2  # the local tasks were left alone


def test_an_expired_lease_does_not_count_against_the_bound(db: Database) -> None:
    model = add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=1)
    enqueue(db, 2, model=model)
    [_] = claims.claim(db, limit=0, upstream_limit=1, lease_ms=1, node_id="node-a")
    time.sleep(0.01)  # that worker stopped itself once its lease ran out unrenewed
    assert len(claim(db, upstream=1)) == 1


def test_metrics_show_an_upstream_models_attempts_in_flight(
    db: Database, settings: Settings
) -> None:
    model = add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=2)
    enqueue(db, 3, model=model)
    claim(db, upstream=8)

    with TestClient(serving_app(settings)) as client:
        metrics = client.get("/metrics").text

    assert f'taskward_upstream_in_flight{{model="{model}"}} 2.0' in metrics


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_while_no_upstream_model_exists_a_claim_is_one_statement_committing_by_itself(
    db: Database, model_id: str
) -> None:
    enqueue(db, 3, model=model_id)
    assert len(claim(db, local=1, upstream=8)) == 1  # the first claim finds none exist
    transactions: list[str] = []

    def count(_conn: Any) -> None:
        transactions.append("begin")

    event.listen(db.engine, "begin", count)
    try:
        [taken] = claim(db, local=1, upstream=8)
    finally:
        event.remove(db.engine, "begin", count)
    assert transactions == []
    row = task_row(db, taken.task_id)  # read on another connection: committed
    assert (row.status, row.owner_token, row.attempts) == ("loading", taken.owner_token, 1)
    assert event_types(db, taken.task_id) == ["response.created", "response.loading"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_model_registered_as_upstream_meanwhile_has_its_tasks_claimed_from_the_next_claim(
    db: Database, model_id: str
) -> None:
    enqueue(db, 2, model=model_id)
    assert len(claim(db, local=1, upstream=8)) == 1  # no upstream model yet
    upstream_model = add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=8)
    enqueue(db, 2, model=upstream_model)
    local = claim(db, local=5, upstream=5)  # it committed its local task, then learnt
    assert [(c.model, c.upstream) for c in local] == [(model_id, False)]
    later = claim(db, local=5, upstream=5)
    assert [(c.model, c.upstream) for c in later] == [(upstream_model, True)] * 2
    remove(db, upstream_model)
    enqueue(db, 1, model=model_id)
    assert len(claim(db, local=5, upstream=5)) == 1  # a transaction, which finds none
    add_upstream(db, ["http://127.0.0.1:9/v1"], max_concurrency=8)
    enqueue(db, 1, model=upstream_model)
    # No local task to claim: the same claim goes on to the upstream model's.
    assert [(c.model, c.upstream) for c in claim(db, local=5, upstream=5)] == [
        (upstream_model, True)]
