"""Operator console sessions: an admin token exchanged once for a browser session.

The browser holds a random session secret (in an HttpOnly cookie); the store holds
only its hash, the client it belongs to and when it expires
(`core.store.console_sessions`). The admin token itself is checked at login and then
forgotten, so it never reaches a page, a URL or the browser's storage. Every use of a
session re-reads its client, so a revoked client, or one that lost `admin`, has no
session from its next request on; logging out deletes the row, so a copied cookie dies
with it.

The CSRF token of a session is derived from its secret (HMAC), so forms carry a value
that proves the page came from us without the session secret ever being put in a page.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from core.clients import Client

SECRET_BYTES = 32
MAX_SECRET_LENGTH = 128  # a presented cookie longer than any secret we make is refused unread


@dataclass(frozen=True)
class ConsoleSession:
    """A live session: who is logged in, and the CSRF token their forms must carry."""

    client: Client
    csrf_token: str

    def accepts(self, presented: str) -> bool:
        """Constant-time check of a form's CSRF token against this session's."""
        return hmac.compare_digest(self.csrf_token.encode(), presented.encode())


def csrf_token_of(secret: str) -> str:
    return hmac.new(secret.encode(), b"taskward console csrf", hashlib.sha256).hexdigest()


def plausible_secret(secret: str | None) -> bool:
    """Whether `secret` could be one we made, before it is hashed and looked up."""
    return bool(secret) and len(secret or "") <= MAX_SECRET_LENGTH
