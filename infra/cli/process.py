"""Process commands: migrate, recover, sweep, sweeper, run.

These are what a platform runs: `recover` as a cold-start hook (init container,
ExecStartPre), `sweep` from cron, `sweeper` as a long-running service, `run` for a
single machine. Each reads the same settings and exits 0 when its job is done. The
three that run attempts hold their sign of life (`core.store.recovery.sweeping`) for as
long as they run, so that a recovery on SQLite never restarts their live work.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import click

from core.engines.host_lock import unusable
from core.engines.registry import import_engine_modules
from core.settings import SettingRefused, Settings, load_settings
from core.store.recovery import SweepersAlive, sweeping
from core.store.recovery import recover as recover_tasks
from infra.cli import collector_paused
from infra.cli.context import JSON_OPTION, database, domain_errors, emit, privileges_named
from infra.cli.listen_address import ensure_free, listen_options, url_authority
from infra.cli.option_types import CRON_EXPRESSION
from infra.migrate import upgrade
from infra.stop_signals import stop_then_hurry, wait_for

log = logging.getLogger(__name__)

# A draining sweeper's youngest collections mostly walked a batch's objects that were
# about to go anyway (a claim's rows, attempts, completions: alive for milliseconds,
# created by the thousand). Collected every 20,000 new objects instead of every 700,
# most of them are freed before any collection sees them: the collector's CPU over a
# drain of 5,000 no-op tasks per process went ~40 -> ~4 ms (issue 15). Memory held by
# garbage cycles waits a little longer; nothing else changes.
_SWEEPER_YOUNG_THRESHOLD = 20_000


@click.command()
def migrate() -> None:
    """Bring the database schema to this version's head and print the revision."""
    settings = load_settings()
    with database(settings, check=False) as db, domain_errors():
        click.echo(upgrade(db.engine))


@click.command()
@click.option("--all", "all_nodes", is_flag=True,
              help="PostgreSQL: recover every node's tasks (a whole-service restart).")
@JSON_OPTION
def recover(all_nodes: bool, as_json: bool) -> None:
    """Cold-start hook: apply each leftover task's restart policy (idempotent)."""
    settings = load_settings()
    with database(settings) as db, _refused_while_sweeping():
        counts = recover_tasks(db, node_id=db.recovery_scope(settings.node_id,
                                                             all_nodes=all_nodes))
    if as_json:
        emit({"recovered": counts}, as_json=True)
    else:
        click.echo("recovered: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


@click.command()
@click.option("--json", "as_json", is_flag=True,
              help="Accepted for symmetry with other commands: the summary is always JSON.")
def sweep(as_json: bool) -> None:
    """Exactly one sweeper pass (for cron), then exit 0 with a one-line JSON summary."""
    with collector_paused():
        from scheduler.sweep import sweep_once
    settings = _worker_settings()
    stop, hurry = threading.Event(), threading.Event()
    with (database(settings, role="sweeper") as db, sweeping(db),
          stop_then_hurry(stop, hurry)):
        summary = sweep_once(db, settings, stop=stop, hurry=hurry)
    emit(summary, as_json=True)


@click.command()
@click.option("--schedule", metavar="CRON", type=CRON_EXPRESSION,
              help="Maintenance passes (overrides TASKWARD_SWEEP_SCHEDULE).")
def sweeper(schedule: str | None) -> None:
    """Long-running sweeper: continuous claiming, maintenance on a cron schedule."""
    stop, hurry = threading.Event(), threading.Event()
    with ExitStack() as running:
        # From exec to the first claim, the garbage collector would only rescan what
        # start-up allocates for good (see `infra.cli`); `start` returns after the claim.
        # What start-up made is then frozen: later collections walk only newer objects.
        with collector_paused(freeze=True):
            from scheduler.loop import SweeperLoop

            settings = _worker_settings(
                **({} if schedule is None else {"sweep_schedule": schedule}))
            db = running.enter_context(database(settings, role="sweeper"))
            running.enter_context(sweeping(db))
            running.enter_context(stop_then_hurry(stop, hurry))
            loop = SweeperLoop(db, settings)
            loop.start()
        gc.set_threshold(_SWEEPER_YOUNG_THRESHOLD)
        log.info("sweeper started (node %s)", settings.node_id)
        wait_for(stop)
        log.info("stopping: draining for up to %ss (signal again to hand back at once)",
                 settings.drain_seconds)
        loop.stop(hurry=hurry)


@click.command()
@listen_options
def run(host: str, port: int) -> None:
    """All-in-one: migrate, recover, then the API and the sweeper loop in one process."""
    with collector_paused():
        from infra.runtime import prepare, serve_all_in_one
    settings = _worker_settings()
    port = ensure_free(host, port)  # before the store is touched: a refused `run` leaves no trace
    with domain_errors(), privileges_named():
        prepared = prepare(settings)
    click.echo(f"schema at {prepared.revision}; " + (
        "recovery skipped: a sweeper is running on this store (its tasks are not "
        "leftovers; a crashed process's come back as their leases expire)"
        if prepared.recovered is None else
        "recovered: " + ", ".join(f"{k} {v}" for k, v in prepared.recovered.items())))
    if prepared.default_model:
        click.echo(f"registered the default model {prepared.default_model}")
    if prepared.admin_code:
        click.echo(f"admin pairing code (one use, expires in "
                   f"{settings.pairing_code_ttl_seconds:.0f}s): {prepared.admin_code}")
    click.echo(f"serving on http://{url_authority(host, port)} with the sweeper "
               "(Ctrl-C stops both)")
    # Held here, in granian's main process: its worker, where the sweeper loop runs, is
    # forked with the lock's descriptor, so the sign lasts while either of them lives.
    with database(settings, check=False, role="run") as db, sweeping(db):
        serve_all_in_one(host=host, port=port,
                         idle_timeout_seconds=settings.http_idle_timeout_seconds,
                         max_connections=settings.http_max_connections,
                         drain_seconds=settings.drain_seconds)


@contextmanager
def _refused_while_sweeping() -> Iterator[None]:
    """A recovery refused because a sweeper lives (SQLite): one line, exit status 1."""
    try:
        yield
    except SweepersAlive as exc:
        raise click.ClickException(str(exc)) from None


def _worker_settings(**overrides: object) -> Settings:
    """Settings for a process that executes tasks, its host lock usable: logging on,
    engine plug-ins imported."""
    settings = load_settings(_usable_host_lock, **overrides)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # `run` migrates: keep it quiet
    # httpx logs every upstream request at INFO: a line per attempt, and ~5 % of the
    # upstream loop's CPU per request. Failures show in the tasks' codes and /metrics.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with domain_errors(), collector_paused():
        import_engine_modules(settings.engine_module_names)
    return settings


def _usable_host_lock(settings: Settings) -> None:
    """An opt-in host lock (`TASKWARD_ENGINE_HOST_LOCK`) this process cannot open stops
    it at start: the operator who set it asked for it, and the decode loop would only
    warn and decode without it. Other processes never open it and do not ask."""
    if settings.engine_host_lock and (why := unusable(Path(settings.engine_host_lock))):
        raise SettingRefused(
            "engine_host_lock", f": cannot use {settings.engine_host_lock} as the lock file: "
            f"{why}; name a file this user can create or open, or leave it empty (no lock)")


COMMANDS: list[click.Command] = [migrate, recover, sweep, sweeper, run]
