"""An SSE stream whose client stops reading is ended, and its stream slot freed.

Nothing else would end it: its frames wait in `send` for a client that takes none, so
neither keep-alives nor the revocation check nor the live tail's stop ever run. Each
piece of a stream must be taken within `TASKWARD_HTTP_BODY_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from core.engines.base import Usage
from core.objects import item_id
from core.settings import Settings
from core.store import completion, worker_writes
from core.store.database import Database
from core.store.transitions import Event
from tests.api.helpers import closing_events, output_events, start_due
from tests.api.served import Service, running_service
from tests.api.test_served import create, token_client
from tests.scheduler.processes import wait_until

SEND_TIMEOUT_SECONDS = 2
# A log of ~10 MB (its deltas, then the whole text twice: `output_text.done` and the
# completed response), far more than the buffers on the way hold (the server's socket
# grows to 4 MB).
DELTA = "w " * 512
DELTAS = 3000
UNREAD_RECEIVE_BUFFER = 4096


def test_a_stream_left_unread_ends_and_frees_its_slot(
    db: Database, settings: Settings, model_id: str, tmp_path: Path
) -> None:
    limits = {"TASKWARD_HTTP_BODY_TIMEOUT_SECONDS": str(SEND_TIMEOUT_SECONDS),
              "TASKWARD_CLIENT_MAX_STREAMS": "1"}
    with running_service(settings.database_url, tmp_path, sweeper=False, workers=1,
                         settings=limits) as service:
        client, _ = token_client(service)
        task_id = create(client).json()["id"]
        _complete_with_a_long_log(db)

        with _stream_left_unread(service, client, task_id):
            assert _stream_status(client, task_id) == 429  # the unread one holds the slot
            wait_until(lambda: _stream_status(client, task_id) == 200,
                       timeout=SEND_TIMEOUT_SECONDS + 20, every=0.5,
                       what="the unread stream to end and free its slot")


def _complete_with_a_long_log(db: Database) -> None:
    [claim] = start_due(db)
    ids = {"item_id": item_id(claim.task_id), "output_index": 0, "content_index": 0}
    deltas = [Event("response.output_text.delta", {**ids, "delta": DELTA})] * (DELTAS - 1)
    text = DELTA * DELTAS
    worker_writes.append_output(db, claim.task_id, claim.owner_token,
                                [*output_events(claim.task_id, DELTA), *deltas], text=text)
    completion.complete(db, claim.task_id, claim.owner_token,
                        closing_events(claim.task_id, text), usage=Usage(3, DELTAS))


@contextmanager
def _stream_left_unread(service: Service, client: httpx.Client, task_id: str) -> Iterator[None]:
    """The task's event stream requested on a connection that reads nothing, held open
    for the block; entered once the server has begun answering it."""
    address = urlsplit(service.base_url)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UNREAD_RECEIVE_BUFFER)
        sock.connect((address.hostname, address.port))
        sock.sendall(f"GET /v1/tasks/{task_id}/events HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: {client.headers['Authorization']}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        wait_until(lambda: sock.recv(1, socket.MSG_PEEK), timeout=10,
                   what="the stream's first bytes")
        yield


def _stream_status(client: httpx.Client, task_id: str) -> int:
    """The status of the task's event stream, read to its end when it is one."""
    with client.stream("GET", f"/v1/tasks/{task_id}/events",
                       headers={"Accept": "text/event-stream"}) as answer:
        for _ in answer.iter_bytes():
            pass
        return answer.status_code
