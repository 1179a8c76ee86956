"""Idempotency keys (docs/http-api.md): key syntax and the request digest.

The record itself is written by `core.store.idempotency_records`, in the transaction
that creates what it answers, so a crash can never leave one without the other.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidInput

_KEY = re.compile(r"^[\x20-\x7e]{1,255}$")


@dataclass(frozen=True)
class IdempotencyClaim:
    """A key presented with a request, and the digest of that request."""

    key: str
    digest: str

    @classmethod
    def of(cls, header: str, method: str, path: str, body: Any) -> IdempotencyClaim:
        """The claim of a request that sent `header` as its `Idempotency-Key`
        (`invalid_idempotency_key` when it is not one)."""
        return cls(parse_key(header), request_digest(method, path, body))


def parse_key(header: str) -> str:
    """The key from an `Idempotency-Key` header: bare, or a quoted sf-string."""
    value = header.strip()
    if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        value = re.sub(r"\\([\\\"])", r"\1", value[1:-1])
    if not _KEY.match(value):
        raise InvalidInput(
            "invalid_idempotency_key", "Idempotency-Key must be 1..255 printable ASCII characters"
        )
    return value


def request_digest(method: str, path: str, body: Any) -> str:
    """SHA-256 over method, path and the canonical JSON of the body.

    Equal numbers are one value however they are written (`1`, `1.0`, `1e0`), so a
    retry that spells one differently still replays. A body without an integral float
    keeps the digest it always had, so stored keys replay across an upgrade."""
    canonical = json.dumps(_integral_floats_as_ints(body), sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{method.upper()}\n{path}\n{canonical}".encode()).hexdigest()


def _integral_floats_as_ints(value: Any) -> Any:
    """`value` with every float that holds a whole number (`1.0`, `-0.0`) made an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    return value
