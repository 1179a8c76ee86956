"""The systems `bench/peers.py` drives, each through its own public surface.

- `Peer`: Procrastinate or PgQueuer, every step a subprocess of the peers' own
  virtualenv (`bench/peer_drivers/`); finishes are read from the queue's own tables.
- `Taskward`: HTTP `POST /v1/responses` against `taskward serve`, `taskward sweeper`
  processes, the plug-in engine of `bench/noop_engine.py` (`words=1`: one chunk, a
  no-op) loaded through `TASKWARD_ENGINE_MODULES`, which notes each generation as it
  is entered, as the peers' job functions do; finishes are its `response.completed`
  events. On SQLite the latency run uses `taskward run`, whose in-process wake-up is
  that store's only push.

Every system records, per job, when its work started and when its finish was stamped,
as epoch seconds, and how many times it ran, so `bench/peers.py` checks that every job
finished exactly once and computes the same figures for all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench import noop_engine
from bench.http import exchange, free_port, load
from core.clients import IssuedToken
from core.models_registry import register
from core.requests import ResponseRequest, new_task
from core.settings import Settings
from core.store.births import NewTask
from core.store.clients import create_client
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.new_tasks import enqueue_many
from infra.migrate import upgrade
from tests.databases import private_pg_database
from tests.scheduler.processes import environment, wait_until

ROOT = Path(__file__).resolve().parents[1]
TASKWARD = str(Path(sys.executable).with_name("taskward"))
MODEL = "noop"
NOOP_REQUEST = {"model": MODEL, "input": "words=1"}
SLOTS = 16
# Tasks per transaction when a drain's queue is filled (not measured).
FILL_BATCH = 500


@dataclass(frozen=True)
class Child:
    """A benchmark process and when it was spawned (epoch s)."""

    process: subprocess.Popen[bytes]
    spawned_at: float


@contextmanager
def processes(commands: list[tuple[list[str], dict[str, str]]], logs: Path,
              name: str) -> Iterator[list[Child]]:
    """Start `commands` (argv, environment), each logging to `<name>-<index>.log`.
    SIGTERM then SIGKILL at the end: the figures are taken from the databases."""
    started: list[Child] = []
    try:
        for index, (argv, env) in enumerate(commands):
            log = (logs / f"{name}-{index}.log").open("wb")
            spawned_at = time.time()
            started.append(Child(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log,
                                                  stderr=subprocess.STDOUT,
                                                  start_new_session=True), spawned_at))
        yield started
    finally:
        for child in started:
            if child.process.poll() is None:
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for child in started:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait(timeout=10)


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """`sql` on a SQLite file or a PostgreSQL database named by a SQLAlchemy URL."""
    if url.startswith("sqlite"):
        lite = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            return list(lite.execute(sql))
        finally:
            lite.close()
    with psycopg.connect(dsn(url), autocommit=True) as conn:
        cursor = conn.execute(sql)
        return list(cursor) if cursor.description else []


def dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@dataclass
class Timeline:
    """Per job: when its work started and when its finish was stamped (epoch s), and
    how many times it was executed (each a line its job function or engine wrote as
    it was entered); per worker process (by its index among the workers started), when
    its first job started. `claims`: per job, how many times the queue handed it out,
    where the queue records that itself (taskward's `response.loading` events)."""

    starts: dict[str, float]
    finishes: dict[str, float]
    executions: Counter[str]
    first_starts: dict[int, float]
    claims: Counter[str] | None = None


class Peer:
    """A peer queue, driven by `bench/peer_drivers/<module>.py` in its own virtualenv."""

    def __init__(self, name: str, module: str, python: Path, finished_sql: str) -> None:
        self.name = name
        self._module = f"bench.peer_drivers.{module}"
        self._python = str(python)
        self._finished_sql = finished_sql  # (job id, finish epoch) per finished job

    @contextmanager
    def database(self, workdir: Path) -> Iterator[str]:
        with private_pg_database() as url:
            self._step(url, "setup")
            yield url

    def _argv(self, url: str, step: str, *extra: str) -> list[str]:
        return [self._python, "-m", self._module, step, "--dsn", dsn(url), *extra]

    def _step(self, url: str, step: str, *extra: str) -> Any:
        done = subprocess.run(self._argv(url, step, *extra), cwd=ROOT, capture_output=True,
                              text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} {step} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout) if done.stdout.strip() else None

    def fill(self, url: str, count: int) -> None:
        self._step(url, "fill", "--count", str(count))

    @contextmanager
    def workers(self, url: str, count: int, slots: int, logs: Path,
                workload: str) -> Iterator[list[Child]]:
        commands = [(self._argv(url, "worker", "--slots", str(slots), "--workload", workload,
                                "--log", str(logs / f"{self.name}-executions-{i}")),
                     {**os.environ, "PYTHONPATH": str(ROOT)}) for i in range(count)]
        with processes(commands, logs, f"{self.name}-worker") as children:
            yield children

    def enqueue(self, url: str, producers: int, seconds: float, logs: Path) -> dict[str, Any]:
        result: dict[str, Any] = self._step(url, "enqueue", "--producers", str(producers),
                                            "--seconds", str(seconds))
        return result

    def paced(self, url: str, rate: float, count: int, logs: Path) -> list[tuple[str, float]]:
        sent = self._step(url, "paced", "--rate", str(rate), "--count", str(count),
                          "--producers", "2")["sent"]
        return [(str(job_id), began) for job_id, began in sent]

    def finished(self, url: str) -> int:
        return int(rows(url, f"SELECT count(*) FROM ({self._finished_sql}) AS f")[0][0])

    def stored(self, url: str) -> int:
        table = "procrastinate_jobs" if "procrastinate" in self._module else "pgqueuer"
        return int(rows(url, f"SELECT count(*) FROM {table}")[0][0])

    def timeline(self, url: str, logs: Path, workers: int) -> Timeline:
        starts: dict[str, float] = {}
        executions: Counter[str] = Counter()
        first: dict[int, float] = {}
        for i in range(workers):
            path = logs / f"{self.name}-executions-{i}"
            lines = path.read_text().split() if path.exists() else []
            pairs = list(zip(lines[::2], map(float, lines[1::2]), strict=True))
            for job_id, began in pairs:
                executions[job_id] += 1
                starts.setdefault(job_id, began)
            if pairs:
                first[i] = min(b for _, b in pairs)
        finishes = {str(job): float(at) for job, at in rows(url, self._finished_sql)}
        return Timeline(starts, finishes, executions, first)


def procrastinate(python: Path) -> Peer:
    return Peer("procrastinate", "procrastinate_queue", python,
                "SELECT job_id, extract(epoch FROM at) FROM procrastinate_events "
                "WHERE type = 'succeeded'")


def pgqueuer(python: Path) -> Peer:
    return Peer("pgqueuer", "pgqueuer_queue", python,
                "SELECT job_id, extract(epoch FROM created) FROM pgqueuer_log "
                "WHERE status = 'successful'")


class Taskward:
    """taskward on one store, through `taskward serve` / `sweeper` / `run`."""

    def __init__(self, store: str, serve_workers: int) -> None:
        self.store = store
        self.name = "taskward" if store == "postgresql" else "taskward-sqlite"
        self._serve_workers = serve_workers
        self._clients: dict[str, IssuedToken] = {}
        self._models_dir: Path | None = None
        self._tags = itertools.count()  # each paced request's job tag, unique in a run

    @contextmanager
    def database(self, workdir: Path) -> Iterator[str]:
        models_dir = workdir / "models"
        models_dir.mkdir(exist_ok=True)
        (models_dir / "noop.bin").write_bytes(b"no-op model\n")
        self._models_dir = models_dir
        with ExitStack() as stack:
            if self.store == "sqlite":
                url = f"sqlite:///{workdir / f'taskward-{time.time_ns()}.db'}"
            else:
                url = stack.enter_context(private_pg_database())
            db = self._db(url)
            try:
                upgrade(db.engine)
                register(db, models_dir, "noop.bin", model_id=MODEL, engine=noop_engine.NAME)
                self._clients[url] = create_client(
                    db, name="bench", scopes=frozenset({"responses:create"}))
            finally:
                db.dispose()
            yield url

    def _settings(self, url: str) -> Settings:
        assert self._models_dir is not None
        return Settings(database_url=url, models_dir=self._models_dir, node_id="bench")

    def _db(self, url: str) -> Database:
        return Database(create_db_engine(self._settings(url)))

    def _env(self, url: str, executions: Path | None = None,
             **extra: object) -> dict[str, str]:
        """A taskward process's environment; `executions`: where its engine notes each
        generation it enters (a process that generates nothing needs none)."""
        env = environment(self._settings(url), **{"worker_concurrency": SLOTS,
                                                   "engine_modules": noop_engine.MODULE,
                                                   **extra})
        if executions is not None:
            env[noop_engine.LOG_VARIABLE] = str(executions)
        return env

    def fill(self, url: str, count: int) -> None:
        """`count` no-op tasks of the bench's client, built and stored by the functions
        `POST /v1/responses` calls (its group commit), without HTTP: the fill is not
        measured."""
        db = self._db(url)
        try:
            fill_queue(db, self._settings(url), self._clients[url].client_id,
                       [f"f{i}" for i in range(count)])
        finally:
            db.dispose()

    def _executions(self, logs: Path, process: int | str) -> Path:
        return logs / f"{self.name}-executions-{process}"

    @contextmanager
    def workers(self, url: str, count: int, slots: int, logs: Path,
                workload: str) -> Iterator[list[Child]]:
        commands = [([TASKWARD, "sweeper"],
                     self._env(url, self._executions(logs, i), worker_concurrency=slots,
                               node_id=f"bench-{i}"))
                    for i in range(count)]
        with processes(commands, logs, f"{self.name}-sweeper") as children:
            yield children

    @contextmanager
    def _api(self, url: str, logs: Path, *, with_sweeper: bool = False) -> Iterator[int]:
        port = free_port()
        argv = ([TASKWARD, "run", "--port", str(port)] if with_sweeper else
                [TASKWARD, "serve", "--port", str(port), "--workers", str(self._serve_workers)])
        env = self._env(url, self._executions(logs, "run") if with_sweeper else None)
        with processes([(argv, env)], logs, f"{self.name}-{argv[1]}"):
            wait_until(lambda: _ready(port), timeout=60, what="the API")
            yield port

    def _post(self, url: str, body: dict[str, str] = NOOP_REQUEST) -> bytes:
        raw = json.dumps(body).encode()
        return (f"POST /v1/responses HTTP/1.1\r\nHost: bench\r\n"
                f"Authorization: Bearer {self._clients[url].token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
                ).encode() + raw

    def enqueue(self, url: str, producers: int, seconds: float, logs: Path) -> dict[str, Any]:
        request = self._post(url)
        with self._api(url, logs) as port:
            run = asyncio.run(load(port, lambda: request, producers, seconds, ok=202))
        return {"count": run.statuses.get(202, 0), "seconds": run.seconds,
                "latencies": run.latencies, "statuses": run.statuses}

    def paced(self, url: str, rate: float, count: int, logs: Path) -> list[tuple[str, float]]:
        def request() -> bytes:  # each its own job tag, for the engine's lines
            tag = f"p{next(self._tags)}"
            return self._post(url, {"model": MODEL, "input": noop_engine.noop_input(tag)})

        # SQLite has no cross-process push: its latency figure is `taskward run`'s.
        with self._api(url, logs, with_sweeper=self.store == "sqlite") as port:
            return asyncio.run(paced_http(port, request, rate, count))

    def finished(self, url: str) -> int:
        return int(rows(url, "SELECT count(*) FROM tasks WHERE status = 'completed'")[0][0])

    def stored(self, url: str) -> int:
        return int(rows(url, "SELECT count(*) FROM tasks")[0][0])

    def timeline(self, url: str, logs: Path, workers: int) -> Timeline:
        """Starts and executions from the engine's lines (each tag mapped to its task
        through the stored request), finishes from `response.completed`, claims from
        `response.loading`."""
        task_of = {noop_engine.tag_of(_input(request)): task_id
                   for task_id, request in rows(url, "SELECT id, request FROM tasks")}
        starts: dict[str, float] = {}
        executions: Counter[str] = Counter()
        first: dict[int, float] = {}
        for path in sorted(logs.glob(f"{self.name}-executions-*")):
            entries = noop_engine.read_executions(path)
            for tag, began in entries:
                job = task_of.get(tag, f"unknown job {tag}")
                executions[job] += 1
                starts[job] = min(began, starts.get(job, began))
            index = path.name.rsplit("-", 1)[1]
            if entries and index.isdigit() and int(index) < workers:
                first[int(index)] = min(began for _, began in entries)
        finishes: dict[str, float] = {}
        claims: Counter[str] = Counter()
        for task_id, kind, created_at in rows(
                url, "SELECT task_id, type, created_at FROM task_events "
                     "WHERE type IN ('response.loading', 'response.completed')"):
            if kind == "response.loading":
                claims[task_id] += 1
            else:
                finishes[task_id] = created_at / 1000
        return Timeline(starts, finishes, executions, first, claims)


def fill_queue(db: Database, settings: Settings, client_id: str, tags: list[str]) -> None:
    """Queue one no-op task per tag for `client_id`, as `POST /v1/responses` would: the
    body validated as the API validates it, the task built by `core.requests.new_task`
    and stored by the API's group commit (`enqueue_many`), `FILL_BATCH` per commit."""
    now = db.clock.now_ms()
    news: list[NewTask] = [new_task(ResponseRequest.model_validate(
        {"model": MODEL, "input": noop_engine.noop_input(tag)}), client_id=client_id,
        settings=settings, now_ms=now) for tag in tags]
    for start in range(0, len(news), FILL_BATCH):
        enqueue_many(db, [(new, None) for new in news[start:start + FILL_BATCH]])


def _input(request_json: str) -> str:
    """The text input of a stored request (the bench only sends text)."""
    value = json.loads(request_json)["input"]
    return value if isinstance(value, str) else ""


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def paced_http(port: int, build: Callable[[], bytes], rate: float,
                     count: int) -> list[tuple[str, float]]:
    """`count` POSTs (each `build()`) at `rate` per second over a few keep-alive
    connections, open loop: `(task id, epoch before the request)` for each. Any answer
    but 202 stops the run, as an enqueue error stops a peer's."""
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(4):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    sent: list[tuple[str, float]] = []

    async def one() -> None:
        request = build()
        reader, writer = await idle.get()
        began = time.time()
        status, body = await exchange(reader, writer, request)
        idle.put_nowait((reader, writer))
        if status != 202:
            raise RuntimeError(f"a paced POST was answered {status}")
        sent.append((json.loads(body)["id"], began))

    start = time.perf_counter()
    calls = []
    for i in range(count):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        calls.append(asyncio.ensure_future(one()))
    await asyncio.gather(*calls)
    while not idle.empty():
        idle.get_nowait()[1].close()
    return sent


class BareLitestar:
    """The HTTP stack's own ceiling: `bench/bare_app.py` under the same granian settings
    as `taskward serve`, driven by the same load generator."""

    name = "bare Litestar POST"

    def __init__(self, serve_workers: int) -> None:
        self._serve_workers = serve_workers

    def enqueue(self, producers: int, seconds: float, logs: Path) -> dict[str, Any]:
        port = free_port()
        code = ("from infra.server import serve; "
                f"serve('bench.bare_app:app', port={port}, workers={self._serve_workers}, "
                "factory=False)")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        body = json.dumps(NOOP_REQUEST).encode()
        request = (f"POST /v1/responses HTTP/1.1\r\nHost: bench\r\n"
                   f"Authorization: Bearer none\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        with processes([([sys.executable, "-c", code], env)], logs, "bare-litestar"):
            wait_until(lambda: _answers(port), timeout=60, what="the bare app")
            run = asyncio.run(load(port, lambda: request, producers, seconds, ok=202))
        return {"count": run.statuses.get(202, 0), "seconds": run.seconds,
                "latencies": run.latencies}


def _answers(port: int) -> bool:
    try:
        return httpx.post(f"http://127.0.0.1:{port}/v1/responses", json=NOOP_REQUEST,
                          timeout=1).status_code == 202
    except httpx.HTTPError:
        return False

