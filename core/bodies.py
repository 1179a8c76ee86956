"""What every JSON body shares: strict types, and field names safe to repeat in errors.

A body model derives from `StrictBody`; an error that names a field goes through
`field_path`, because a field name can be chosen by the client (an unknown key, a
`metadata` key) and a problem document must not echo arbitrary text back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

MAX_FIELD_CHARS = 64
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
