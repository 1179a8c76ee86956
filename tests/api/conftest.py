"""Fixtures of the API tests: the real app over the real databases of `tests/conftest.py`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from core.settings import Settings
from core.store.connect import open_database
from core.store.database import Database
from infra.app import serving_app
from tests.api.helpers import Caller, caller, register_test_model
from tests.api.served import Service, running_service
from tests.databases import migrated_store


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient[Any]]:
    with TestClient(serving_app(settings)) as client:
        yield client


@pytest.fixture
def model_id(db: Database, settings: Settings) -> str:
    return register_test_model(db, settings.models_dir)


@pytest.fixture
def alice(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "responses:create", "tasks:read", "tasks:cancel", "models:read")


@pytest.fixture
def bob(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "responses:create", "tasks:read", "tasks:cancel", "models:read")


@pytest.fixture
def admin(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "admin")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
    sqlite_template: Path,
) -> Iterator[Service]:
    """`taskward serve` with two workers and a `taskward sweeper`, on each store."""
    workdir = tmp_path_factory.mktemp(f"served-{request.param}")
    with ExitStack() as stack:
        url = stack.enter_context(migrated_store(request.param, workdir, sqlite_template))
        db = open_database(Settings(database_url=url))
        register_test_model(db, workdir / "models")
        db.dispose()
        yield stack.enter_context(running_service(url, workdir))
