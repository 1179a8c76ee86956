"""Two sweeper processes firing the same schedules: exactly one task per slot, and
never more active tasks than the owner's quota."""

from __future__ import annotations

import multiprocessing
from collections import Counter

from freezegun import freeze_time
from sqlalchemy import select

from core.cron import MINUTE_MS
from core.quotas import Limits
from core.settings import Settings
from core.store.clients import create_client
from core.store.database import Database
from core.tables import tasks
from tests.schedules.helpers import active_tasks, add_schedule, finish_all_tasks, ledger, ms
from tests.schedules.race_child import sweep_minutes

MINUTES = 40
START = "2024-02-29T23:40"


def test_two_sweeper_processes_racing_make_exactly_one_task_per_slot(
    db: Database, settings: Settings, model_id: str
) -> None:
    with freeze_time(f"{START}:00Z"):
        every_minute = [add_schedule(db, settings, model_id, "* * * * *") for _ in range(12)]
        every_other = [add_schedule(db, settings, model_id, "*/2 * * * *", catch_up=3)
                       for _ in range(4)]
    start = ms(START)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    sweepers = [context.Process(target=sweep_minutes, args=(
        settings.database_url, settings.models_dir, start, MINUTES, barrier, chunk))
        for chunk in (3, 5)]
    for sweeper in sweepers:
        sweeper.start()
    for sweeper in sweepers:
        sweeper.join(timeout=180)
    assert [sweeper.exitcode for sweeper in sweepers] == [0, 0]

    with db.read() as conn:
        made = list(conn.execute(select(tasks.c.id, tasks.c.schedule_id, tasks.c.run_at)))
    per_slot = Counter((task.schedule_id, task.run_at) for task in made)
    minutes = [start + n * MINUTE_MS for n in range(1, MINUTES + 1)]
    expected = {(sid, slot) for sid in every_minute for slot in minutes} | {
        (sid, slot) for sid in every_other for slot in minutes[1::2]}
    assert set(per_slot) == expected
    assert max(per_slot.values()) == 1
    assert sorted((sid, slot, tid) for tid, sid, slot in made) == ledger(db)


def test_two_sweeper_processes_racing_never_take_a_client_over_its_quota(
    db: Database, settings: Settings, model_id: str
) -> None:
    quota = 3
    client = create_client(db, name="capped", scopes=frozenset({"responses:create"}),
                           limits=Limits(max_active_tasks=quota)).client_id
    with freeze_time(f"{START}:00Z"):
        capped = [add_schedule(db, settings, model_id, "* * * * *", client=client)
                  for _ in range(10)]
    start, minutes = ms(START), 4
    context = multiprocessing.get_context("spawn")
    barrier, settled = context.Barrier(3), context.Barrier(3)  # the sweepers and this test
    sweepers = [context.Process(target=sweep_minutes, args=(
        settings.database_url, settings.models_dir, start, minutes, barrier, chunk, settled))
        for chunk in (2, 3)]
    for sweeper in sweepers:
        sweeper.start()
    active_each_minute = []
    for _ in range(minutes):
        barrier.wait(timeout=60)
        settled.wait(timeout=60)
        active_each_minute.append(active_tasks(db, client))
        finish_all_tasks(db)
    for sweeper in sweepers:
        sweeper.join(timeout=180)
    assert [sweeper.exitcode for sweeper in sweepers] == [0, 0]

    assert active_each_minute == [quota] * minutes
    with db.read() as conn:
        made = list(conn.execute(select(tasks.c.id, tasks.c.schedule_id, tasks.c.run_at)))
    assert {task.schedule_id for task in made} <= set(capped)
    assert max(Counter((task.schedule_id, task.run_at) for task in made).values()) == 1
    assert sorted((sid, slot, tid) for tid, sid, slot in made) == ledger(db)
