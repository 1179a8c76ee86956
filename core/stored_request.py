"""The engine's view of a stored `POST /v1/responses` body, read without pydantic.

A task's body was validated at the door (`core.requests.ResponseRequest`) and stored as
that model wrote it, so an attempt need not validate it again: it only reads the fields
an engine uses, checking their JSON types. Kept apart from `core.requests` so that a
sweeper's attempts never import pydantic and its request models: on a 2-core machine
that import is ~90-180 ms of CPU after a sweeper's first claim (issue 15).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from core.engines.base import GenerationRequest

Role = Literal["system", "developer", "user", "assistant"]  # also what the API accepts


class _Part(msgspec.Struct):
    text: str


class _Message(msgspec.Struct):
    role: Role
    content: str | list[_Part]


class _Stored(msgspec.Struct):
    """The fields an engine reads; the others (model, metadata, ...) are skipped."""

    input: str | list[_Message]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


_decoder = msgspec.json.Decoder(_Stored)


def generation_request(stored_json: str) -> GenerationRequest:
    """The engine's request from a task's stored JSON; raises `ValueError` (msgspec's
    errors derive from it) on a body it cannot read."""
    stored = _decoder.decode(stored_json)
    messages: list[dict[str, str]] = []
    if stored.instructions:
        messages.append({"role": "system", "content": stored.instructions})
    if isinstance(stored.input, str):
        messages.append({"role": "user", "content": stored.input})
    elif not stored.input:
        raise ValueError("the stored input holds no message")
    else:
        for message in stored.input:
            role = "system" if message.role == "developer" else message.role
            content = message.content
            text = content if isinstance(content, str) else "".join(p.text for p in content)
            messages.append({"role": role, "content": text})
    return GenerationRequest(messages=messages, max_output_tokens=stored.max_output_tokens,
                             temperature=stored.temperature, top_p=stored.top_p,
                             seed=stored.seed)
