"""What every JSON body shares, through the API and the CLI alike: strict types, a
nesting limit, names free of control characters, and field names safe to repeat in
errors.

A body model derives from `StrictBody`; an error that names a field goes through
`field_path`, because a field name can be chosen by the client (an unknown key, a
`metadata` key) and a problem document must not echo arbitrary text back.

msgspec recurses per level and raises `RecursionError` (not a decode error) around a
thousand levels deep; pydantic and `json.dumps` would recurse again further on. No
body we accept is more than a handful of levels deep, so `decode_json` refuses
anything deeper than `MAX_JSON_DEPTH` (`json_too_deep`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict

from core.errors import DomainError

MAX_FIELD_CHARS = 64
MAX_JSON_DEPTH = 64
# A name or a path shown to operators: no C0 or C1 control character (`\x9b` starts a
# terminal's escape sequence as `\x1b[` does).
NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]+$"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\[\]:-]")


class StrictBody(BaseModel):
    """A JSON body as clients send it: unknown fields refused, JSON types strict.

    `"5"` is not an integer and `"yes"` is not a boolean (pydantic's lax mode would take
    both). Fields whose JSON form is a string by nature (enums, dates) opt out with
    `Strict(False)`, which still accepts only their own string forms."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def field_path(parts: Iterable[object]) -> str:
    """`request.metadata.key` from a validation error's location, bounded and reduced
    to harmless characters (others become `?`), so it can be shown as it is."""
    text = ".".join(str(part) for part in parts)
    safe = _UNSAFE.sub("?", text)
    return safe if len(safe) <= MAX_FIELD_CHARS else safe[:MAX_FIELD_CHARS - 1] + "…"


def decode_json(body: bytes) -> Any:
    """`body` decoded, or `json_too_deep` / `malformed_json` (both 400)."""
    try:
        value = msgspec.json.decode(body)
    except RecursionError:
        raise _too_deep() from None
    except msgspec.DecodeError:
        raise DomainError("malformed_json", "the request body is not valid JSON") from None
    if _depth_exceeds(value, MAX_JSON_DEPTH):
        raise _too_deep()
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` deep; iterative, so it cannot overflow."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in children
                         if isinstance(child, dict | list))
    return False


def _too_deep() -> DomainError:
    return DomainError("json_too_deep",
                       f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
