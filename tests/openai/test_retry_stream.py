"""A retried response as the SDK's stream helper reads it (`responses.stream`).

A retry starts its output over. The helper keys output items by `output_index` and
refuses a second `response.output_item.added` for an index it has seen ("Duplicate
response output index"), so the stream this service promises is: each attempt that
opens output opens it at the next free index (0, 1, …: the number of items opened
before it in the log; a resumed attempt continues its item and opens none), with the
same item id, since the response still has one message and the final object lists only
the last one. The abandoned item is left open: closing it would bind its id to the old
index, and the helper then refuses that id done at the new one. It accepts the open item
at `response.completed` because the final output holds an item with its identity.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from litestar.testing import TestClient
from openai.types.responses import ResponseTextDeltaEvent

from core.engines.base import Usage
from core.objects import item_id, message_item, output_text_part
from core.store import claims, completion, worker_writes
from core.store.database import Database
from core.store.transitions import Event
from tests.api.helpers import Caller
from tests.openai.in_process import sdk_over
from tests.openai.worker import claim_one, write_attempt


def opening(task_id: str, index: int) -> list[Event]:
    ids = {"item_id": item_id(task_id), "output_index": index, "content_index": 0}
    return [Event("response.output_item.added", {
                "output_index": index, "item": message_item(task_id, "", done=False)}),
            Event("response.content_part.added", {**ids, "part": output_text_part("")})]


def delta(task_id: str, index: int, text: str) -> list[Event]:
    return [Event("response.output_text.delta", {
        "item_id": item_id(task_id), "output_index": index, "content_index": 0, "delta": text})]


def closing(task_id: str, index: int, text: str) -> list[Event]:
    ids = {"item_id": item_id(task_id), "output_index": index, "content_index": 0}
    return [Event("response.output_text.done", {**ids, "text": text}),
            Event("response.content_part.done", {**ids, "part": output_text_part(text)}),
            Event("response.output_item.done", {
                "output_index": index, "item": message_item(task_id, text, done=True)})]


def retry(db: Database, claim: claims.Claim) -> None:
    assert worker_writes.requeue(db, claim.task_id, claim.owner_token, delay_ms=0,
                                 code="engine_error", message="injected failure")


def read_with_helper(alice: Caller, http: TestClient[Any], task_id: str) -> tuple[
        dict[int, str], Any]:
    """The text deltas per output index and the final response, as the helper gives them."""
    texts: dict[int, str] = defaultdict(str)
    with sdk_over(http, alice.token).responses.stream(response_id=task_id) as stream:
        for event in stream:
            if isinstance(event, ResponseTextDeltaEvent):
                texts[event.output_index] += event.delta
        return dict(texts), stream.get_final_response()


def create(alice: Caller, model_id: str) -> str:
    body = {"model": model_id, "input": "words=3", "max_attempts": 3}
    return str(alice.post("/v1/responses", json=body).json()["id"])


def test_a_retry_that_opens_its_message_at_the_next_index_streams_through_the_helper(
    alice: Caller, http: TestClient[Any], model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    first = claim_one(db)
    worker_writes.append_output(db, task_id, first.owner_token,
                                opening(task_id, 0) + delta(task_id, 0, "w0 "), text="w0 ",
                                snapshot_json=json.dumps({"pos": 1}), usage=Usage(3, 1))
    retry(db, first)
    second = claim_one(db)
    worker_writes.append_output(db, task_id, second.owner_token,
                                opening(task_id, 1) + delta(task_id, 1, "w0 w1 "), text="w0 w1 ",
                                snapshot_json=json.dumps({"pos": 2}), usage=Usage(3, 2))
    completion.complete(db, task_id, second.owner_token,
                        delta(task_id, 1, "w2 ") + closing(task_id, 1, "w0 w1 w2 "),
                        usage=Usage(3, 3), text="w2 ")

    texts, final = read_with_helper(alice, http, task_id)

    assert texts == {0: "w0 ", 1: "w0 w1 w2 "}
    assert (final.status, final.output_text) == ("completed", "w0 w1 w2 ")
    assert [item.id for item in final.output] == [item_id(task_id)]


def test_the_worker_opens_a_retrys_message_at_the_next_index(
    alice: Caller, http: TestClient[Any], model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    first = claim_one(db)
    write_attempt(db, first, 1, finish=False)
    retry(db, first)
    write_attempt(db, claim_one(db), 3, finish=True)

    texts, final = read_with_helper(alice, http, task_id)

    assert texts == {0: "w0 ", 1: "w0 w1 w2 "}
    assert (final.status, final.output_text) == ("completed", "w0 w1 w2 ")
