"""Ids, tokens and secrets, all from OS randomness.

Task ids sort by creation time (millisecond prefix) so cursor pages and "oldest first"
need no extra column; tokens are 32 random bytes, stored only as SHA-256 hashes.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time


def sampling_seed() -> int:
    """A seed for a task whose request names none: stored with it, so the text can be
    made again (docs/operations.md, "Sampling")."""
    return secrets.randbits(32)


_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
_PAIRS = [high + low for high in _ALPHABET for low in _ALPHABET]  # 10 bits -> 2 digits


def _base32(value: int, width: int) -> str:
    """The low `5 * width` bits of `value` as `width` digits, most significant first.

    Two digits per table lookup: every task's id is made here, and a `divmod` per
    digit cost twice as much."""
    pairs = -(-width // 2)
    digits = "".join([_PAIRS[(value >> shift) & 1023]
                      for shift in range(10 * pairs - 10, -10, -10)])
    return digits[2 * pairs - width:]


_last_lock = threading.Lock()
_last: list[int] = [0, 0]  # the (ms, random) part of the last id this process made


def sortable_id(prefix: str, now_ms: int | None = None) -> str:
    """`prefix_` + 10 chars of milliseconds + 16 random chars (80 bits).

    Monotonic within a process (as ULIDs are): an id made in the same millisecond as
    the previous one takes its random part plus one, so creation order is id order and
    "oldest first" holds for tasks created in one burst.
    """
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    with _last_lock:
        if ms <= _last[0] and _last[1] + 1 < 2**80:
            ms, rand = _last[0], _last[1] + 1
        else:
            rand = secrets.randbits(79)  # headroom for increments within one millisecond
        _last[:] = [ms, rand]
    return f"{prefix}_{_base32(ms << 80 | rand, 26)}"


_ID_SHAPE = re.compile(r"[a-z]{1,12}_[0-9a-z]{1,40}")


def could_be_id(text: str) -> bool:
    """Whether `text` has the shape of an id made here; what has not names nothing."""
    return _ID_SHAPE.fullmatch(text) is not None


def random_id(prefix: str) -> str:
    return f"{prefix}_{_base32(secrets.randbits(100), 20)}"


def new_token() -> str:
    """A bearer token: 32 bytes of OS randomness, URL-safe."""
    return "tw_" + secrets.token_urlsafe(32)


def new_owner_token() -> str:
    return secrets.token_hex(16)


def new_secret(nbytes: int = 12) -> str:
    return secrets.token_urlsafe(nbytes)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def same_secret(secret: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented secret with its stored hash."""
    return hmac.compare_digest(hash_secret(secret), stored_hash)
