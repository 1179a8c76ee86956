"""Fixtures of the console tests: the real app over the real databases of
`tests/conftest.py`, an admin client and a logged-in console."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from core.clients import IssuedToken
from core.settings import Settings
from core.store.clients import create_client
from core.store.database import Database
from infra.app import serving_app
from tests.console.helpers import Console


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient[Any]]:
    with TestClient(serving_app(settings)) as client:
        yield client


@pytest.fixture
def admin(db: Database) -> IssuedToken:
    return create_client(db, name="operator", scopes=frozenset({"admin"}))


@pytest.fixture
def console(http: TestClient[Any], admin: IssuedToken) -> Console:
    logged_in = Console(http)
    assert logged_in.login(admin.token).status_code == 303
    return logged_in
