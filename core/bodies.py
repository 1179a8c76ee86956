"""What every JSON body shares, through the API and the CLI alike: strict types, a
nesting limit, names free of control characters, and field names safe to repeat in
errors.

A body model derives from `StrictBody`; an error that names a field goes through
`field_path`, because a field name can be chosen by the client (an unknown key, a
`metadata` key) and a problem document must not echo arbitrary text back.

msgspec recurses per level and raises `RecursionError` (not a decode error) around a
thousand levels deep; pydantic and `json.dumps` would recurse again further on. No
body we accept is more than a handful of levels deep, so `decode_json` refuses
anything deeper than `MAX_JSON_DEPTH` (`json_too_deep`). The depth is read from the
bytes, not the decoded value: a walk of the value in Python took seconds on a
megabyte of `[[],[],...]`, sent by anyone to `POST /v1/pair`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import accumulate
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict

from core.errors import DomainError

MAX_FIELD_CHARS = 64
MAX_JSON_DEPTH = 64
# The bodies anyone may send, unauthenticated (`POST /v1/pair`, the console's login
# form), are a few hundred bytes: a larger one is refused (413) before it is parsed, so
# a stranger's body costs little CPU whatever it holds.
PUBLIC_BODY_BYTES = 8192
# A name or a path shown to operators: no C0 or C1 control character (`\x9b` starts a
# terminal's escape sequence as `\x1b[` does).
NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]+$"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\[\]:-]")
# A JSON text's brackets as steps of depth: +1 for an opening one, -1 (a signed byte)
# for a closing one; every other byte is deleted.
_DEPTH_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


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
    if _nesting_depth(body) > MAX_JSON_DEPTH:
        raise _too_deep()
    return value


def _nesting_depth(valid_json: bytes) -> int:
    """How deep the containers of a valid JSON text nest, from its bytes: escapes of
    `\\` and `"` dropped, what is inside strings dropped, then the deepest running
    sum of the brackets' steps. Each stage is one pass in C (about 20 ms a megabyte
    whatever the shape), so no body costs a Python step per container."""
    unescaped = valid_json.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside_strings = b"".join(unescaped.split(b'"')[::2])
    steps = memoryview(outside_strings.translate(_DEPTH_STEPS, _NOT_BRACKETS)).cast("b")
    return max(accumulate(steps), default=0)


def _too_deep() -> DomainError:
    return DomainError("json_too_deep",
                       f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
