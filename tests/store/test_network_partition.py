"""A PostgreSQL host that vanishes from the network (switched off, failed over, cut off
by a partition that drops packets) answers nothing, not even a reset. Every kind of
store connection fails within the store's bound instead of waiting on the kernel's
retransmissions, and the store serves again once the host is back, with no restart
(`core.store.connect`). Real TCP, a real cluster: `partition_probe` runs in a network
namespace of this test's own, whose loopback it black-holes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store.partition_probe import WAIT_SECONDS

REPO = Path(__file__).resolve().parents[2]
# libpq's own rounding and a loaded machine's scheduling on top of the bound
SLACK_SECONDS = 4


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"taskward-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_every_store_connection_gives_up_on_a_vanished_host_within_the_bound(
    namespace: str,
) -> None:
    probe = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "tests.store.partition_probe"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    for connection in ("pooled", "batch", "new"):
        assert report[connection]["outcome"] == "OperationalError", (connection, report)
        assert report[connection]["seconds"] <= WAIT_SECONDS + SLACK_SECONDS, (connection,
                                                                               report)
    assert report["after"]["outcome"] == "answered", report
