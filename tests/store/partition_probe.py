"""What taskward's PostgreSQL connections do when the store's host vanishes from the
network, run inside a network namespace of its own (`test_network_partition.py`
starts it there with `ip netns exec`, so the routes it changes are that namespace's).

It serves a private cluster on the namespace's loopback, opens the store with
`TASKWARD_STORE_WAIT_SECONDS` = `WAIT_SECONDS` and uses each kind of connection once
(SQLAlchemy's pool, the API's event-loop batch connections), so each holds one open.
Then every packet to 127.0.0.1 goes into a black hole: what was sent on an open
connection is neither answered nor refused, as when a host is switched off or a
partition drops packets. Each open connection is used again, each call on a thread
given `GIVE_UP_SECONDS`, then a new pooled connection is asked for (the black-hole
route refuses a new connect at once, so this one shows only that the pool does not
hand out the dead connection again); the route is taken away and the store used once
more. Prints one JSON object: per call, the error's class and the seconds it took, or
"hung".
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from core.settings import Settings
from core.store.connect import open_database
from core.store.models import list_models
from core.store.pg_async import AutocommitConnections
from tests.pg_cluster import migrated_cluster

WAIT_SECONDS = 2
GIVE_UP_SECONDS = 60  # far past the bound: a call still running then is hung
_BLACK_HOLE_RULE = "9"  # the preference of the rule that sends loopback to table 109


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


def _isolated() -> None:
    """Black-hole the namespace's loopback. The `local` table (rule 0) would route
    127.0.0.1 before any other rule, so it moves behind the black hole's rule."""
    _ip("rule", "add", "pref", "100", "lookup", "local")
    _ip("rule", "del", "pref", "0")
    _ip("route", "add", "blackhole", "127.0.0.1", "table", "109")
    _ip("rule", "add", "to", "127.0.0.1", "lookup", "109", "pref", _BLACK_HOLE_RULE)


def _reachable() -> None:
    _ip("rule", "del", "pref", _BLACK_HOLE_RULE)


def _timed(call: Callable[[], object]) -> dict[str, Any]:
    outcome: dict[str, Any] = {"outcome": "hung"}

    def run() -> None:
        started = time.monotonic()
        try:
            call()
            outcome["outcome"] = "answered"
        except Exception as exc:
            outcome["outcome"] = type(exc).__name__
        outcome["seconds"] = round(time.monotonic() - started, 1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GIVE_UP_SECONDS)
    return outcome


def main() -> None:
    _ip("link", "set", "lo", "up")
    with migrated_cluster() as cluster:
        db = open_database(Settings(database_url=cluster.url, store_wait_seconds=WAIT_SECONDS))
        batches = AutocommitConnections(db)
        loop = asyncio.new_event_loop()

        def batch() -> None:
            loop.run_until_complete(batches.first_row("SELECT 1", {}))

        list_models(db)
        batch()
        _isolated()
        report = {
            "pooled": _timed(lambda: list_models(db)),
            "batch": _timed(batch),
            "new": _timed(lambda: list_models(db)),
        }
        _reachable()
        report["after"] = _timed(lambda: list_models(db))
        print(json.dumps(report))


if __name__ == "__main__":
    main()
