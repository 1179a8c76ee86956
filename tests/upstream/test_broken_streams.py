"""What a broken upstream streams is stored as the same text on both stores, and the task
completes: stand-in upstreams (no real server sends these) stream a NUL, bytes that are
not UTF-8, a byte-order mark, a count too long to convert, and a usage that reports no
output tokens past the task's limit. Each used to fail or wedge every attempt, or to
lose or keep text it should not have."""

from __future__ import annotations

from collections.abc import Callable

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.tasks import get_response
from tests.scheduler.helpers import output_text, streamed_text
from tests.store.helpers import task_row
from tests.upstream.scripted import USAGE, Scripted, delta
from tests.upstream.test_errors import finished_behind

DONE = b"data: [DONE]\n\n"


def raw_delta(content: bytes, usage: bytes = b"") -> bytes:
    """A delta chunk whose content is written as these bytes, escapes and all."""
    return (b'data: {"choices": [{"index": 0, "delta": {"content": "' + content
            + b'"}, "finish_reason": null}]' + usage + b"}\n\n")


def completed(db: Database, settings: Settings, server: Scripted) -> tuple[str, str]:
    """A task of at most four tokens that `server` streamed for, which must complete in
    its first attempt, streamed as stored: its id and its output."""
    task_id = finished_behind(db, settings, server)
    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert output_text(db, task_id) == streamed_text(db, task_id)
    return task_id, output_text(db, task_id)


def test_a_nul_is_stored_as_a_replacement(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """PostgreSQL's text holds no NUL: every attempt's write was refused, and the task sat
    leased until its lease ran out, then again until dead-lettered (SQLite stored it)."""
    server = scripted([delta("One "), raw_delta(b"nul\\u0000byte"), delta("", "stop"), USAGE,
                       DONE], pause=0.01)
    assert completed(db, quick, server)[1] == "One nul\ufffdbyte"


def test_bytes_that_are_not_utf8_are_stored_as_replacements(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """They broke the stream on every attempt; the text before them was lost."""
    server = scripted([delta("One "), raw_delta(b"bad \xff\xfe bytes \xe2\x82"),
                       delta("", "stop"), USAGE, DONE], pause=0.01)
    assert completed(db, quick, server)[1] == "One bad \ufffd\ufffd bytes \ufffd"


def test_a_byte_order_mark_before_the_first_chunk_is_dropped(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """The SSE standard drops one there; the line behind it was skipped as no `data:`
    line, and the task completed without its first delta."""
    server = scripted([b"\xef\xbb\xbf" + delta("FIRST"), delta(" second"), delta("", "stop"),
                       USAGE, DONE], pause=0.01)
    assert completed(db, quick, server)[1] == "FIRST second"


def test_a_usage_count_too_long_to_convert_counts_as_not_reported(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """Python refuses to convert an integer of 5,000 digits: the chunk broke the stream,
    and the task was dead-lettered although its text had finished. The chunk's input
    count, which could be read, was then dropped with it."""
    usage = (b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": '
             + b"9" * 5000 + b"}}\n\n")
    server = scripted([delta("One"), delta("", "stop"), usage, DONE], pause=0.01)

    task_id, text = completed(db, quick, server)
    assert text == "One"
    response = get_response(db, task_id, None)
    assert response.output_tokens == 1  # one delta, one token
    assert response.input_tokens == 5  # the chunk's count that could be read is kept


def test_a_usage_of_no_output_tokens_does_not_lift_the_limit(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """A usage reporting 0 output tokens in every chunk kept the count at 0, and thirty
    deltas were stored for a limit of four. A text delta holds at least one token."""
    no_tokens = b', "usage": {"prompt_tokens": 5, "completion_tokens": 0}'
    server = scripted([raw_delta(b" w%d" % i, no_tokens) for i in range(30)]
                      + [delta("", "stop"), DONE], pause=0.005)

    task_id, text = completed(db, quick, server)
    assert text == " w0 w1 w2 w3"
    assert get_response(db, task_id, None).output_tokens == 4

