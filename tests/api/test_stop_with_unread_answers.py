"""`taskward run` told to stop while a client leaves its answers unread.

granian ends a worker only once every connection has ended, and runs the app's
shutdown hooks only then; a connection whose answers are stuck in the server's socket
(a client that pipelines requests and never reads, no token needed) never ends, so the
worker is killed once its stop has lasted the drain plus granian's margin. The
sweeper's drain and hand-back begin at the stop signal itself, so its running tasks
are handed back by then rather than left `running` as after a crash.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from infra.server import STOP_MARGIN_SECONDS
from tests.api.test_served import create
from tests.scheduler.processes import environment, wait_until
from tests.service.running import Runs
from tests.store.helpers import task_row

DRAIN_SECONDS = 1
UNREAD_RECEIVE_BUFFER = 4096  # the client's socket: small, so the server's fills soon
PROBE = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def test_run_hands_its_task_back_while_a_client_leaves_its_answers_unread(
    db: Database, settings: Settings, model_id: str, runs: Runs
) -> None:
    running = runs.start({**environment(settings, drain_seconds=DRAIN_SECONDS),
                          "PYTHONUNBUFFERED": "1"})
    with running.client(running.pair()) as client:
        task_id = create(client, "words=3000 delay=0.05").json()["id"]
    wait_until(lambda: task_row(db, task_id).status == Status.RUNNING, timeout=30,
               what="the task to run")

    with _probes_left_unread(running.base_url):
        running.process.send_signal(signal.SIGTERM)
        _stopped_within(running.process, DRAIN_SECONDS + STOP_MARGIN_SECONDS + 10)

    assert "handing back 1 unfinished task(s)" in running.log()
    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.QUEUED, 0)


@contextmanager
def _probes_left_unread(base_url: str) -> Iterator[None]:
    """A connection that pipelines `GET /healthz` until the server stops taking them,
    its answers never read, held open for the block."""
    address = urlsplit(base_url)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UNREAD_RECEIVE_BUFFER)
        sock.connect((address.hostname, address.port))
        sock.settimeout(2)
        probes, deadline = PROBE * 2000, time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                sock.sendall(probes)
            raise AssertionError("the server kept reading probes whose answers nobody read")
        except TimeoutError:
            pass  # the server takes no more: its answers fill every buffer on the way
        yield


def _stopped_within(process: subprocess.Popen[bytes], seconds: float) -> None:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`taskward run` still running {seconds} s after SIGTERM") from None
