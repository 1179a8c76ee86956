"""An HTTP client against the real app, and two callers, for the schedule routes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from core.settings import Settings
from core.store.database import Database
from infra.app import serving_app
from tests.schedules.helpers import Caller, caller


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
