"""A client's `max_active_tasks` holds for its schedules: a slot over it waits, and
fires once the client has room again, each slot still at most once."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from core.clock import iso
from core.quotas import Limits
from core.schedules import schedule_object
from core.settings import Settings
from core.store.births import NewTask
from core.store.clients import create_client, revoke
from core.store.database import Database
from core.store.new_tasks import enqueue
from core.store.schedules import get_schedule
from tests.schedules.helpers import (
    active_tasks,
    create_at,
    finish_all_tasks,
    fire_at,
    fired,
    ledger,
    ms,
    schedule_row,
    task_slots,
)

CREATED = "2024-03-01T00:00:10Z"


def client_with(db: Database, max_active_tasks: int | None) -> str:
    return create_client(db, name="capped", scopes=frozenset({"responses:create"}),
                         limits=Limits(max_active_tasks=max_active_tasks)).client_id


def occupy(db: Database, client: str, model: str, count: int) -> None:
    """Tasks the client asked for itself, which count towards its quota."""
    for _ in range(count):
        enqueue(db, NewTask(client_id=client, model=model, request_json='{"input": "x"}'))


def test_five_schedules_of_a_client_with_room_for_one_make_one_task_and_four_wait(
    db: Database, settings: Settings, model_id: str
) -> None:
    client = client_with(db, 1)
    schedules = [create_at(CREATED, db, settings, model_id, "* * * * *", client=client)
                 for _ in range(5)]
    assert fire_at("2024-03-01T00:01:30Z", db, settings) == 1
    assert active_tasks(db, client) == 1
    waiting = [sid for sid in schedules if not fired(db, sid)]
    assert len(waiting) == 4
    for sid in waiting:  # the checkpoint stays before the slot; looked at next pass
        row = schedule_row(db, sid)
        assert (row.checkpoint, iso(row.next_slot_at)) == (ms("2024-03-01T00:00:10"),
                                                           "2024-03-01T00:02:00.000Z")


def test_a_waiting_slot_fires_once_its_client_has_room_again_and_only_once(
    db: Database, settings: Settings, model_id: str
) -> None:
    client = client_with(db, 1)
    occupy(db, client, model_id, 1)
    sid = create_at(CREATED, db, settings, model_id, "0 * * * *", client=client)
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 0
    assert fire_at("2024-03-01T01:01:30Z", db, settings) == 0
    finish_all_tasks(db)
    assert fire_at("2024-03-01T01:02:30Z", db, settings) == 1
    assert fired(db, sid) == ["2024-03-01T01:00:00.000Z"]
    finish_all_tasks(db)
    assert fire_at("2024-03-01T01:03:30Z", db, settings) == 0
    assert iso(schedule_row(db, sid).next_slot_at) == "2024-03-01T02:00:00.000Z"


def test_a_client_held_at_its_quota_for_an_hour_gets_at_most_catch_up_slots(
    db: Database, settings: Settings, model_id: str
) -> None:
    client = client_with(db, 5)
    occupy(db, client, model_id, 5)
    sid = create_at(CREATED, db, settings, model_id, "* * * * *", client=client, catch_up=3)
    for minute in range(1, 61):
        assert fire_at(f"2024-03-01T{minute // 60:02d}:{minute % 60:02d}:30Z",
                       db, settings) == 0
    finish_all_tasks(db)
    assert fire_at("2024-03-01T01:01:30Z", db, settings) == 3
    assert fired(db, sid) == ["2024-03-01T00:59:00.000Z", "2024-03-01T01:00:00.000Z",
                              "2024-03-01T01:01:00.000Z"]


def test_with_room_for_part_of_the_due_slots_the_oldest_fire_and_the_rest_wait(
    db: Database, settings: Settings, model_id: str
) -> None:
    client = client_with(db, 2)
    occupy(db, client, model_id, 1)
    sid = create_at(CREATED, db, settings, model_id, "* * * * *", client=client, catch_up=3)
    assert fire_at("2024-03-01T00:03:30Z", db, settings) == 1
    assert schedule_row(db, sid).checkpoint == ms("2024-03-01T00:01")
    finish_all_tasks(db)
    assert fire_at("2024-03-01T00:04:30Z", db, settings) == 2
    finish_all_tasks(db)
    assert fire_at("2024-03-01T00:05:30Z", db, settings) == 2
    assert fired(db, sid) == [f"2024-03-01T00:0{minute}:00.000Z" for minute in range(1, 6)]
    assert [slot for _, slot, _ in ledger(db)] == task_slots(db, sid)


def test_other_clients_schedules_fire_while_one_client_waits(
    db: Database, settings: Settings, model_id: str
) -> None:
    held, free = client_with(db, 1), client_with(db, None)
    occupy(db, held, model_id, 1)
    for client in (held, free, held, free, held, free):
        create_at(CREATED, db, settings, model_id, "* * * * *", client=client)
    assert fire_at("2024-03-01T00:01:30Z", db, settings) == 3
    assert (active_tasks(db, held), active_tasks(db, free)) == (1, 3)


@pytest.mark.parametrize(("own", "default", "fired_tasks"), [
    (None, 0, 5),  # no quota anywhere: unlimited
    (0, 2, 5),  # the client's own 0 is unlimited, whatever the default
    (None, 2, 2),  # no own limit: the setting's default holds
    (3, 0, 3),
])
def test_the_quota_that_holds_is_the_clients_own_else_the_default_and_0_is_unlimited(
    db: Database, settings: Settings, model_id: str, own: int | None, default: int,
    fired_tasks: int,
) -> None:
    client = client_with(db, own)
    for _ in range(5):
        create_at(CREATED, db, settings, model_id, "* * * * *", client=client)
    defaults = replace(settings, client_max_active_tasks=default)
    assert fire_at("2024-03-01T00:01:30Z", db, defaults) == fired_tasks


def test_a_schedule_that_starts_waiting_is_logged_once_not_at_every_look(
    db: Database, settings: Settings, model_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = client_with(db, 1)
    occupy(db, client, model_id, 1)
    sid = create_at(CREATED, db, settings, model_id, "* * * * *", client=client)
    with caplog.at_level(logging.INFO, logger="core.schedule_firing"):
        for minute in range(1, 4):
            fire_at(f"2024-03-01T00:0{minute}:30Z", db, settings)
    waits = [record.getMessage() for record in caplog.records if sid in record.getMessage()]
    assert len(waits) == 1
    assert client in waits[0] and "max_active_tasks" in waits[0]


def test_a_waiting_schedule_shows_when_it_is_looked_at_again(
    db: Database, settings: Settings, model_id: str
) -> None:
    client = client_with(db, 1)
    occupy(db, client, model_id, 1)
    sid = create_at(CREATED, db, settings, model_id, "0 * * * *", client=client)
    fire_at("2024-03-01T01:00:30Z", db, settings)
    shown = schedule_object(get_schedule(db, sid, client))
    assert shown["next_run_at"] == "2024-03-01T01:01:00.000Z"


def test_a_revoked_clients_slots_at_its_quota_are_consumed_not_kept_waiting(
    db: Database, settings: Settings, model_id: str
) -> None:
    client = client_with(db, 1)
    occupy(db, client, model_id, 1)
    sid = create_at(CREATED, db, settings, model_id, "0 * * * *", client=client)
    revoke(db, client)
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 0
    row = schedule_row(db, sid)
    assert (row.checkpoint, iso(row.next_slot_at)) == (ms("2024-03-01T01:00:30"),
                                                       "2024-03-01T02:00:00.000Z")
