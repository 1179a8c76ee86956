"""The body of `POST /v1/responses`, validated once and reused by schedules, and the
task it asks for.

Strict: unknown fields are refused, every bound is explicit, and nothing here echoes
the prompt back in an error message.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    Discriminator,
    Field,
    Strict,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from core.bodies import NO_CONTROL, StrictBody
from core.clock import parse_time, utc_ms
from core.errors import InvalidInput
from core.ids import sampling_seed
from core.priorities import DEFAULT_PRIORITY, HIGHEST_PRIORITY, LOWEST_PRIORITY, SERVICE_TIERS
from core.settings import Settings
from core.states import OnRestart
from core.store.births import NewTask
from core.stored_request import Role

PrintableAscii = Annotated[
    str, StringConstraints(min_length=1, max_length=255, pattern=r"^[\x20-\x7e]+$")
]
MAX_TEXT = 200_000
_ANSWER_ONLY = {"run_at"}
# OpenAI's fields that can only ask for what taskward does anyway: the values that do, and
# why no other can. OpenAI's SDKs and the frameworks on them send these, often the very
# values a response object shows, so they are taken at these values and ignored.
_ONLY_SUPPORTED: dict[str, tuple[tuple[object, ...], str]] = {
    "store": ((True,), "taskward stores every response"),
    "tools": (([],), "taskward runs no tools"),
    "tool_choice": (("none", "auto"), "taskward runs no tools"),
    # OpenAI's own response objects show `verbosity: "medium"`, its default, beside it.
    "text": (({"format": {"type": "text"}}, {"format": {"type": "text"}, "verbosity": "medium"}),
             "the output is plain text"),
    "truncation": (("disabled",), "an input beyond the model's context fails the task"),
    "include": (([],), "a response has nothing more to include"),
}
# Ignored whatever their value: nothing to parallelise without tools, and OpenAI's id of
# an end user, which taskward neither needs nor keeps.
_NO_OPS = {*_ONLY_SUPPORTED, "parallel_tool_calls", "user"}
_NOT_STORED = _ANSWER_ONLY | _NO_OPS


# `input` and a message's `content` are text or a list. A value is held to the branch of
# its JSON type alone, so a list's fault is named rather than hidden behind "not a
# string"; pydantic names that branch as a step of the fault's location, which
# `_without_branches` takes out again.
_TEXT, _LIST = "text", "list"


def _branch(value: object) -> str | None:
    return _TEXT if isinstance(value, str) else _LIST if isinstance(value, list) else None


_Item = TypeVar("_Item")
_TextOrList = Annotated[
    Annotated[str, Tag(_TEXT), Field(max_length=MAX_TEXT)]
    | Annotated[list[_Item], Tag(_LIST), Field(max_length=MAX_TEXT)],
    Discriminator(_branch, custom_error_type="string_or_list",
                  custom_error_message="Input should be a string or a list")]


def _without_branches(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """A location inside `input` as the client wrote it (`0.content.0.text`), without the
    branch steps (`list.0.content.list.0.text`): `input`'s first, and one after each
    `content`."""
    return tuple(step for at, step in enumerate(loc)
                 if not (step in (_TEXT, _LIST) and (at == 0 or loc[at - 1] == "content")))


# A previous response's output sent back as input, OpenAI's multi-turn pattern
# (`input=[*previous.output, {"role": "user", ...}]`): its message item carries `id`,
# `status` and (from OpenAI's SDK) `phase`, its text part `annotations` and (the SDK)
# `logprobs`. Each is held to the type OpenAI gives it, then left out of the stored
# request: the text is all a model is given of a message.
def _output_only() -> Any:
    return Field(default=None, exclude=True)


class InputText(StrictBody):
    type: Literal["input_text", "output_text", "text"] = "input_text"
    text: str = Field(max_length=MAX_TEXT)
    annotations: list[dict[str, Any]] | None = _output_only()
    logprobs: list[dict[str, Any]] | None = _output_only()


class Message(StrictBody):
    type: Literal["message"] | None = None
    role: Role
    content: _TextOrList[InputText]
    id: str | None = _output_only()
    status: Literal["in_progress", "completed", "incomplete"] | None = _output_only()
    phase: Literal["commentary", "final_answer"] | None = _output_only()


class ResponseRequest(StrictBody):
    model: str = Field(min_length=1, max_length=200)
    input: _TextOrList[Message]
    instructions: str | None = Field(default=None, max_length=MAX_TEXT)
    max_output_tokens: int | None = Field(default=None, ge=1, le=32_768)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    on_restart: Annotated[OnRestart, Strict(False)] = OnRestart.RETRY
    max_attempts: int | None = Field(default=None, ge=1)
    run_at: Annotated[datetime, Strict(False)] | None = None
    metadata: dict[Annotated[str, StringConstraints(max_length=64)],
                   Annotated[str, StringConstraints(max_length=512)]] = Field(
        default_factory=dict, max_length=16
    )
    dedupe_key: PrintableAscii | None = None
    background: bool = True
    stream: bool = False
    priority: int | None = Field(default=None, ge=HIGHEST_PRIORITY, le=LOWEST_PRIORITY,
                                 strict=True, description="0..9, lower runs first (default 5)")
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        default=None, description="OpenAI's name for a priority: priority 1, "
        "default/auto 5, flex 8")
    store: bool | None = None
    tools: list[Any] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[Any] | None = None
    user: Annotated[str, StringConstraints(min_length=1, max_length=256,
                                           pattern=NO_CONTROL)] | None = None

    @field_validator(*_ONLY_SUPPORTED, mode="before")
    @classmethod
    def _only_what_taskward_does(cls, value: object, info: ValidationInfo) -> object:
        """Any other value asks for something taskward cannot do: refused, saying what
        it can. Compared as JSON values, where `1` is not `true`."""
        supported, reason = _ONLY_SUPPORTED[str(info.field_name)]
        if value is None or any(type(value) is type(one) and value == one for one in supported):
            return value
        shown = " or ".join(json.dumps(one) for one in supported)
        raise ValueError(f"only {shown} is supported: {reason}")

    @model_validator(mode="after")
    def _one_priority(self) -> ResponseRequest:
        if (self.priority is not None and self.service_tier is not None
                and SERVICE_TIERS[self.service_tier] != self.priority):
            raise ValueError("priority and service_tier name different priorities")
        return self

    @property
    def effective_priority(self) -> int:
        """`priority`, else the one `service_tier` names, else the default."""
        if self.priority is not None:
            return self.priority
        if self.service_tier is not None:
            return SERVICE_TIERS[self.service_tier]
        return DEFAULT_PRIORITY

    @field_validator("run_at", mode="before")
    @classmethod
    def _rfc3339(cls, value: object) -> object:
        """Text is read by `core.clock.parse_time`, held to RFC 3339, never by pydantic's
        lax datetime: that takes a number, or a string of digits (`"0"`), as Unix seconds
        or milliseconds, and ISO 8601 forms RFC 3339 is not (`+0100`, `10:20Z`). A
        datetime (a caller in Python) is held to the same calendar."""
        if value is None:
            return value
        if isinstance(value, datetime):
            utc_ms(value)  # no offset, or beyond the calendar in UTC: a 422 here
            return value
        if not isinstance(value, str):
            raise ValueError("must be an RFC 3339 time with an offset")
        return parse_time(value)

    @field_validator("input", mode="wrap")
    @classmethod
    def _located_as_sent(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        """Each fault of `input` located by the path the client wrote; its message as
        pydantic wrote it."""
        try:
            return handler(value)
        except ValidationError as exc:
            raise ValidationError.from_exception_data(exc.title, [
                InitErrorDetails(type=PydanticCustomError(error["type"], error["msg"]),
                                 loc=_without_branches(error["loc"]), input=error["input"])
                for error in exc.errors()]) from None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[Message]) -> str | list[Message]:
        if isinstance(value, list) and not value:
            raise ValueError("input needs at least one message")
        return value

    def stored_json(self) -> str:
        """What the task keeps: the body minus the fields that only shape the answer
        and the no-ops, so a request with them is stored as the same one without.

        Written by pydantic's own JSON serializer, not `model_dump` then `json.dumps`:
        a third of the time, once per request (the same JSON; a float may be written
        in another of its forms, `1e-7` for `1e-07`)."""
        return self.__pydantic_serializer__.to_json(
            self, exclude=_NOT_STORED, exclude_none=True).decode()


def new_task(
    request: ResponseRequest,
    *,
    client_id: str,
    settings: Settings,
    above_cap: Literal["refuse", "clamp"] = "refuse",
    schedule_id: str | None = None,
    now_ms: int | None = None,
    max_active: int = 0,
) -> NewTask:
    """The task a validated body asks for, owned by `client_id`.

    `max_attempts` defaults to the configured default and is held to the configured cap:
    a caller asking for more is refused (`"refuse"`, the API: it can fix its request); a
    schedule firing unattended is held to the cap (`"clamp"`: the cap may have been
    lowered since the schedule was accepted, and nobody is there to fix it).

    A request without `seed` is stored with one drawn here, the seed its attempts then
    sample with; each firing of a schedule draws its own.

    `now_ms` is given by the API: a `run_at` at or before it is dropped, so the task is
    due at once like one without `run_at`. Claims take the oldest `run_at` first, and a
    client must not put its task ahead of those already waiting by dating it in the
    past. A schedule gives none: its task keeps its slot's time.

    `max_active` is the client's `max_active_tasks`, checked when the task is stored
    (0: not checked here; a schedule's slots are held to it as they fire,
    `core.schedule_firing`, since nobody is there to retry a refusal).
    """
    attempts = request.max_attempts or settings.max_attempts_default
    if attempts > settings.max_attempts_cap:
        if above_cap == "refuse":
            raise InvalidInput("validation_error",
                               f"max_attempts: must be at most {settings.max_attempts_cap}",
                               extra={"field": "max_attempts"})
        attempts = settings.max_attempts_cap
    if request.seed is None:  # the seed actually used is the stored one: draw it now
        request = request.model_copy(update={"seed": sampling_seed()})
    run_at = None if request.run_at is None else utc_ms(request.run_at)
    if run_at is not None and now_ms is not None and run_at <= now_ms:
        run_at = None
    return NewTask(
        client_id=client_id, model=request.model, request_json=request.stored_json(),
        on_restart=request.on_restart, max_attempts=attempts, run_at=run_at,
        metadata=dict(request.metadata), dedupe_key=request.dedupe_key, schedule_id=schedule_id,
        priority=request.effective_priority, max_active=max_active,
    )
