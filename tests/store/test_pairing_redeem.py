"""Redeeming a pairing code, on both stores: a code that is not live is refused after a
read alone (anyone may try codes, and a flood of made-up ones must not queue on
SQLite's write lock), while a live code still redeems exactly once under concurrency
and burns after five wrong secrets."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from sqlalchemy import Connection

from core.clients import MAX_PAIRING_FAILURES, IssuedToken
from core.errors import Unauthorized
from core.store.clients import create_pairing_code, redeem_pairing_code
from core.store.database import Database

SCOPES = frozenset({"tasks:read"})
UNKNOWN = "pc_aaaaaaaaaaaaaaaaaaaa-guessedsecret"


@pytest.fixture
def writes(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per write transaction `db` opens from now on."""
    opened: list[int] = []
    write: Callable[[], AbstractContextManager[Connection]] = db.write

    def counted() -> AbstractContextManager[Connection]:
        opened.append(1)
        return write()

    monkeypatch.setattr(db, "write", counted)
    return opened


def refused(db: Database, code: str) -> bool:
    try:
        redeem_pairing_code(db, code)
    except Unauthorized as exc:
        assert exc.code == "invalid_pairing_code"
        return True
    return False


def test_an_unknown_code_is_refused_without_a_write(db: Database, writes: list[int]) -> None:
    assert refused(db, UNKNOWN)
    assert writes == []


def test_a_spent_code_is_refused_without_a_write(db: Database, writes: list[int]) -> None:
    code = create_pairing_code(db, scopes=SCOPES, ttl_seconds=60).code
    redeem_pairing_code(db, code)
    writes.clear()
    assert refused(db, code)
    assert writes == []


def test_a_live_code_is_redeemed_in_one_write(db: Database, writes: list[int]) -> None:
    code = create_pairing_code(db, scopes=SCOPES, ttl_seconds=60).code
    writes.clear()
    assert redeem_pairing_code(db, code).scopes == SCOPES
    assert writes == [1]


def run_together(count: int, act: Callable[[int], None]) -> None:
    barrier = threading.Barrier(count)

    def one(n: int) -> None:
        barrier.wait()
        act(n)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


def test_a_code_redeems_once_among_concurrent_right_and_wrong_tries(db: Database) -> None:
    code = create_pairing_code(db, scopes=SCOPES, ttl_seconds=60).code
    code_id = code.split("-", 1)[0]
    issued: list[IssuedToken] = []

    def attempt(n: int) -> None:
        try:  # every third a right one; at most four wrong ones, so the code is not burnt
            issued.append(redeem_pairing_code(db, code if n % 3 else f"{code_id}-wrong{n}"))
        except Unauthorized:
            pass

    run_together(12, attempt)

    assert len(issued) == 1


def test_concurrent_wrong_secrets_burn_the_code(db: Database) -> None:
    code = create_pairing_code(db, scopes=SCOPES, ttl_seconds=60).code
    code_id = code.split("-", 1)[0]

    run_together(3 * MAX_PAIRING_FAILURES,
                 lambda n: None if refused(db, f"{code_id}-wrong{n}") else pytest.fail("redeemed"))

    assert refused(db, code)
