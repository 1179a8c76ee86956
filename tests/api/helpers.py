"""Builders shared by the API tests: callers with tokens, a test model, a stand-in worker.

The worker side is driven through the real store (`core.store.claims`), the same
functions the sweeper calls, so the API is tested against real task lives without
waiting on a sweeper process.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from litestar.testing import TestClient

from core.engines.base import Usage
from core.models_registry import register
from core.objects import item_id
from core.store import claims, completion, worker_writes
from core.store.clients import create_client
from core.store.database import Database
from core.store.transitions import Event

MODEL_FILE = "words.bin"


def register_test_model(db: Database, models_dir: Path, model_id: str = "words") -> str:
    """A registered model backed by the deterministic test engine of `tests.engines`."""
    models_dir.mkdir(parents=True, exist_ok=True)
    (models_dir / MODEL_FILE).write_bytes(b"test.words model file\n")
    register(db, models_dir, MODEL_FILE, model_id=model_id, engine="test.words")
    return model_id


class Caller:
    """A TestClient speaking as one client: every call carries its bearer token."""

    def __init__(self, http: TestClient[Any], token: str, client_id: str) -> None:
        self.http = http
        self.token = token
        self.id = client_id
        self.auth = {"Authorization": f"Bearer {token}"}

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.http, method)

        def with_token(*args: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
            return call(*args, headers={**self.auth, **(headers or {})}, **kwargs)

        return with_token


def caller(db: Database, http: TestClient[Any], *scopes: str) -> Caller:
    issued = create_client(db, name="test", scopes=frozenset(scopes))
    return Caller(http, issued.token, issued.client_id)


def output_events(task_id: str, text: str) -> list[Event]:
    """Item/part opening events and one delta, shaped as the worker writes them."""
    ids = {"item_id": item_id(task_id), "output_index": 0}
    return [
        Event("response.output_item.added", {"output_index": 0}),
        Event("response.content_part.added", {**ids, "content_index": 0}),
        Event("response.output_text.delta", {**ids, "content_index": 0, "delta": text}),
    ]


def closing_events(task_id: str, text: str) -> list[Event]:
    ids = {"item_id": item_id(task_id), "output_index": 0}
    return [
        Event("response.output_text.done", {**ids, "content_index": 0, "text": text}),
        Event("response.content_part.done", {**ids, "content_index": 0}),
        Event("response.output_item.done", {"output_index": 0}),
    ]


def start_due(db: Database) -> list[claims.Claim]:
    """Claim every due task and move it to `running`, as a worker would."""
    taken = claims.claim(db, limit=1000, lease_ms=60_000, node_id="test-worker")
    for claim in taken:
        worker_writes.start_running(db, claim.task_id, claim.owner_token)
    return taken


def finish(db: Database, claim: claims.Claim, text: str = "w0 w1 w2 ") -> None:
    """Write the output of a running task and complete it."""
    worker_writes.append_output(db, claim.task_id, claim.owner_token,
                                output_events(claim.task_id, text), text=text,
                                snapshot_json=json.dumps({"pos": 3}), usage=Usage(3, 3))
    completion.complete(db, claim.task_id, claim.owner_token, closing_events(claim.task_id, text),
                        usage=Usage(3, 3))


def complete_due(db: Database, text: str = "w0 w1 w2 ") -> list[str]:
    """Run every due task to completion; the ids of those completed."""
    taken = start_due(db)
    for claim in taken:
        finish(db, claim, text)
    return [claim.task_id for claim in taken]


_COMPLETE_SOON_WITHIN = 30.0


def complete_soon(db: Database, after: float = 0.3) -> threading.Thread:
    """A worker that, from `after` seconds from now, completes the due tasks once there
    are any: on a loaded machine the request that creates the task can come later than
    that, and a worker that found nothing then left the request waiting forever. It
    gives up after `_COMPLETE_SOON_WITHIN` seconds, so that its thread does not outlive
    a test whose request created no task."""
    def work() -> None:
        time.sleep(after)
        deadline = time.monotonic() + _COMPLETE_SOON_WITHIN
        while not complete_due(db) and time.monotonic() < deadline:
            time.sleep(0.02)

    worker = threading.Thread(target=work)
    worker.start()
    return worker
