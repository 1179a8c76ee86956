"""A stand-in worker that writes what the real one writes.

It drives the worker's own `scheduler.output.Output` (item, part, delta and done events
with their `item`/`part` payloads) through the real store functions, so the SDK reads
the same event shapes it reads from a sweeper, without a sweeper process.
"""

from __future__ import annotations

from core.engines.base import Chunk, Usage
from core.store import claims, completion, worker_writes
from core.store.database import Database
from scheduler.output import Output


def claim_one(db: Database) -> claims.Claim:
    """Claim the oldest due task and move it to `running`."""
    [claim] = claims.claim(db, limit=1, lease_ms=60_000, node_id="test-worker")
    worker_writes.start_running(db, claim.task_id, claim.owner_token)
    return claim


def write_attempt(db: Database, claim: claims.Claim, words: int, *, finish: bool) -> None:
    """`w0 … w{words-1}` as one flush of the worker's output, then, with `finish`, the
    closing events and `response.completed`."""
    output = Output(claim, interval_ms=0, max_bytes=1, now_ms=0)
    for pos in range(words):
        output.add(Chunk(f"w{pos} ", {"pos": pos + 1}, Usage(3, pos + 1)), 0)
    flush = output.take_flush()
    assert flush is not None
    worker_writes.append_output(db, claim.task_id, claim.owner_token, flush.events, text=flush.text,
                                snapshot_json=flush.snapshot_json, usage=flush.usage)
    if finish:
        events, text = output.take_closing()
        completion.complete(db, claim.task_id, claim.owner_token, events, usage=output.usage,
                            text=text)


def complete_one(db: Database, words: int = 3) -> str:
    """Run the oldest due task to completion; its id."""
    claim = claim_one(db)
    write_attempt(db, claim, words, finish=True)
    return claim.task_id
