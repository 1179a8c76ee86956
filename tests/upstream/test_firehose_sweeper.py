"""A real `taskward sweeper` (SQLite) with one task on an upstream that streams without
end at ~1.3 MB/s of text (a stand-in firehose, tests/upstream/firehose.py) and no
`max_output_tokens`: the sweeper's memory stays bounded, another model's task on it
completes promptly meanwhile, and what the firehose task stored (its snapshot, its
output, its streamed deltas) agrees. Before the inbox was bounded the sweeper's memory
grew by hundreds of MB a second and other tasks stalled for seconds."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select

from core.models_registry import register_upstream
from core.settings import Settings
from core.store.connect import open_database
from core.store.database import Database
from core.tables import responses, task_events, tasks
from tests.databases import migrated_store
from tests.scheduler.processes import wait_until
from tests.upstream.firehose import Firehose
from tests.upstream.helpers import enqueue
from tests.upstream.scripted import USAGE, Scripted, delta
from tests.upstream.served import sweeper, upstream_env

# Far above what the sweeper takes with the bound (~110-140 MB here), far below what it
# took without (~780 MB after 4 s of the firehose): past it the sweeper is killed.
MOST_RSS_MB = 400
PROMPT_SECONDS = 2.0  # the other model's task, alone: ~0.15 s


@dataclass
class Run:
    most_rss_mb: float = 0.0
    killed: bool = False
    other_seconds: float | None = None  # the other model's task, created to finished
    # Read in one transaction while the firehose task was running.
    snapshot_text: str | None = None
    output_text: str = ""
    streamed: str = ""


def group_rss_mb(pgid: int) -> float:
    kb = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/status") as status:
                kb += next((int(line.split()[1]) for line in status
                            if line.startswith("VmRSS:")), 0)
        except (OSError, StopIteration):
            continue
    return kb / 1024


def read_together(db: Database, task_id: str, run: Run) -> bool:
    """The task's snapshot, output and deltas as of one moment into `run`, if it is
    running and has stored some text (else False)."""
    with db.read() as conn:
        status, snapshot = conn.execute(select(tasks.c.status, tasks.c.snapshot_json)
                                        .where(tasks.c.id == task_id)).one()
        if status != "running" or snapshot is None:
            return False
        run.snapshot_text = json.loads(snapshot)["text"]
        run.output_text = conn.execute(select(responses.c.output_text)
                                       .where(responses.c.task_id == task_id)).scalar_one()
        run.streamed = "".join(json.loads(data)["delta"] for (data,) in conn.execute(
            select(task_events.c.data).where(task_events.c.task_id == task_id,
                                             task_events.c.type == "response.output_text.delta")
            .order_by(task_events.c.seq)))
    return True


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("firehose")
    firehose = Firehose(pause=0.01)  # 200 deltas of 64 characters every 10 ms
    other = Scripted([delta("One") + delta(", two", "stop") + USAGE + b"data: [DONE]\n\n"])
    result = Run()
    with migrated_store("sqlite", workdir, sqlite_template) as url:
        db = open_database(Settings(database_url=url))
        register_upstream(db, "firehose", base_urls=[firehose.base_url], model="x")
        register_upstream(db, "other", base_urls=[other.base_url], model="x")
        child = sweeper(upstream_env(url, workdir), workdir / "sweeper.log")
        done = threading.Event()

        def watch_memory() -> None:
            while not done.wait(0.1):
                result.most_rss_mb = max(result.most_rss_mb, group_rss_mb(child.pid))
                if result.most_rss_mb > MOST_RSS_MB:
                    result.killed = True
                    os.killpg(child.pid, signal.SIGKILL)
                    return

        watcher = threading.Thread(target=watch_memory)
        try:
            [hose] = enqueue(db, model="firehose", max_attempts=1)
            wait_until(lambda: read_together(db, hose, result), timeout=30,
                       what="the firehose's first stored text")
            watcher.start()
            time.sleep(3)
            [task] = enqueue(db, model="other", max_attempts=1)
            with db.read() as conn:
                created = conn.execute(select(tasks.c.created_at)
                                       .where(tasks.c.id == task)).scalar_one()

            def finished() -> int | None:
                with db.read() as conn:
                    return conn.execute(select(tasks.c.finished_at).where(
                        tasks.c.id == task, tasks.c.status == "completed")).scalar_one_or_none()

            with_end = wait_until(lambda: finished() or result.killed, timeout=15,
                                  what="the other model's task")
            if not result.killed:
                result.other_seconds = (with_end - created) / 1000
                result.snapshot_text = None
                read_together(db, hose, result)  # what it stored by now, ~4 s in
            yield result
        finally:
            done.set()
            if watcher.is_alive():
                watcher.join()
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
            db.dispose()
            firehose.stop()
            other.stop()


def test_a_firehose_leaves_the_sweepers_memory_bounded(run: Run) -> None:
    assert not run.killed and run.most_rss_mb < MOST_RSS_MB


def test_another_models_task_completes_promptly_beside_a_firehose(run: Run) -> None:
    assert run.other_seconds is not None and run.other_seconds < PROMPT_SECONDS


def test_a_firehose_tasks_snapshot_output_and_streamed_deltas_agree(run: Run) -> None:
    """What a resume would continue from (the snapshot) is exactly what was stored and
    what its clients were streamed, read while the firehose still ran."""
    assert run.snapshot_text is not None, "the firehose task was not running"
    # Much stored by then (~5 MB in ~4 s on a quiet machine, 0.7 MB on one that was
    # busy with three test processes and more): the agreement is over a long output.
    assert len(run.output_text) > 1 << 18
    assert run.snapshot_text == run.output_text == run.streamed
