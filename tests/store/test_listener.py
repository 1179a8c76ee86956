"""The PostgreSQL listener through an outage: it reconnects by itself, says so when the
outage starts and when it ends, and only reminds the operator now and then between."""

from __future__ import annotations

import logging
import re
import threading

import psycopg
import pytest

from core.store import listener as listener_module
from core.store.listener import PgListener
from tests.pg_cluster import private_cluster
from tests.scheduler.processes import wait_until


def test_the_listener_logs_an_outage_sparingly_and_hears_again_after_it(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listener_module, "_RECONNECT_SECONDS", 0.1)
    monkeypatch.setattr(listener_module, "_FAILURES_PER_REMINDER", 10)
    heard: list[str] = []
    connected = threading.Event()

    def hear(payload: str) -> None:
        heard.append(payload)
        if payload == "":
            connected.set()

    caplog.set_level(logging.INFO, logger=listener_module.__name__)
    with private_cluster() as cluster:
        conninfo = f"host=127.0.0.1 port={cluster.port} user=postgres dbname=postgres"
        listening = PgListener(conninfo, {"probe": hear})
        listening.start()
        try:
            assert connected.wait(10)
            cluster.stop()
            connected.clear()
            # ~10 reconnects a second while the server is down: the first failure and
            # then every tenth is logged
            wait_until(lambda: 11 in _failures_logged(caplog), timeout=20,
                       what="the first reminder")

            cluster.start()
            assert connected.wait(10), "the listener never reconnected"
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("NOTIFY probe, 'after the outage'")
            wait_until(lambda: "after the outage" in heard, timeout=10,
                       what="a notification after the outage")
        finally:
            listening.stop()
    back = [r for r in caplog.records if r.getMessage().startswith("LISTEN is back")]
    assert len(back) == 1 and back[0].levelno == logging.INFO, caplog.text
    logged = _failures_logged(caplog)
    assert logged == list(range(1, logged[-1] + 1, 10)), caplog.text


_FAILED = re.compile(r"LISTEN failed \(\w+, (\d+) in a row\)")


def _failures_logged(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The failures-in-a-row count of each "LISTEN failed" warning, in order."""
    return [int(failed.group(1)) for record in caplog.records
            if record.levelno == logging.WARNING
            and (failed := _FAILED.match(record.getMessage()))]
