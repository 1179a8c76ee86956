"""Fixtures of the service tests: real `taskward run` processes with the real default
model, each on a fresh data directory; every child is SIGKILLed at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.scheduler.processes import Children
from tests.service.running import Running, Runs, run_env


@dataclass(frozen=True)
class Service:
    """A `taskward run` started on an empty directory, and its admin client's token."""

    running: Running
    data_dir: Path
    token: str

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    data_dir = tmp_path_factory.mktemp("service")
    children = Children(data_dir / "logs")
    try:
        running = Runs(children).start(run_env(data_dir, drain_seconds=1))
        yield Service(running, data_dir, running.pair())
    finally:
        children.kill_all()


@pytest.fixture
def client(service: Service) -> Iterator[httpx.Client]:
    with service.running.client(service.token) as http:
        yield http
