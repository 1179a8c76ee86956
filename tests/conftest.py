"""Fixtures: every store test runs on a real SQLite file and on real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import freezegun
import pytest

import tests.engines  # noqa: F401  registers the deterministic engine in this process
from core.clock import Clock
from core.settings import Settings
from core.store.connect import create_db_engine
from core.store.database import Database
from infra.migrate import upgrade
from tests.databases import copy_sqlite, private_pg_database, truncate_all
from tests.scheduler.processes import Children
from tests.service.running import Runs

# psycopg times its connection attempts with time.monotonic (130 s by default); a frozen
# clock ticked past that while a worker thread is connecting would time the connect out.
# The driver's timing is not the service's clock, so freezegun leaves it real.
freezegun.configure(extend_ignore_list=["psycopg"])


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    engine = create_db_engine(Settings(database_url=f"sqlite:///{path}"))
    upgrade(engine)
    engine.dispose()
    return path


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with private_pg_database() as url:
        engine = create_db_engine(Settings(database_url=url))
        upgrade(engine)
        engine.dispose()
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path
) -> Iterator[str]:
    """A migrated, empty database of each kind."""
    if request.param == "sqlite":
        yield copy_sqlite(sqlite_template, tmp_path / "taskward.db")
    else:
        url = request.getfixturevalue("pg_url")
        truncate_all(url)
        yield url


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    return Settings(database_url=database_url, models_dir=models, node_id="node-a")


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(create_db_engine(settings), Clock())
    yield database
    database.dispose()


@pytest.fixture
def model_id(db: Database, settings: Settings) -> str:
    """A registered model served by the deterministic test engine (tests/engines.py)."""
    from core.models_registry import register

    (settings.models_dir / "words.bin").write_bytes(b"test engine model\n")
    register(db, settings.models_dir, "words.bin", model_id="words", engine="test.words")
    return "words"


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    """For tests that start (and kill) `taskward run` themselves."""
    children = Children(tmp_path / "logs")
    try:
        yield Runs(children)
    finally:
        children.kill_all()
