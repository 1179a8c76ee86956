"""A disk that fills up under a served SQLite store (docs/operations.md, "Faults and
recovery"): creations are refused with `503 store_unavailable` and change nothing,
nothing is acknowledged that was not stored, and once space is freed the same processes
(no restart) take creations again and finish every task they accepted.

The disk is real: a 16 MiB tmpfs mounted for the test, filled by a file of the test's
own. Mounting needs root, which this project's machines and its CI run as; without it
the test fails and says so, rather than skip.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from core.settings import Settings
from core.states import Status
from core.store.connect import open_database
from core.tables import tasks
from tests.api.helpers import register_test_model
from tests.api.served import running_service
from tests.api.test_served import create, task_status, token_client
from tests.databases import migrated_store
from tests.scheduler.processes import wait_until

PROMPT = "a long prompt that must not reach an error " * 500  # ~22 KB a creation


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a 16 MiB tmpfs and needs root to: {mounted.stderr}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """A file that takes every free byte of `disk`."""
    filler = disk / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_refuses_creations_cleanly_and_loses_nothing_accepted(
        tmp_path: Path, small_disk: Path, sqlite_template: Path) -> None:
    with migrated_store("sqlite", small_disk, sqlite_template) as url:
        store = open_database(Settings(database_url=url))
        register_test_model(store, tmp_path / "models")
        with running_service(url, tmp_path) as service:
            client, _ = token_client(service)
            with client:
                accepted = [create(client, "words=5").json()["id"] for _ in range(8)]
                wait_until(lambda: finished(client, accepted), timeout=30,
                           what="the tasks accepted before the disk filled")

                filler = fill(small_disk)
                answers = [create(client, f"{PROMPT} words=5") for _ in range(40)]
                refused = [answer for answer in answers if answer.status_code != 202]
                accepted += [answer.json()["id"] for answer in answers
                             if answer.status_code == 202]
                assert refused, "the full disk refused nothing"
                assert {(a.status_code, a.json()["code"]) for a in refused} == {
                    (503, "store_unavailable")}
                assert not any("must not reach" in answer.text for answer in refused)

                filler.unlink()
                wait_until(lambda: created_after_freeing(client, accepted), timeout=30,
                           what="a creation once space is freed")
                wait_until(lambda: finished(client, accepted), timeout=90,
                           what="every accepted task, after the disk filled")
        with store.read() as conn:
            stored = conn.execute(select(func.count()).select_from(tasks)).scalar_one()
        store.dispose()
    assert stored == len(accepted)  # a refused creation left nothing behind


def finished(client: httpx.Client, task_ids: list[str]) -> bool:
    return all(task_status(client, task_id) == Status.COMPLETED for task_id in task_ids)


def created_after_freeing(client: httpx.Client, accepted: list[str]) -> bool:
    answer = create(client, "words=5")
    if answer.status_code == 202:
        accepted.append(answer.json()["id"])
    return answer.status_code == 202
