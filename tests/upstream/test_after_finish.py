"""An answer whose `finish_reason` came is complete, whatever the connection does after
it: kept open without `[DONE]`, or reset. Each stand-in below is a one-route HTTP/1.1
server standing for an upstream a user runs outside this process (a server, or the
proxy in front of it, that misbehaves exactly so once its answer is out). Such an
attempt used to fail `upstream_unavailable` (timed out, or connection broken), cool
the URL down and be retried or dead-lettered with its text already stored; with a
second URL, that server was asked to continue the finished answer."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.tasks import get_response
from tests.scheduler.helpers import output_text, streamed_text
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.scripted import USAGE, LoopServer, Scripted, chunk, delta, read_request
from tests.upstream.test_errors import run_until_finished

ANSWER = [delta("Complete answer."), delta("", "stop")]


class StopsAfterFinish(LoopServer):
    """Streams `reads` as one piece of a chunked body, then never ends it: with `reset`
    it resets the connection after `pause`, else it keeps it open until the client
    closes it (`closed` is set then)."""

    def __init__(self, reads: list[bytes], *, reset: bool, pause: float = 0.2) -> None:
        self.reads = reads
        self.reset = reset
        self.pause = pause
        self.closed = threading.Event()
        super().__init__()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b"".join(self.reads)))
        await writer.drain()
        if self.reset:
            await asyncio.sleep(self.pause)
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        await reader.read()  # returns once the client has closed the connection
        self.closed.set()
        writer.close()


@pytest.fixture
def stand_ins() -> Iterator[list[StopsAfterFinish]]:
    started: list[StopsAfterFinish] = []
    yield started
    for server in started:
        server.stop()


TIMEOUT_SECONDS = 20.0


def completed_once(db: Database, settings: Settings, base_urls: list[str]) -> str:
    """A task run against `base_urls`, which must complete in its first attempt with the
    answer's text, as streamed, well before the entry's timeout (a pass runs its attempt
    to the end: one that waited for the timeout took all of it)."""
    add_upstream(db, base_urls, timeout_seconds=TIMEOUT_SECONDS)
    [task_id] = enqueue(db, max_attempts=2)
    started = time.monotonic()
    run_until_finished(db, settings, task_id)
    assert time.monotonic() - started < TIMEOUT_SECONDS / 2
    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.error_code) == (Status.COMPLETED, 1, None)
    assert output_text(db, task_id) == streamed_text(db, task_id) == "Complete answer."
    return task_id


def test_a_connection_kept_open_after_the_finish_and_usage_completes_at_once(
    db: Database, quick: Settings, stand_ins: list[StopsAfterFinish],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It waited the entry's whole timeout for `[DONE]` and failed as timed out. The
    usage is the answer's end: nothing after it is waited for (the tail's bound, for a
    server that sends none, is out of the way here)."""
    monkeypatch.setattr("core.engines.upstream.engine._TAIL_SECONDS", 3600.0)
    server = StopsAfterFinish([*ANSWER, USAGE], reset=False)
    stand_ins.append(server)

    task_id = completed_once(db, quick, [server.base_url])

    response = get_response(db, task_id, None)
    assert (response.input_tokens, response.output_tokens) == (5, 3)  # its usage chunk
    assert server.closed.wait(10)  # not held open by this side either


def test_a_connection_kept_open_after_a_finish_without_usage_completes(
    db: Database, quick: Settings, stand_ins: list[StopsAfterFinish]
) -> None:
    """A server that sends no usage although asked: the tail after the finish is
    waited for briefly, not for the entry's timeout."""
    server = StopsAfterFinish(ANSWER, reset=False)
    stand_ins.append(server)

    task_id = completed_once(db, quick, [server.base_url])

    assert get_response(db, task_id, None).output_tokens == 1  # one delta, one token
    assert server.closed.wait(10)


@pytest.mark.parametrize("reads", [ANSWER, [*ANSWER, USAGE]], ids=["no usage", "usage"])
def test_a_reset_after_the_finish_completes_and_no_other_url_is_asked(
    db: Database, quick: Settings, stand_ins: list[StopsAfterFinish],
    scripted: Callable[..., Scripted], reads: list[bytes],
) -> None:
    """It failed `connection broken`, cooled the URL down, and the next URL was asked to
    continue the finished answer."""
    server = StopsAfterFinish(reads, reset=True)
    stand_ins.append(server)
    other = scripted([delta(" More."), delta("", "stop"), USAGE, b"data: [DONE]\n\n"])

    completed_once(db, quick, [server.base_url, other.base_url])

    assert other.connections == 0
