"""When an attempt's output is due for a flush: pending text waits at most the flush
interval from its arrival (the first text of an attempt `FIRST_FLUSH_MS`), so text that
arrives before then rides in the same delta."""

from __future__ import annotations

from core.engines.base import Chunk, Usage
from core.store.claims import Claim
from scheduler.output import FIRST_FLUSH_MS, Output

INTERVAL = 100


def output(*, max_bytes: int = 10_000) -> Output:
    claim = Claim(task_id="resp_1", owner_token="owner", attempt=1, resumed=False, model="m",
                  request_json="{}", snapshot_json=None, output_text="", usage=Usage())
    return Output(claim, interval_ms=INTERVAL, max_bytes=max_bytes, now_ms=0)


def chunk(text: str) -> Chunk:
    return Chunk(text, {"text": text}, Usage(1, 1))


def test_the_first_text_is_due_soon_after_it_arrives() -> None:
    out = output()
    assert out.ms_until_due(500) is None  # nothing waiting
    out.add(chunk("a"), 500)
    assert not out.flush_due(500 + FIRST_FLUSH_MS - 1)
    assert out.flush_due(500 + FIRST_FLUSH_MS)


def test_later_text_waits_the_interval_from_its_own_arrival() -> None:
    out = output()
    out.add(chunk("a"), 0)
    assert out.take_flush() is not None
    out.add(chunk("b"), 30)  # the first text after a flush starts the clock
    out.add(chunk("c"), 90)
    assert out.ms_until_due(90) == 30 + INTERVAL - 90
    assert not out.flush_due(30 + INTERVAL - 1)
    assert out.flush_due(30 + INTERVAL)
    flush = out.take_flush()
    assert flush is not None and flush.text == "bc"
    assert [e.data["delta"] for e in flush.events] == ["bc"]


def test_the_size_limit_still_flushes_at_once() -> None:
    out = output(max_bytes=4)
    out.add(chunk("ab"), 0)
    out.add(chunk("cd"), 1)
    assert out.flush_due(1)
