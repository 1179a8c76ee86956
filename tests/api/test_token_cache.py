"""The API process's token cache (`handlers.tokens`) honours a revocation or a change
of limits made by another process within its recheck interval, however many requests
arrive at once after the process sat idle. Both stores."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.clients import Client
from core.errors import Unauthorized
from core.store.clients import create_client, revocations, revoke, set_limits
from core.store.database import Database
from handlers import tokens as tokens_module
from handlers.tokens import TokenCache

RECHECK_SECONDS = 0.05
BURST = 20


def _burst(cache: TokenCache, token: str) -> list[Client | BaseException]:
    """`BURST` requests' lookups of `token`, all at once on one event loop, once the
    cache has been idle longer than its recheck interval."""

    async def lookups() -> list[Client | BaseException]:
        return await asyncio.gather(*(cache.client(token) for _ in range(BURST)),
                                    return_exceptions=True)

    return asyncio.run(lookups())


def _cached(db: Database, token: str) -> TokenCache:
    cache = TokenCache(db, recheck_seconds=RECHECK_SECONDS)
    asyncio.run(cache.client(token))
    return cache


def test_a_burst_after_a_revocation_elsewhere_is_refused_whole(db: Database) -> None:
    """Before: the first request of the burst re-read the marker while the others were
    answered from the entry that read was about to outdate."""
    issued = create_client(db, name="burst", scopes=frozenset({"responses:write"}))
    cache = _cached(db, issued.token)
    revoke(db, issued.client_id)  # as another API process does: this cache is not told
    time.sleep(RECHECK_SECONDS * 2)
    answers = _burst(cache, issued.token)
    assert all(isinstance(answer, Unauthorized) for answer in answers), answers


def test_a_burst_after_limits_changed_elsewhere_sees_the_new_limits(db: Database) -> None:
    issued = create_client(db, name="limited", scopes=frozenset({"responses:write"}))
    cache = _cached(db, issued.token)
    set_limits(db, issued.client_id, {"max_active_tasks": 1})
    time.sleep(RECHECK_SECONDS * 2)
    answers = _burst(cache, issued.token)
    assert [a.limits.max_active_tasks for a in answers if isinstance(a, Client)] == [1] * BURST


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the store is not the point
def test_a_fresh_marker_is_read_once_for_the_whole_burst(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    issued = create_client(db, name="quiet", scopes=frozenset({"responses:write"}))
    cache = _cached(db, issued.token)
    reads: list[float] = []

    def counted(database: Database) -> object:
        reads.append(time.monotonic())
        return revocations(database)

    monkeypatch.setattr(tokens_module, "revocations", counted)
    time.sleep(RECHECK_SECONDS * 2)
    assert all(isinstance(answer, Client) for answer in _burst(cache, issued.token))
    assert len(reads) == 1
