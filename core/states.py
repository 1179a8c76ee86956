"""The task state machine, written down once as data.

Every store operation that moves a task names its target state and asks this module
which source states it may come from; the allowed sources go into the statement's
`WHERE`, so a forbidden transition changes zero rows instead of corrupting a task.
`docs/state-machine.md` draws the same table.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    QUEUED = "queued"
    LOADING = "loading"
    RUNNING = "running"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class OnRestart(StrEnum):
    FAIL = "fail"
    RETRY = "retry"
    RESUME = "resume"


# The error of a task failed as a dead letter (its attempts spent), whichever claim
# path or store writes it.
DEAD_LETTER_ERROR = {"code": "max_attempts_exceeded", "message": "the task used all its attempts"}
ERROR_MESSAGE_CHARS = 500  # a task's error message is cut to this


def spent_by(code: str, message: str) -> dict[str, str]:
    """`DEAD_LETTER_ERROR` for an attempt that failed retryably with the task's last
    attempt: its cause kept in the message, which an operator looking at the dead letter
    otherwise had to find in an earlier event, or could not find at all (a task of one
    attempt showed only that its attempts were spent)."""
    cause = f"{DEAD_LETTER_ERROR['message']}; the last failed with {code}: {message}"
    return {"code": DEAD_LETTER_ERROR["code"], "message": cause[:ERROR_MESSAGE_CHARS]}


ACTIVE: frozenset[Status] = frozenset(
    {Status.QUEUED, Status.LOADING, Status.RUNNING, Status.CANCELLING}
)
TERMINAL: frozenset[Status] = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
LEASED: frozenset[Status] = frozenset({Status.LOADING, Status.RUNNING, Status.CANCELLING})

# (from, to) pairs. Terminal states have no way out. `running -> running` is the
# resume claim: a new owner takes over a running task from its snapshot.
TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.QUEUED, Status.LOADING),
        (Status.QUEUED, Status.CANCELLED),
        (Status.QUEUED, Status.FAILED),  # dead letter at claim, or recovery under `fail`
        (Status.LOADING, Status.RUNNING),
        (Status.LOADING, Status.QUEUED),  # retry, lease expiry, release, recovery
        (Status.LOADING, Status.CANCELLING),
        (Status.LOADING, Status.FAILED),
        (Status.RUNNING, Status.RUNNING),
        (Status.RUNNING, Status.QUEUED),
        (Status.RUNNING, Status.CANCELLING),
        (Status.RUNNING, Status.COMPLETED),
        (Status.RUNNING, Status.FAILED),
        (Status.CANCELLING, Status.CANCELLED),
    }
)

# Response-object status (docs/http-api.md, OpenAI-compatible surface).
PUBLIC_STATUS: dict[Status, str] = {
    Status.QUEUED: "queued",
    Status.LOADING: "in_progress",
    Status.RUNNING: "in_progress",
    Status.CANCELLING: "in_progress",
    Status.COMPLETED: "completed",
    Status.FAILED: "failed",
    Status.CANCELLED: "cancelled",
}


def is_allowed(source: Status, target: Status) -> bool:
    return (source, target) in TRANSITIONS
