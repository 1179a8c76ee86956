"""An HTTP client against the real app, and two callers, for the schedule routes; the
CLI against the test's store, for the schedule commands."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from core.settings import Settings
from core.store.database import Database
from infra.app import serving_app
from tests.schedules.helpers import Caller, caller


@pytest.fixture
def taskward(settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    monkeypatch.chdir(tmp_path)  # no taskward.toml of the developer's
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    return CliRunner()


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient[Any]]:
    with TestClient(serving_app(settings)) as client:
        yield client


@pytest.fixture
def alice(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "responses:create")


@pytest.fixture
def bob(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "responses:create")
