"""Authenticated tokens of this process, trusted until any client is revoked.

Looking a token up in the store on every request costs a thread hop and a round trip,
more than the rest of a `GET /v1/tasks/{id}` together. The cache keeps each answer,
keyed by the token's hash and tagged with the store's revocation marker
(`core.store.clients.revocations`) read in the same transaction. An entry counts only while
that marker is still the newest one seen, and the marker is re-read at most every
`recheck_seconds` by whichever request finds it stale; the requests that come while
that read is out wait for it rather than trust the entries it may yet outdate (a burst
after an idle minute would otherwise all be answered from a cache a minute old). So a
revocation made by any process is honoured here within `recheck_seconds`, and at once in
the process that made it (`forget`). Unknown and revoked tokens are never cached: they
always ask the store.
"""

from __future__ import annotations

import asyncio
import time

from core.clients import Client
from core.ids import hash_secret
from core.store.clients import Revocations, authenticate, revocations
from core.store.database import Database
from handlers.threads import blocking

_MAX_ENTRIES = 10_000


class TokenCache:
    def __init__(self, db: Database, *, recheck_seconds: float) -> None:
        self._db = db
        self._recheck = recheck_seconds
        self._entries: dict[str, tuple[Client, Revocations]] = {}
        self._newest: Revocations = (-1, -1, -1)
        self._checked_at = float("-inf")
        self._checking = asyncio.Lock()  # one read of the marker at a time

    async def client(self, token: str) -> Client:
        """The active client holding `token`, or `Unauthorized`."""
        if time.monotonic() - self._checked_at >= self._recheck:
            await self._recheck_marker()
        key = hash_secret(token)
        cached = self._entries.get(key)
        if cached is not None and cached[1] == self._newest:
            return cached[0]
        client, marker = await blocking(authenticate, self._db, token)
        self._saw(marker)
        if marker == self._newest:
            if len(self._entries) >= _MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = (client, marker)
        return client

    def forget(self) -> None:
        """Drop every entry: this process has just revoked a client or changed limits."""
        self._entries.clear()
        self._checked_at = float("-inf")

    async def _recheck_marker(self) -> None:
        """Read the revocation marker, unless the read this caller waited for has made it
        fresh (that read began at most its own few milliseconds before the caller came)."""
        async with self._checking:
            began = time.monotonic()
            if began - self._checked_at >= self._recheck:
                self._saw(await blocking(revocations, self._db))
                self._checked_at = began

    def _saw(self, marker: Revocations) -> None:
        self._newest = max(self._newest, marker)

