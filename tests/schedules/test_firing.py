"""Firing, under a frozen clock: which slots become tasks, when, and never twice."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from freezegun import freeze_time
from sqlalchemy import select, update

from core import schedule_firing
from core.clock import iso
from core.models_registry import register
from core.schedule_firing import fire_due_schedules
from core.schedules import update_schedule
from core.settings import Settings
from core.store.clients import create_client, revoke
from core.store.database import Database
from core.store.models import remove
from core.store.schedules import delete_schedule
from core.tables import schedules, tasks
from scheduler.fire_schedules import fire_due
from tests.schedules.helpers import (
    create_at,
    finish_all_tasks,
    fire_at,
    fired,
    ledger,
    ms,
    rewind_checkpoint,
    schedule_row,
    task_slots,
)

# --- the calendar: month ends, 29 February, Vixie day matching --------------------------

@pytest.mark.parametrize(("year", "expected"), [
    (2024, ["2024-02-28T00:00:00.000Z", "2024-02-29T00:00:00.000Z"]),
    (2023, ["2023-02-28T00:00:00.000Z"]),
])
def test_last_days_of_february_fire_once_each_in_leap_and_common_years(
    db: Database, settings: Settings, model_id: str, year: int, expected: list[str]
) -> None:
    create_at(f"{year}-02-27T12:00:00Z", db, settings, model_id, "0 0 28-31 * *")
    for day in ("02-28", "03-01", "03-02"):
        fire_at(f"{year}-{day}T00:00:30Z", db, settings)
    if year == 2024:
        fire_at("2024-02-29T00:00:30Z", db, settings)
    assert fired(db) == expected


def test_a_29_february_schedule_fires_in_leap_years_only(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2023-01-01T00:00:00Z", db, settings, model_id, "0 12 29 2 *")
    assert iso(schedule_row(db, sid).next_slot_at) == "2024-02-29T12:00:00.000Z"
    for when in ("2023-03-01T00:00:00Z", "2024-02-29T12:00:10Z", "2024-03-01T00:00:00Z",
                 "2025-03-01T00:00:00Z", "2027-12-31T00:00:00Z"):
        fire_at(when, db, settings)
    assert fired(db) == ["2024-02-29T12:00:00.000Z"]
    assert iso(schedule_row(db, sid).next_slot_at) == "2028-02-29T12:00:00.000Z"


def test_passes_at_odd_moments_across_a_month_end_fire_every_slot_at_its_own_time(
    db: Database, settings: Settings, model_id: str
) -> None:
    create_at("2024-01-31T22:50:00Z", db, settings, model_id, "*/15 * * * *")
    with freeze_time("2024-01-31T22:50:00Z") as frozen:
        for _ in range(20):  # passes every 7 minutes: late for most slots, never missing one
            frozen.tick(7 * 60)
            fire_due(db, settings)
    assert fired(db) == [
        "2024-01-31T23:00:00.000Z", "2024-01-31T23:15:00.000Z", "2024-01-31T23:30:00.000Z",
        "2024-01-31T23:45:00.000Z", "2024-02-01T00:00:00.000Z", "2024-02-01T00:15:00.000Z",
        "2024-02-01T00:30:00.000Z", "2024-02-01T00:45:00.000Z", "2024-02-01T01:00:00.000Z",
    ]  # the last pass ran at 01:10


def test_day_of_month_or_day_of_week_as_in_vixie_cron(
    db: Database, settings: Settings, model_id: str
) -> None:
    create_at("2024-02-29T12:00:00Z", db, settings, model_id, "0 9 1 * mon")
    for day in range(1, 32):
        fire_at(f"2024-03-{day:02d}T09:00:30Z", db, settings)
    assert fired(db) == [f"2024-03-{d:02d}T09:00:00.000Z" for d in (1, 4, 11, 18, 25)]


# --- catch-up after downtime -------------------------------------------------------------

@pytest.mark.parametrize(("catch_up", "expected"), [
    (1, ["2024-03-04T10:00:00.000Z"]),
    (3, ["2024-03-04T08:00:00.000Z", "2024-03-04T09:00:00.000Z", "2024-03-04T10:00:00.000Z"]),
])
def test_after_days_of_downtime_only_the_latest_catch_up_slots_fire(
    db: Database, settings: Settings, model_id: str, catch_up: int, expected: list[str]
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *",
                    catch_up=catch_up)
    assert fire_at("2024-03-04T10:20:00Z", db, settings) == catch_up
    assert fired(db, sid) == expected
    assert fire_at("2024-03-04T10:40:00Z", db, settings) == 0
    assert iso(schedule_row(db, sid).next_slot_at) == "2024-03-04T11:00:00.000Z"


def test_catch_up_across_29_february(db: Database, settings: Settings, model_id: str) -> None:
    create_at("2024-02-20T00:00:30Z", db, settings, model_id, "0 0 * * *", catch_up=3)
    fire_at("2024-03-01T00:00:30Z", db, settings)
    assert fired(db) == ["2024-02-28T00:00:00.000Z", "2024-02-29T00:00:00.000Z",
                         "2024-03-01T00:00:00.000Z"]


def test_a_fired_task_is_the_owners_with_the_stored_request(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *",
                    client="client-z", max_attempts=5, on_restart="resume",
                    metadata={"job": "hourly"})
    fire_at("2024-03-01T01:00:02Z", db, settings)
    with db.read() as conn:
        task = conn.execute(tasks.select()).one()
    assert (task.client_id, task.schedule_id, task.status) == ("client-z", sid, "queued")
    assert (task.max_attempts, task.on_restart, task.metadata_json) == (5, "resume",
                                                                        '{"job":"hourly"}')
    fired = json.loads(task.request_json)
    assert isinstance(fired.pop("seed"), int)  # drawn per firing (docs/operations.md)
    assert fired == json.loads(schedule_row(db, sid).request_json)
    assert ledger(db) == [(sid, ms("2024-03-01T01:00"), task.id)]


def test_a_new_schedule_never_fires_slots_from_before_it_existed(
    db: Database, settings: Settings, model_id: str
) -> None:
    create_at("2024-03-01T10:30:00Z", db, settings, model_id, "* * * * *", catch_up=100)
    assert fire_at("2024-03-01T10:30:00Z", db, settings) == 0
    assert fire_at("2024-03-01T10:31:01Z", db, settings) == 1


# --- at most one task per slot, ever ------------------------------------------------------

def test_a_completed_earlier_run_does_not_fire_again_even_if_the_checkpoint_goes_back(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *", catch_up=3)
    fire_at("2024-03-01T02:00:30Z", db, settings)
    finish_all_tasks(db)
    rewind_checkpoint(db, sid, ms("2024-03-01T00:00"))  # restored backup, slow clock, …
    assert fire_at("2024-03-01T02:00:40Z", db, settings) == 0
    assert fired(db) == ["2024-03-01T01:00:00.000Z", "2024-03-01T02:00:00.000Z"]
    assert fire_at("2024-03-01T03:00:01Z", db, settings) == 1


@pytest.mark.parametrize("failing_step", ["insert_tasks", "attach_tasks"])
def test_a_pass_failing_midway_leaves_nothing_and_the_next_pass_fires_each_slot_once(
    db: Database, settings: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch,
    failing_step: str,
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *", catch_up=3)
    before = schedule_row(db, sid)
    real = getattr(schedule_firing, failing_step)

    def crash_after_the_work(*args: Any) -> Any:
        real(*args)
        raise RuntimeError("the process dies here")

    monkeypatch.setattr(schedule_firing, failing_step, crash_after_the_work)
    with pytest.raises(RuntimeError):
        fire_at("2024-03-01T05:00:30Z", db, settings)
    assert (task_slots(db), ledger(db), schedule_row(db, sid)) == ([], [], before)

    monkeypatch.setattr(schedule_firing, failing_step, real)
    assert fire_at("2024-03-01T05:00:30Z", db, settings) == 3
    assert fire_at("2024-03-01T05:00:40Z", db, settings) == 0
    assert [slot for _, slot, _ in ledger(db)] == task_slots(db) == [
        ms("2024-03-01T03:00"), ms("2024-03-01T04:00"), ms("2024-03-01T05:00")]


def test_an_active_task_holding_the_dedupe_key_makes_a_slot_pass_without_a_task(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *",
                    dedupe_key="hourly-report")
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 1
    assert fire_at("2024-03-01T02:00:30Z", db, settings) == 0  # the 01:00 task still queued
    finish_all_tasks(db)
    assert fire_at("2024-03-01T03:00:30Z", db, settings) == 1
    assert fired(db, sid) == ["2024-03-01T01:00:00.000Z", "2024-03-01T03:00:00.000Z"]
    assert [slot for _, slot, _ in ledger(db)] == task_slots(db)


def test_a_slot_passed_for_its_dedupe_key_is_logged(
    db: Database, settings: Settings, model_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *",
                    dedupe_key="hourly-report")
    fire_at("2024-03-01T01:00:30Z", db, settings)
    with caplog.at_level(logging.INFO, logger="core.schedule_firing"):
        assert fire_at("2024-03-01T02:00:30Z", db, settings) == 0
    assert [record.getMessage() for record in caplog.records] == [
        f"schedule {sid}: slot 2024-03-01T02:00:00.000Z skipped, no task created: "
        "an active task holds its dedupe_key"]


# --- editing and deleting -------------------------------------------------------------------

def test_a_new_cron_starts_afresh_from_now_without_replaying_history(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *", catch_up=5)
    with freeze_time("2024-03-01T05:10:00Z"):
        row = update_schedule(db, sid, "client-a", {"cron": "30 * * * *"})
    assert iso(row.next_slot_at) == "2024-03-01T05:30:00.000Z"
    assert fire_at("2024-03-01T05:10:00Z", db, settings) == 0
    assert fire_at("2024-03-01T05:30:05Z", db, settings) == 1
    assert fired(db) == ["2024-03-01T05:30:00.000Z"]


def test_changing_only_catch_up_keeps_the_missed_slots(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *")
    with freeze_time("2024-03-01T05:10:00Z"):
        update_schedule(db, sid, "client-a", {"catch_up": 2})
    assert fire_at("2024-03-01T05:10:00Z", db, settings) == 2


def test_deleting_a_schedule_stops_its_slots_and_keeps_its_tasks(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *")
    fire_at("2024-03-01T01:00:30Z", db, settings)
    delete_schedule(db, sid, "client-a")
    assert fire_at("2024-03-01T05:00:30Z", db, settings) == 0
    assert fired(db, sid) == ["2024-03-01T01:00:00.000Z"]
    assert ledger(db) == []


@pytest.mark.parametrize("change", ["delete", "new cron"])
def test_a_schedule_changed_while_a_pass_plans_fires_nothing_under_its_old_self(
    db: Database, settings: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *")
    real_plan = schedule_firing._plan

    def plan_then_change(*args: Any) -> Any:
        planned = real_plan(*args)
        if change == "delete":
            delete_schedule(db, sid, None)
        else:
            update_schedule(db, sid, None, {"cron": "15 * * * *"})
        return planned

    monkeypatch.setattr(schedule_firing, "_plan", plan_then_change)
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 0
    assert (task_slots(db), ledger(db)) == ([], [])


# --- one broken schedule never blocks the others --------------------------------------------

@pytest.fixture
def doomed_model(db: Database, settings: Settings) -> str:
    (settings.models_dir / "doomed.bin").write_bytes(b"soon gone\n")
    register(db, settings.models_dir, "doomed.bin", model_id="doomed", engine="test.words")
    return "doomed"


def test_a_schedule_whose_model_was_removed_is_skipped_with_a_warning(
    db: Database, settings: Settings, model_id: str, doomed_model: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = create_at("2024-03-01T00:00:10Z", db, settings, doomed_model, "0 * * * *")
    healthy = create_at("2024-03-01T00:00:20Z", db, settings, model_id, "0 * * * *")
    remove(db, doomed_model)
    with caplog.at_level(logging.WARNING, logger="core.schedule_firing"):
        assert fire_at("2024-03-01T01:00:30Z", db, settings) == 1
    assert fired(db, healthy) == ["2024-03-01T01:00:00.000Z"]
    assert iso(schedule_row(db, broken).next_slot_at) == "2024-03-01T02:00:00.000Z"
    assert broken in caplog.text and "model_not_found" in caplog.text


def test_a_model_removed_during_the_pass_costs_only_its_own_schedules_slot(
    db: Database, settings: Settings, model_id: str, doomed_model: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = create_at("2024-03-01T00:00:10Z", db, settings, doomed_model, "0 * * * *")
    healthy = [create_at("2024-03-01T00:00:20Z", db, settings, model_id, "0 * * * *")
               for _ in range(3)]
    real_plan = schedule_firing._plan

    def plan_then_remove_model(*args: Any) -> Any:
        planned = real_plan(*args)
        if planned.schedule_id == broken:
            remove(db, doomed_model)
        return planned

    monkeypatch.setattr(schedule_firing, "_plan", plan_then_remove_model)
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 3
    assert all(fired(db, sid) == ["2024-03-01T01:00:00.000Z"] for sid in healthy)
    assert schedule_row(db, broken).checkpoint == ms("2024-03-01T01:00:30")


def test_a_stored_request_that_no_longer_decodes_is_skipped(
    db: Database, settings: Settings, model_id: str
) -> None:
    broken = create_at("2024-03-01T00:00:10Z", db, settings, model_id, "0 * * * *")
    healthy = create_at("2024-03-01T00:00:20Z", db, settings, model_id, "0 * * * *")
    with db.write() as conn:
        conn.execute(update(schedules).where(schedules.c.id == broken)
                     .values(request_json='{"model": "words"}'))
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 1
    assert fired(db, healthy) == ["2024-03-01T01:00:00.000Z"]
    assert fired(db, broken) == []


def test_a_pass_is_bounded_and_the_rest_fires_on_the_next_call(
    db: Database, settings: Settings, model_id: str
) -> None:
    for _ in range(5):
        create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *")
    now = ms("2024-03-01T01:00:30")
    first = fire_due_schedules(db, settings, now, limit=3, chunk=2)
    second = fire_due_schedules(db, settings, now, limit=3, chunk=2)
    assert (first.examined, first.created, second.examined, second.created) == (3, 3, 2, 2)


@pytest.mark.parametrize("damage", [{"cron": "every day"}, {"catch_up": 0}])
def test_a_hand_damaged_schedule_is_parked_for_a_day_and_the_others_fire(
    db: Database, settings: Settings, model_id: str, damage: dict[str, Any]
) -> None:
    broken = create_at("2024-03-01T00:00:10Z", db, settings, model_id, "0 * * * *")
    healthy = create_at("2024-03-01T00:00:20Z", db, settings, model_id, "0 * * * *")
    with db.write() as conn:
        conn.execute(update(schedules).where(schedules.c.id == broken).values(**damage))
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 1
    assert fired(db, healthy) == ["2024-03-01T01:00:00.000Z"]
    assert iso(schedule_row(db, broken).next_slot_at) == "2024-03-02T01:00:30.000Z"


def test_the_ledger_keeps_a_schedules_slots_for_the_retention_period_only(
    db: Database, settings: Settings, model_id: str
) -> None:
    keep_three_hours = replace(settings, retention_hours=3)
    create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *")
    for hour in range(1, 10):
        fire_at(f"2024-03-01T{hour:02d}:00:30Z", db, keep_three_hours)
    assert [iso(slot) for _, slot, _ in ledger(db)] == [  # the last pass ran at 09:00:30
        "2024-03-01T07:00:00.000Z", "2024-03-01T08:00:00.000Z", "2024-03-01T09:00:00.000Z"]
    assert len(task_slots(db)) == 9


# --- revoked owners ---------------------------------------------------------------------------

def owner(db: Database) -> str:
    return create_client(db, name="owner", scopes=frozenset({"responses:create"})).client_id


def test_a_revoked_clients_schedules_fire_nothing_and_do_not_pile_up_as_due(
    db: Database, settings: Settings, model_id: str
) -> None:
    gone, kept = owner(db), owner(db)
    revoked = create_at("2024-03-01T00:00:10Z", db, settings, model_id, "0 * * * *",
                        client=gone, catch_up=3)
    active = create_at("2024-03-01T00:00:20Z", db, settings, model_id, "0 * * * *", client=kept)
    revoke(db, gone)
    assert fire_at("2024-03-01T03:00:30Z", db, settings) == 1
    assert fired(db, revoked) == [] and fired(db, active) == ["2024-03-01T03:00:00.000Z"]
    assert [sid for sid, _, _ in ledger(db)] == [active]
    row = schedule_row(db, revoked)  # its slots were consumed: nothing is due until 04:00
    assert (row.checkpoint, iso(row.next_slot_at)) == (ms("2024-03-01T03:00:30"),
                                                       "2024-03-01T04:00:00.000Z")
    assert fire_due_schedules(db, settings, ms("2024-03-01T03:00:40")).examined == 0


def test_a_client_revoked_while_a_pass_plans_gets_no_task(
    db: Database, settings: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = owner(db)
    sid = create_at("2024-03-01T00:00:10Z", db, settings, model_id, "0 * * * *", client=client)
    real_plan = schedule_firing._plan

    def plan_then_revoke(*args: Any) -> Any:
        planned = real_plan(*args)
        revoke(db, client)
        return planned

    monkeypatch.setattr(schedule_firing, "_plan", plan_then_revoke)
    assert fire_at("2024-03-01T01:00:30Z", db, settings) == 0
    assert (task_slots(db), ledger(db)) == ([], [])
    assert schedule_row(db, sid).checkpoint == ms("2024-03-01T01:00:30")


def test_a_cap_lowered_after_the_schedule_was_accepted_holds_its_tasks_to_the_new_cap(
    db: Database, settings: Settings, model_id: str
) -> None:
    create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *", max_attempts=8)
    lowered = replace(settings, max_attempts_cap=5, max_attempts_default=2)
    assert fire_at("2024-03-01T01:00:30Z", db, lowered) == 1
    with db.read() as conn:
        assert conn.execute(tasks.select()).one().max_attempts == 5


def test_a_schedules_task_takes_the_priority_of_its_request(
    db: Database, settings: Settings, model_id: str
) -> None:
    create_at("2026-12-01T08:00:30", db, settings, model_id, "* * * * *", service_tier="flex")
    assert fire_at("2026-12-01T08:01:30", db, settings) == 1
    with db.read() as conn:
        assert conn.execute(select(tasks.c.priority)).scalars().all() == [8]
