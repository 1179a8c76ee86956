"""Resume by continuation: a `resume` task whose sweeper is killed -9 mid-stream is
recovered and continued by a new sweeper; its text is the stored prefix plus a
continuation, with nothing repeated (llama-server streams the prefix back first; it is
stripped) and nothing lost."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from core.settings import Settings
from core.states import OnRestart
from core.store.database import Database
from tests.scheduler.helpers import event_data, output_text, streamed_text
from tests.scheduler.processes import run_json, wait_until
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.llama import LlamaServer
from tests.upstream.served import sweeper, upstream_env


def test_a_killed_sweepers_task_is_continued_without_repeats(
    db: Database, settings: Settings, tmp_path: Path, llama: LlamaServer
) -> None:
    add_upstream(db, [llama.base_url])
    # Long enough that the kill lands mid-stream even on a quiet machine (48 tokens
    # could finish between the output check and the kill).
    [task_id] = enqueue(db, on_restart=OnRestart.RESUME, max_output_tokens=160,
                        input="Count from one to one hundred in words, separated by commas.")
    env = upstream_env(settings.database_url, tmp_path)
    first = sweeper(env, tmp_path / "sweeper-1.log")
    try:
        wait_until(lambda: len(output_text(db, task_id)) >= 20, timeout=60,
                   what="some stored output")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    prefix = output_text(db, task_id)
    assert run_json(env, "recover")["recovered"]["running"] == 1

    second = sweeper(env, tmp_path / "sweeper-2.log")
    try:
        wait_until(lambda: task_row(db, task_id).status == "completed", timeout=60,
                   what="the resumed task to complete")
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(timeout=10)

    final = output_text(db, task_id)
    assert final.startswith(prefix) and len(final) > len(prefix)
    assert streamed_text(db, task_id) == final  # the deltas add up: nothing lost or repeated
    assert not final[len(prefix):].lstrip().startswith(prefix.strip()[:12])  # no echo
    assert len(event_data(db, task_id, "response.in_progress")) == 2  # started, resumed
