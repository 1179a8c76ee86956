"""Fixtures for sweeper tests: fast settings and real `taskward` child processes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import tests.engines  # noqa: F401  registers the deterministic engine in this process
from core.settings import Settings
from tests.scheduler.processes import Children


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """Settings scaled down so leases, flushes and backoff happen in test time."""
    return replace(settings, lease_seconds=5, heartbeat_seconds=1, flush_interval_ms=50,
                   backoff_base_seconds=1, backoff_max_seconds=4, drain_seconds=2,
                   poll_interval_ms=20, worker_concurrency=4, engine_modules="tests.engines")


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    """Starts `taskward` processes; every one still alive is killed at teardown."""
    spawned = Children(tmp_path / "logs")
    yield spawned
    spawned.kill_all()
