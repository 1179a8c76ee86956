"""The output of one attempt: chunks batched into delta events, and the item/part events
around them (docs/events.md, OpenAI Responses streaming shapes).

Flushing by time and by size keeps the event log from costing one transaction per
token. Each flush carries the engine's latest snapshot with the text it covers, so a
resumed task continues exactly after what its clients have seen. The item and part are
opened in the same transaction as the first delta: a stored snapshot therefore means
"already opened", which is how a resumed attempt knows not to open them again.

The snapshot is made into JSON here, once per flush: a value JSON has no form for is
written as its `str`, so an engine may hand a large part of it over as a view that is
made into text only then (the upstream engine's text so far: copied at every network
read, it made a fast stream's cost quadratic in its length).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from core.engines.base import Chunk, Usage
from core.objects import item_id, message_item, output_text_part
from core.store.claims import Claim
from core.store.transitions import Event

# An attempt's first text waits this long for more before its write: the time to the
# first delta is what a streaming client notices, and an upstream stream's tokens come
# 25-40 ms apart, so a longer wait only delayed the first one (10 ms was a third of a
# lone upstream stream's cost to its first delta, issue 13). Local engines that finish
# within `scheduler.workers._RUNNER_AFTER_SECONDS` never wait for it: their text rides
# in their completion.
FIRST_FLUSH_MS = 2


@dataclass(frozen=True)
class Flush:
    """What one `append_output` call writes."""

    events: list[Event]
    text: str
    snapshot_json: str
    usage: Usage
    first: bool  # the attempt's first flush (the time to its first delta hangs on it)


class Output:
    def __init__(self, claim: Claim, *, interval_ms: int, max_bytes: int, now_ms: int) -> None:
        self._task_id = claim.task_id
        self._item_id = item_id(claim.task_id)
        self._opened = claim.snapshot_json is not None
        # This attempt's message: a resumed attempt continues the one it opened; any
        # other opens the next index, since a retry starts its output over and OpenAI's
        # stream helper refuses a second item at one index. Same item id: the response
        # has one message, and its final object lists only the last one.
        self._index = max(0, claim.items_opened - 1) if self._opened else claim.items_opened
        self._stored = claim.output_text  # all text in the log so far (resumed: the stored)
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._snapshot: dict[str, object] | None = None
        self.usage = claim.usage
        self._interval_ms = interval_ms
        self._max_bytes = max_bytes
        self._pending_since_ms = now_ms  # when the oldest pending text arrived
        self._flushed = False

    def add(self, chunk: Chunk, now_ms: int) -> None:
        if chunk.text:
            if not self._pending:
                self._pending_since_ms = now_ms
            self._pending.append(chunk.text)
            self._pending_bytes += len(chunk.text.encode())
        self._snapshot = chunk.snapshot
        self.usage = chunk.usage

    def flush_due(self, now_ms: int) -> bool:
        """Text is waiting and either enough of it or enough time has gathered."""
        return self.full() or (bool(self._pending) and self._due_at_ms() <= now_ms)

    def full(self) -> bool:
        """The pending text has reached the flush size."""
        return bool(self._pending) and self._pending_bytes >= self._max_bytes

    def room_bytes(self) -> int | None:
        """How much more text may arrive before a size-based flush; None while nothing
        is pending (then the next text's arrival starts the flush interval)."""
        if not self._pending:
            return None
        return max(1, self._max_bytes - self._pending_bytes)

    def ms_until_due(self, now_ms: int) -> int | None:
        """How long until a time-based flush, None when nothing is waiting."""
        if not self._pending:
            return None
        return max(0, self._due_at_ms() - now_ms)

    def due_at_ms(self) -> int | None:
        """When the pending text is due for a time-based flush, None when none waits."""
        return self._due_at_ms() if self._pending else None

    def _due_at_ms(self) -> int:
        """Pending text waits at most the flush interval from its arrival (docs/events.md),
        the attempt's first text only `FIRST_FLUSH_MS`: the time to the first delta is
        what a streaming client notices, while a task that ends within those
        milliseconds still costs one write. Counting from the oldest pending text rather
        than from the last flush gathers the text arriving until then into the same
        delta: a steady stream flushes every interval plus one gap between its tokens,
        not every interval, and no text waits longer."""
        wait = self._interval_ms if self._flushed else min(FIRST_FLUSH_MS, self._interval_ms)
        return self._pending_since_ms + wait

    def stored_chars(self) -> int:
        """The length of all text in the log so far, as the response's stored output
        holds it once the flushes taken are written (a write's landing shows by it)."""
        return len(self._stored)

    def take_flush(self) -> Flush | None:
        """The pending text as one delta event (opening item/part first if needed)."""
        if not self._pending:
            return None
        first, self._flushed = not self._flushed, True
        opening = self._opening()
        delta, text = self._delta()
        assert self._snapshot is not None  # a chunk with text always brings one
        snapshot_json = json.dumps(self._snapshot, separators=(",", ":"), default=str)
        return Flush(opening + delta, text, snapshot_json, self.usage, first)

    def take_closing(self) -> tuple[list[Event], str]:
        """Pending deltas plus the done events for `complete`, and the text they add."""
        opening = self._opening()
        delta, text = self._delta()
        events = opening + delta
        full = self._stored
        content = {"item_id": self._item_id, "output_index": self._index, "content_index": 0}
        events += [
            Event("response.output_text.done", {**content, "text": full}),
            Event("response.content_part.done", {**content, "part": output_text_part(full)}),
            Event("response.output_item.done", {"output_index": self._index,
                                                "item": message_item(self._task_id, full,
                                                                     done=True)}),
        ]
        return events, text

    def _opening(self) -> list[Event]:
        if self._opened:
            return []
        self._opened = True
        return [
            Event("response.output_item.added", {"output_index": self._index,
                                                 "item": message_item(self._task_id, "",
                                                                      done=False)}),
            Event("response.content_part.added", {
                "item_id": self._item_id, "output_index": self._index, "content_index": 0,
                "part": output_text_part("")}),
        ]

    def _delta(self) -> tuple[list[Event], str]:
        if not self._pending:
            return [], ""
        text = "".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._stored += text
        return [Event("response.output_text.delta", {
            "item_id": self._item_id, "output_index": self._index, "content_index": 0,
            "delta": text})], text

