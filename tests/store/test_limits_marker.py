"""Every change of a client's limits moves the token caches' marker (`revocations`), on
both stores, whatever the clock that stamps it says: a change stamped by a node whose
clock is behind another's, or in the same millisecond as the last, is not missed."""

from __future__ import annotations

import threading

from core.clients import DEFAULT_SCOPES
from core.store.clients import create_client, revocations, set_limits
from core.store.database import Database
from tests.clocks import HandClock


def test_a_change_stamped_by_a_clock_behind_the_latest_still_moves_the_marker(
    db: Database,
) -> None:
    clock = db.clock = HandClock(2_000_000)  # the node that changes first runs ahead
    x = create_client(db, name="x", scopes=DEFAULT_SCOPES).client_id
    y = create_client(db, name="y", scopes=DEFAULT_SCOPES).client_id
    set_limits(db, y, {"max_streams": 50})
    before = revocations(db)

    clock.ms = 1_000_000  # another node, two thousand seconds behind
    set_limits(db, x, {"requests_per_second": 0.5})

    assert revocations(db) > before


def test_changes_in_the_same_millisecond_each_move_the_marker(db: Database) -> None:
    db.clock = HandClock(1_000_000)
    x = create_client(db, name="x", scopes=DEFAULT_SCOPES).client_id
    markers = []
    for rate in (1.0, 2.0, 3.0):
        set_limits(db, x, {"requests_per_second": rate})
        markers.append(revocations(db))

    assert markers == sorted(set(markers))  # three distinct, growing markers


def test_concurrent_changes_each_get_a_stamp_of_their_own(db: Database) -> None:
    """Changes take turns: two that read the same latest stamp would write the same one,
    and the marker would move once for both."""
    db.clock = HandClock(1_000_000)
    ids = [create_client(db, name=f"c{i}", scopes=DEFAULT_SCOPES).client_id for i in range(6)]
    barrier = threading.Barrier(len(ids))

    def change(client_id: str) -> None:
        barrier.wait()
        for rate in (1.0, 2.0, 3.0):
            set_limits(db, client_id, {"requests_per_second": rate})

    threads = [threading.Thread(target=change, args=(client_id,)) for client_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert revocations(db)[2] == 1_000_000 + 3 * len(ids) - 1  # the first at the clock
