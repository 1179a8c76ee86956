"""The API as a process serves it: its store opened and its schema checked here.

`handlers.app.create_app` knows routes, not where the database is or how migrations
are checked; this module hands it both. `taskward serve` runs `serving_app` under
granian (a factory, one app per worker); `taskward run` adds its sweeper through
`on_startup`/`on_shutdown`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from litestar import Litestar

from core.engines.registry import import_engine_modules
from core.settings import Settings, load_settings
from core.store.connect import open_database
from handlers.app import LifespanHook, create_app
from infra.migrate import check_schema

SERVING_APP = "infra.app:serving_app"


def serving_app(
    settings: Settings | None = None,
    *,
    on_startup: Sequence[LifespanHook] = (),
    on_shutdown: Sequence[LifespanHook] = (),
) -> Litestar:
    """The API for `settings` (default: read from the environment and taskward.toml),
    over a database of its own that the app disposes of at shutdown."""
    settings = settings or load_settings()
    import_engine_modules(settings.engine_module_names)  # registration checks engine names
    db = open_database(settings)
    # Probes call the readiness check every few seconds; alembic would log two lines each.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    return create_app(settings, db, readiness=lambda: check_schema(db.engine),
                      on_startup=on_startup, on_shutdown=on_shutdown)
