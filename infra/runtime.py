"""The all-in-one process of `taskward run`: one machine, one command.

Start-up order matters. Migrations first (nothing may touch an old schema); then the
cold-start hook, before any worker could claim, so every leftover task is put into a
defined state; then the default model and the first admin pairing code; and only then
the API and the sweeper loop, started together in granian's worker process.

The sweeper shares that process's `Database` with the API, so an enqueue wakes it
in-process (the only push SQLite has). Ctrl-C / SIGTERM begin the loop's graceful stop
(drain, then hand back) at once (`infra.stop_signals.GracefulStop`), not when granian
gets round to the app's shutdown, which waits for every connection to end: one client
that leaves its answers unread held that off until granian killed the worker, its tasks
left `running` as after a crash. The shutdown hook waits for the stop to be over before
the database closes; a second Ctrl-C cuts the drain short.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from litestar import Litestar

from core.engines.registry import import_engine_modules
from core.errors import DomainError
from core.model_files import DEFAULT_ENGINE, DEFAULT_MODEL_ID, install_default_model
from core.models_registry import register
from core.settings import Settings, load_settings
from core.store.clients import first_start_admin_code
from core.store.connect import open_database
from core.store.database import Database
from core.store.models import list_models
from core.store.outage import drop_said
from core.store.recovery import SweepersAlive, recover
from core.store.redo_dropped import redone_if_dropped
from infra.app import serving_app
from infra.migrate import upgrade
from infra.server import serve
from infra.stop_signals import GracefulStop
from scheduler.loop import SweeperLoop

ALL_IN_ONE_APP = "infra.runtime:all_in_one_app"

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """What start-up did, for the console."""

    revision: str
    recovered: dict[str, int] | None  # None: skipped, another sweeper lives on the store
    default_model: str | None = None
    admin_code: str | None = None


def prepare(settings: Settings) -> Prepared:
    """Everything `run` does before serving: migrate, recover, seed a fresh install."""
    db = open_database(settings, role="run")
    try:
        revision = _again_after_a_drop("migration", lambda: upgrade(db.engine))
        recovered = _again_after_a_drop("recovery", lambda: _recovered(db, settings))
        default_model = _again_after_a_drop(
            "default model", lambda: _register_default_model(db, settings))
        admin_code = _again_after_a_drop(
            "admin pairing code", lambda: first_start_admin_code(db, settings))
    finally:
        db.dispose()
    return Prepared(revision, recovered, default_model, admin_code)


def _again_after_a_drop(step: str, call: Callable[[], T]) -> T:
    """`call()`, made once more at once on a fresh connection when the store dropped
    its connection under it (`is_connection_dropped`: a pooler's restart during a
    deploy, an administrator's `pg_terminate_backend`), as the running loops do; a
    second drop, a store that cannot be reached and any other error end the start as
    before. Every step is safe to make again, even after a commit whose reply was lost:
    the migration reads its revision first, recovery finds nothing left to put in a
    state, the default model is registered only into an empty registry, and a second
    admin pairing code beside an unused first one takes nothing over."""
    return redone_if_dropped(
        call, lambda drop: log.warning("%s", drop_said(step, "making it again", drop)))


def _recovered(db: Database, settings: Settings) -> dict[str, int] | None:
    """The cold start's counts, or None when a sweeper lives on this SQLite store:
    its running tasks are not leftovers, and a crashed process's come back anyway when
    their leases expire. Refusing to start there would leave `run` down beside a
    sweeper or a cron `sweep` pass for nothing (`taskward recover` itself refuses)."""
    try:
        return recover(db, node_id=db.recovery_scope(settings.node_id))
    except SweepersAlive:
        return None


def _register_default_model(db: Database, settings: Settings) -> str | None:
    """Register the bundled model when the registry is empty, so `/v1/models` is not;
    the registry gives its entry the recommended sampling defaults, as it would to
    `taskward models add` of the same file."""
    if list_models(db):
        return None
    try:
        path = install_default_model(settings.models_dir)
    except OSError as exc:
        # A read-only mount or another owner's directory: without this the start ended
        # in a traceback, and every restart alike, with nothing saying what to change.
        raise DomainError(
            "models_dir_unwritable",
            f"cannot install the default model into TASKWARD_MODELS_DIR "
            f"{str(settings.models_dir)!r} ({exc.strerror or type(exc).__name__}); make "
            "that directory writable by this user, or point TASKWARD_MODELS_DIR at one "
            "that is, or register a model first with `taskward models add`",
        ) from None
    register(db, settings.models_dir, path, model_id=DEFAULT_MODEL_ID, engine=DEFAULT_ENGINE)
    return DEFAULT_MODEL_ID


def serve_all_in_one(
    *, host: str, port: int, idle_timeout_seconds: float, drain_seconds: float,
    max_connections: int,
) -> None:
    """Serve the API with the sweeper loop until SIGINT/SIGTERM (one granian worker)."""
    serve(ALL_IN_ONE_APP, host=host, port=port, workers=1, factory=True,
          idle_timeout_seconds=idle_timeout_seconds, drain_seconds=drain_seconds,
          max_connections=max_connections)


def all_in_one_app() -> Litestar:
    """granian's factory: the API app whose lifespan also starts and stops the sweeper."""
    settings = load_settings()
    import_engine_modules(settings.engine_module_names)
    loops: list[SweeperLoop] = []

    def stop_sweeper(hurry: threading.Event) -> None:
        for loop in loops:
            loop.stop(hurry=hurry)

    stop = GracefulStop(stop_sweeper)

    def arm(_app: Litestar) -> None:
        stop.arm()

    def start_sweeper(app: Litestar) -> None:
        loop = SweeperLoop(app.state.services.db, settings, in_process_wakeups=True)
        loop.start()
        loops.append(loop)

    # A stop signal while the worker starts: no sweeper, nothing claimed, nothing to drain.
    return serving_app(settings, on_startup=[arm], on_started=[start_sweeper],
                       on_shutdown=[stop.finish], role="run")
