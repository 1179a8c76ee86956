"""`taskward serve` and `taskward run` told to stop while clients wait on them.

granian's worker stops only once every open connection has ended, and runs the app's
shutdown hooks (`taskward run`'s sweeper drain among them) only then. So an SSE stream
of a task that is not finishing and a long-poll must end at the signal, not whenever
their clients give up: the stream ends whole, and its client resumes elsewhere from the
last `id` it read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from tests.api.served import running_service
from tests.api.test_served import create, sse_blocks, token_client
from tests.scheduler.processes import environment, wait_until
from tests.service.running import Runs
from tests.store.helpers import task_row

STOP_SECONDS = 10  # far below the long-poll's 60 s and the task's length


def test_serve_stops_at_once_while_a_stream_and_a_long_poll_wait(
    settings: Settings, model_id: str, tmp_path: Path
) -> None:
    with running_service(settings.database_url, tmp_path, sweeper=False, workers=1) as service:
        assert service.server is not None
        client, _ = token_client(service)
        task_id = create(client).json()["id"]  # stays queued: no sweeper runs

        with ThreadPoolExecutor(2) as pool:
            opened: list[str] = []
            streamed = pool.submit(_follow, client, task_id, opened)
            polled = pool.submit(client.get, f"/v1/tasks/{task_id}", params={"wait": 60})
            wait_until(lambda: opened, timeout=10, what="the stream's first event")
            time.sleep(0.5)  # the long-poll is waiting by now
            os.killpg(service.server.pid, signal.SIGTERM)
            assert _exit_code_within(service.server, STOP_SECONDS) == 0

            blocks = streamed.result(timeout=5)
            answer = polled.result(timeout=5)
    assert [block["event"] for block in blocks] == ["response.created"]
    assert (answer.status_code, answer.json()["status"]) == (200, "queued")


def test_run_with_a_stream_open_drains_and_stops_on_one_signal(
    db: Database, settings: Settings, model_id: str, runs: Runs
) -> None:
    # unbuffered: the admin code `pair` reads must reach the log at once
    running = runs.start({**environment(settings, drain_seconds=1), "PYTHONUNBUFFERED": "1"})
    with running.client(running.pair()) as client, ThreadPoolExecutor(1) as pool:
        task_id = create(client, "words=3000 delay=0.05").json()["id"]
        opened: list[str] = []
        streamed = pool.submit(_follow, client, task_id, opened)
        wait_until(lambda: "response.output_text.delta" in opened, timeout=30,
                   what="the task's output streaming")
        running.process.send_signal(signal.SIGTERM)  # as systemd or `kill` would
        assert _exit_code_within(running.process, STOP_SECONDS) == 0

        blocks = streamed.result(timeout=5)
    assert blocks[-1]["event"] == "response.output_text.delta"  # ended whole, unfinished
    assert "handing back 1 unfinished task(s)" in running.log()
    assert task_row(db, task_id).status == Status.QUEUED


def _exit_code_within(server: subprocess.Popen[bytes], seconds: float) -> int | None:
    """The server's exit code once it stops, or None when it is still running after
    `seconds`: then it is killed, so that its clients' reads end and the failing test
    does not wait on them for ever."""
    try:
        return server.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        return None


def _follow(client: httpx.Client, task_id: str, opened: list[str]) -> list[dict[str, str]]:
    """The task's SSE stream read to its end; `opened` gets each event's type as it comes."""
    lines: list[str] = []
    with client.stream("GET", f"/v1/tasks/{task_id}/events",
                       headers={"Accept": "text/event-stream"}) as response:
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith("event: "):
                opened.append(line.removeprefix("event: "))
    return sse_blocks(lines)
