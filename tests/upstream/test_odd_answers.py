"""What a broken upstream answers no longer fails or wedges its attempts: a control
character written raw inside a chunk's string, an output count past the store's
integer, an answer head that cannot be parsed. Each stand-in here is a one-route
HTTP/1.1 server standing for an upstream a user runs outside this process (a server,
or a proxy in front of one, that misbehaves exactly so)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from core.engines.upstream.protocol import MAX_TOKENS
from core.engines.upstream.transport import END, MalformedHead
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.tasks import get_response
from tests.scheduler.helpers import output_text, streamed_text
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.scripted import USAGE, LoopServer, Scripted, delta, read_request
from tests.upstream.test_broken_streams import DONE, completed, raw_delta
from tests.upstream.test_errors import retry_messages, run_until_finished
from tests.upstream.test_transport import Answer, Seen, _request, pumps


def test_a_raw_control_character_in_a_string_is_read_as_if_escaped(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """JSON wants a TAB or a NUL inside a string escaped; written raw, the chunk broke the
    stream on every attempt and the task was dead-lettered. The NUL is stored as an
    escaped one is (PostgreSQL's text holds none)."""
    server = scripted([delta("One "), raw_delta(b"tab\there nul\x00end"), delta("", "stop"),
                       USAGE, DONE], pause=0.01)
    assert completed(db, quick, server)[1] == "One tab\there nul\ufffdend"


def test_an_output_count_is_never_beyond_the_stores_integer(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """A reported count of 2^31 - 1 is one a column holds; the next delta, without a
    usage, counted one more, and on PostgreSQL every write of the attempt failed: it
    waited out its lease, again on every retry."""
    most = b', "usage": {"prompt_tokens": %d, "completion_tokens": %d}' % (MAX_TOKENS,
                                                                            MAX_TOKENS)
    server = scripted([raw_delta(b"a", most), delta("b"), delta("c", "stop"), DONE],
                      pause=0.01)
    add_upstream(db, [server.base_url])
    [task_id] = enqueue(db)  # no max_output_tokens: the count alone grows

    run_until_finished(db, quick, task_id)

    response = get_response(db, task_id, None)
    assert (response.status, response.attempts) == (Status.COMPLETED, 1)
    assert output_text(db, task_id) == streamed_text(db, task_id) == "abc"
    assert (response.input_tokens, response.output_tokens) == (MAX_TOKENS, MAX_TOKENS)


HEADS = [b"HTTZ/9 OK GARBAGE\r\n\r\n",
         b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
         b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 200_000 + b"\r\n\r\n"]
HEAD_IDS = ["status line", "transfer coding", "head too long"]


def answering(head: bytes) -> Answer:
    """A stand-in's answer to each connection: `head` for its one request."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     seen: Seen) -> None:
        if await _request(reader, seen):
            writer.write(head)
            await writer.drain()
    return answer


@pytest.mark.parametrize("head", HEADS, ids=HEAD_IDS)
def test_a_head_that_cannot_be_parsed_is_not_sent_again(head: bytes) -> None:
    """Only a request hung up on unanswered is sent again: this one was sent four times
    per attempt, for the same answer each time."""
    seen = pumps(1, answering(head))
    [[failure, end]] = seen.items
    assert isinstance(failure, MalformedHead) and end is END
    assert seen.requests == 1


class AnswersWith(LoopServer):
    """Answers every request with `answer` and hangs up; counts the requests."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests = 0
        super().__init__()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            self.requests += 1
            writer.write(self.answer)
            await writer.drain()
        finally:
            writer.close()


@pytest.mark.parametrize("head", HEADS, ids=HEAD_IDS)
def test_a_head_that_cannot_be_parsed_is_a_broken_stream(
    db: Database, quick: Settings, head: bytes
) -> None:
    """It read as a broken connection (`upstream_unavailable`, the URL cooled down)
    after four requests per attempt; it is an answer, broken like a malformed chunk."""
    server = AnswersWith(head)
    try:
        messages = retry_messages(db, quick, server.base_url)
    finally:
        server.stop()

    assert messages == [f"upstream {server.base_url} ended its stream before finishing"]
    assert server.requests == 2  # one per attempt
