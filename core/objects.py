"""The public shapes of docs/http-api.md: task, response, event and model objects.

Built here, not in handlers, because events embed the response object, idempotency
records store it, and the sweeper's events must agree with what the API shows.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row

from core.clock import iso
from core.states import PUBLIC_STATUS, TERMINAL, Status

if TYPE_CHECKING:
    from core.store.database import LoggedEvent

# A task or response as the store gives it: a row read back, or the namespace
# `core.store.new_tasks` builds for a task it has just inserted without reading it.
Record = Row[Any] | SimpleNamespace

LIFECYCLE_STATUS: dict[str, Status] = {
    "response.created": Status.QUEUED,
    "response.queued": Status.QUEUED,
    "response.loading": Status.LOADING,
    "response.in_progress": Status.RUNNING,
    "response.cancelling": Status.CANCELLING,
    "response.completed": Status.COMPLETED,
    "response.failed": Status.FAILED,
    "response.cancelled": Status.CANCELLED,
}
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.cancelled"}
)


def item_id(task_id: str) -> str:
    """The id of a task's one output message, derived so events and objects agree."""
    return "msg_" + task_id.split("_", 1)[-1]


def error_of(row: Record) -> dict[str, str] | None:
    if row.error_code is None:
        return None
    return {"code": row.error_code, "message": row.error_message or ""}


def task_object(task: Record) -> dict[str, Any]:
    base = f"/v1/tasks/{task.id}"
    return {
        "id": task.id,
        "object": "task",
        "status": task.status,
        "model": task.model,
        "client_id": task.client_id,
        "created_at": iso(task.created_at),
        "updated_at": iso(task.updated_at),
        "run_at": iso(task.run_at),
        "started_at": iso(task.started_at),
        "finished_at": iso(task.finished_at),
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "on_restart": task.on_restart,
        "dedupe_key": task.dedupe_key,
        "priority": task.priority,
        "error": error_of(task),
        "dead_lettered": bool(task.dead_lettered),
        "last_seq": task.last_seq,
        "metadata": json.loads(task.metadata_json),
        "links": {
            "self": base,
            "events": f"{base}/events",
            "cancel": f"{base}/cancel",
            "response": f"/v1/responses/{task.id}",
        },
    }


def message_item(task_id: str, text: str, *, done: bool) -> dict[str, Any]:
    return {
        "id": item_id(task_id),
        "type": "message",
        "role": "assistant",
        "status": "completed" if done else "in_progress",
        "content": [output_text_part(text)] if text or done else [],
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def response_object(
    task: Record,
    response: Record | None,
    *,
    status: Status | None = None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The OpenAI-shaped response object of a task, as it is now or as of `status`.

    Output is shown once a task is terminal (or for the current state when the text so
    far is wanted): non-terminal lifecycle events carry an empty output, as OpenAI's do.
    A completed task always shows its message, empty text included: its log opened and
    closed that item, and clients match the final object against the items they saw.
    """
    current = Status(task.status) if status is None else status
    request = json.loads(task.request_json)
    text = response.output_text if response is not None else ""
    show_output = (bool(text) or current is Status.COMPLETED) and (
        status is None or current in TERMINAL)
    in_tokens = response.input_tokens if response is not None else 0
    out_tokens = response.output_tokens if response is not None else 0
    return {
        "id": task.id,
        "object": "response",
        "created_at": task.created_at // 1000,
        "status": PUBLIC_STATUS[current],
        "background": request.get("background", True),
        "model": task.model,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        # Not OpenAI's: the seed every attempt samples with, drawn at creation when the
        # request named none; sent back with the same request, it gives the same text
        # (when the task runs alone: docs/operations.md, "Sampling").
        "seed": request.get("seed"),
        "output": [_final_message(task.id, text, current)] if show_output else [],
        "parallel_tool_calls": False,
        "service_tier": request.get("service_tier"),  # `priority`'s alias, echoed as sent
        "tool_choice": "none",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": in_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": in_tokens + out_tokens,
        }
        if current in TERMINAL or (status is None and out_tokens)
        else None,
        "error": error if error is not None else (error_of(task) if current in TERMINAL else None),
        "incomplete_details": None,
        "metadata": json.loads(task.metadata_json),
    }


def _final_message(task_id: str, text: str, status: Status) -> dict[str, Any]:
    """The message as a response object shows it; cut short by a failure or a cancel,
    it is `incomplete`, as OpenAI marks such output."""
    item = message_item(task_id, text, done=status in TERMINAL)
    if status in (Status.FAILED, Status.CANCELLED):
        item["status"] = "incomplete"
    return item


def event_object(
    task: Record | None, response: Record | None, event: Row[Any] | LoggedEvent
) -> dict[str, Any]:
    """`{seq, type, created_at, data}`; `data` is the event JSON clients stream. Only a
    lifecycle event (`LIFECYCLE_STATUS`) embeds the response object, so the others
    need no task (None): a stream builds them from the rows its process just logged.
    Before the end, that object shows the event's status and what the task was created
    with, never its output, usage or current state, so any record of the task will do
    and `response` may be None; a terminal event's shows the final output and usage,
    so it needs the response as stored.

    Shaped for OpenAI's SDKs, which parse `data` into their typed events:
    - an event's `error` (the failure of `response.failed`, the cause of a retry's
      `response.queued`) is shown as `response.error`, where OpenAI puts it, and never
      at the top level: the Python SDK takes any streamed data with a top-level `error`
      for a broken stream and raises, which would end a stream the task outlives;
    - text deltas and `response.output_text.done` carry `logprobs` (none), which the
      SDK's stream helper reads;
    - `instructions` (up to 200,000 characters) ride only in `response.created`: every
      later lifecycle event shows `null` there (the SDK's type allows it), so a log of
      twenty events does not repeat them twenty times; `GET /v1/responses/{id}` shows
      them whenever they are wanted.
    """
    data: dict[str, Any] = {"type": event.type, "sequence_number": event.seq}
    own = json.loads(event.data)
    error = own.pop("error", None)
    status = LIFECYCLE_STATUS.get(event.type)
    if status is not None:
        if task is None or (response is None and status in TERMINAL):
            raise ValueError(f"a {event.type} event embeds the response as stored")
        data["response"] = response_object(task, response, status=status, error=error)
        if event.type != "response.created":
            data["response"]["instructions"] = None
    if event.type in _WITH_LOGPROBS:
        data["logprobs"] = []
    data.update(own)
    return {"seq": event.seq, "type": event.type, "created_at": iso(event.created_at), "data": data}


_WITH_LOGPROBS = frozenset({"response.output_text.delta", "response.output_text.done"})


def deleted_object(task_id: str) -> dict[str, Any]:
    """What `DELETE /v1/responses/{id}` answers (OpenAI's deletion object)."""
    return {"id": task_id, "object": "response.deleted", "deleted": True}


def model_object(model: Row[Any]) -> dict[str, Any]:
    """A file entry shows its path and digest; an upstream entry its servers (the name of
    the key's variable, never a key) with path, size and digest null. `created` (epoch
    seconds) and `owned_by` are the fields OpenAI's model object requires, so its SDKs
    and the tools built on them read an entry as one."""
    upstream = None
    if model.upstream_json is not None:
        upstream = {**json.loads(model.upstream_json), "max_concurrency": model.max_concurrency}
    return {
        "id": model.id,
        "object": "model",
        "engine": model.engine,
        "path": model.path,
        "size_bytes": model.size_bytes,
        "sha256": model.sha256,
        "created_at": iso(model.created_at),
        "created": model.created_at // 1000,
        "owned_by": "taskward",
        "metadata": json.loads(model.metadata_json),
        "upstream": upstream,
    }
