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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from core.settings import Settings
from core.states import Status
from core.store.connect import open_database
from tests.api.helpers import register_test_model
from tests.api.served import Service, process, running_service, service_env, wait_ready
from tests.api.test_served import create, sse_blocks, token_client
from tests.databases import migrated_store
from tests.scheduler.processes import free_port, wait_until
from tests.store.helpers import task_row

STOP_SECONDS = 10  # far below the long-poll's 60 s and the task's length


def test_serve_stops_at_once_while_a_stream_and_a_long_poll_wait(
    tmp_path: Path, sqlite_template: Path
) -> None:
    with ExitStack() as stack:
        url = _store_with_the_test_model(stack, tmp_path, sqlite_template)
        service = stack.enter_context(running_service(url, tmp_path, sweeper=False, workers=1))
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
    tmp_path: Path, sqlite_template: Path
) -> None:
    with ExitStack() as stack:
        url = _store_with_the_test_model(stack, tmp_path, sqlite_template)
        service = stack.enter_context(_running_run(url, tmp_path))
        assert service.server is not None
        client, _ = token_client(service)
        task_id = create(client, "words=3000 delay=0.05").json()["id"]

        with ThreadPoolExecutor(1) as pool:
            opened: list[str] = []
            streamed = pool.submit(_follow, client, task_id, opened)
            wait_until(lambda: "response.output_text.delta" in opened, timeout=30,
                       what="the task's output streaming")
            service.server.send_signal(signal.SIGTERM)  # as systemd or `kill` would
            assert _exit_code_within(service.server, STOP_SECONDS) == 0

            blocks = streamed.result(timeout=5)
    assert blocks[-1]["event"] == "response.output_text.delta"  # ended whole, unfinished
    assert "handing back 1 unfinished task(s)" in (tmp_path / "run.log").read_text()
    db = open_database(Settings(database_url=url))
    try:
        assert task_row(db, task_id).status == Status.QUEUED
    finally:
        db.dispose()


@contextmanager
def _running_run(url: str, workdir: Path) -> Iterator[Service]:
    """`taskward run` on a random port, its drain short (1 s)."""
    env = {**service_env(url, workdir / "models"), "TASKWARD_DRAIN_SECONDS": "1"}
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with process(["run", "--port", str(port)], env, workdir / "run.log") as server:
        wait_ready(base_url, server, workdir / "run.log")
        yield Service(base_url, env, server)


def _store_with_the_test_model(stack: ExitStack, workdir: Path, sqlite_template: Path) -> str:
    url = stack.enter_context(migrated_store("sqlite", workdir, sqlite_template))
    db = open_database(Settings(database_url=url))
    register_test_model(db, workdir / "models")
    db.dispose()
    return url


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
