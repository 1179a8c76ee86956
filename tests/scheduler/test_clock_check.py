"""A node whose clock is not the store's is told so at every maintenance pass
(`scheduler.leases.check_clock`): leases run out by the clock of the node that looks."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from core.clock import Clock
from core.settings import Settings
from core.store.clock_skew import skew_ms
from core.store.connect import create_db_engine
from core.store.database import Database
from scheduler import leases
from scheduler.sweep import maintain, sweep_once


class _Offset(Clock):
    """This machine's clock moved by `offset_ms`: a node whose clock is not synced."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.offset_ms


@pytest.fixture
def node(settings: Settings) -> Iterator[Database]:
    """The test's store, seen by a node whose clock `_Offset` moves (0 to begin with)."""
    database = Database(create_db_engine(settings), _Offset(0))
    yield database
    database.dispose()


def offset(node: Database, seconds: float) -> None:
    assert isinstance(node.clock, _Offset)
    node.clock.offset_ms = int(seconds * 1000)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_skew_is_this_clock_less_the_servers(node: Database) -> None:
    assert abs(skew_ms(node, within_ms=1000) or 0) < 100  # the same machine's clock
    offset(node, 30)
    assert 29_900 < (skew_ms(node, within_ms=1000) or 0) < 30_100
    offset(node, -5)
    assert -5_100 < (skew_ms(node, within_ms=1000) or 0) < -4_900


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_sqlite_has_one_clock_and_nothing_to_compare(node: Database) -> None:
    offset(node, 30)
    assert skew_ms(node, within_ms=1000) is None


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_each_pass_warns_of_a_clock_ahead_or_behind_and_says_what_it_does(
        node: Database, settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=leases.log.name)

    maintain(node, settings, threading.Event())  # synced: nothing to say
    offset(node, 0.5)
    maintain(node, settings, threading.Event())  # within a second: still nothing
    assert caplog.records == []

    offset(node, 5)
    maintain(node, settings, threading.Event())
    offset(node, 25)  # past the lease (30 s) less the heartbeat (10 s)
    sweep_once(node, settings, stop=threading.Event())
    offset(node, -3)
    maintain(node, settings, threading.Event())
    ahead, far_ahead, behind = (record.getMessage() for record in caplog.records)
    assert ahead.startswith("this node's clock is 5.0 s ahead of the PostgreSQL server's: "
                            "it sees other nodes' leases run out 5.0 s early; sync")
    assert far_ahead.startswith(
        "this node's clock is 25.0 s ahead of the PostgreSQL server's: it sees other "
        "nodes' leases run out 25.0 s early, enough to take over tasks whose workers are "
        "alive (the lease less the heartbeat is 20 s); sync")
    assert behind.startswith("this node's clock is 3.0 s behind the PostgreSQL server's: "
                             "it sees expired leases 3.0 s late; sync")
