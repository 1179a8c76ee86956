"""CPU seconds per `POST /v1/responses`, served and in-process, on both stores.

Run from the repository root: `.venv/bin/python -m bench.enqueue_cpu [--posts N]`.

Served (default): `taskward serve --workers W` (1 unless `--workers`, as
`bench/peers.py`'s enqueue and `taskward serve` itself) is started and warmed up;
then `--posts` asynchronous POSTs go over `--producers` keep-alive connections (the
minimal HTTP/1.1 client of `bench/http.py`, in this process, so its CPU is not
counted). The figure is the CPU time (user + system, all threads, from /proc) of the
serve process and its workers per POST, split by thread name (the event loop, the
store threads, granian's own), and on PostgreSQL the CPU of the database's backends
and the commits per POST (`pg_stat_database`). Unlike the requests per second beside
it, it hardly depends on what else runs on this shared machine.

`--bare`: the same, served the same way (`infra.server.serve`, 1 worker), against
`bench/bare_app.py`, a Litestar app with one POST handler and nothing else: what
granian and Litestar cost by themselves, the ceiling the figures above are held to.

`--store-only`: the group commit (`handlers.enqueuing.Enqueuer`) driven directly,
no HTTP at all, `--keyed` with an Idempotency-Key per request; CPU of the process per
enqueue and the mean batch.

`--in-process`: the ASGI app of `infra.app.serving_app` driven directly (no granian,
no sockets), the same producers as coroutines; CPU of this process per POST and
the statements per POST that go through SQLAlchemy (`before_cursor_execute`: not
those run on the driver's cursor, `core.store.driver`). `--fake-store` answers every
POST at once without storing it: the HTTP layer's own cost. `--profile FILE` writes a
cProfile of the event loop's thread.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from bench.http import exchange, free_port
from bench.peer_systems import processes, rows
from bench.sweeper_cpu import server_cpu
from bench.throughput import MODEL, TASKWARD, store
from core.settings import Settings
from core.store.clients import create_client
from core.store.connect import create_db_engine
from core.store.database import Database
from tests.scheduler.processes import environment, wait_until

BODY = json.dumps({"model": MODEL, "input": "words=1"}).encode()
_TICKS = os.sysconf("SC_CLK_TCK")


def request_bytes(token: str) -> bytes:
    return (f"POST /v1/responses HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
            ).encode() + BODY


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds by thread name over the processes `pids` (pool threads summed)."""
    seconds: dict[str, float] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            name = name.rstrip("0123456789_-") or name
            if task.name == str(pid) and pid != pids[0]:
                name = f"{name} main"  # a worker's main thread: its event loop
            seconds[name] = (seconds.get(name, 0.0)
                             + (int(fields[11]) + int(fields[12])) / _TICKS)
    return seconds


async def _produce(port: int, request: bytes, count: int, statuses: Counter[int],
                   latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(count):
            began = time.perf_counter()
            status, _body = await exchange(reader, writer, request)
            latencies.append(time.perf_counter() - began)
            statuses[status] += 1
    finally:
        writer.close()


async def drive(port: int, request: bytes, producers: int, posts: int) -> tuple[
        Counter[int], list[float], float]:
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    start = time.perf_counter()
    await asyncio.gather(*(_produce(port, request, posts // producers, statuses, latencies)
                           for _ in range(producers)))
    return statuses, latencies, time.perf_counter() - start


def commits(settings: Settings) -> int:
    """Committed transactions of the bench's database so far (as the stats know them)."""
    name = settings.database_url.rsplit("/", 1)[1]
    rows(settings.database_url, "SELECT pg_stat_force_next_flush()")
    return int(rows(settings.database_url, "SELECT xact_commit FROM pg_stat_database "
                                           f"WHERE datname = '{name}'")[0][0])


def served(settings: Settings, token: str, workers: int, producers: int, posts: int,
           logs: Path, spy: str | None = None, bare: bool = False) -> dict[str, Any]:
    port = free_port()
    argv = [TASKWARD, "serve", "--port", str(port), "--workers", str(workers)]
    if bare:
        argv = [sys.executable, "-c", "from infra.server import serve; serve("
                f"'bench.bare_app:app', port={port}, workers={workers}, factory=False)"]
    request = request_bytes(token)
    with processes([(argv, environment(settings))], logs, "serve") as [child]:
        wait_until(lambda: _ready(port, "/schema" if bare else "/readyz"), timeout=60,
                   what="the API")
        asyncio.run(drive(port, request, producers, max(400, posts // 5)))  # warm-up
        time.sleep(0.3)
        pids = descendants(child.process.pid)
        database = settings.database_url.rsplit("/", 1)[1]
        before, served_before = thread_cpu(pids), {}
        if not settings.is_sqlite and not bare:
            served_before, commits_before = server_cpu(database), commits(settings)
        spies = [] if spy is None else [subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--gil", "--nonblocking",
             "-r", "200", "--format", "raw", "-o", f"{spy}.{pid}", "--pid", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids[1:]]
        statuses, latencies, wall = asyncio.run(drive(port, request, producers, posts))
        after = thread_cpu(pids)
        for profiler in spies:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=30)
        server_ms = commit_ratio = 0.0
        if not settings.is_sqlite and not bare:
            serving = server_cpu(database)
            server_ms = 1000 * sum(cpu - served_before.get(pid, 0.0)
                                   for pid, cpu in serving.items()) / posts
            commit_ratio = (commits(settings) - commits_before) / posts
    threads = {name: 1000 * (after[name] - before.get(name, 0.0)) / posts for name in after}
    latencies.sort()
    return {"cpu_ms": sum(threads.values()), "threads": threads, "server_ms": server_ms,
            "commits": commit_ratio, "rate": posts / wall, "statuses": dict(statuses),
            "p50_ms": 1000 * latencies[len(latencies) // 2]}


def _ready(port: int, path: str) -> bool:
    import httpx
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def counted_statements(db: Database) -> Iterator[Counter[str]]:
    """Statements sent through SQLAlchemy on `db`, by their first word."""
    seen: Counter[str] = Counter()

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen[statement.split(None, 1)[0].upper()] += 1

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", count)


async def _in_process(settings: Settings, token: str, producers: int, posts: int,
                      profile: str | None, fake_store: bool) -> dict[str, Any]:
    from infra.app import serving_app

    app = serving_app(settings)
    if fake_store:  # every POST answered as if its task had just been committed
        from core.store.new_tasks import Enqueued

        answer = Enqueued("resp_fake", 202, b'{"id":"resp_fake","status":"queued"}')

        async def enqueue(*_: Any) -> Enqueued:
            return answer

        app.state.services.enqueuer.enqueue = enqueue
    headers = [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode()),
               (b"content-type", b"application/json"),
               (b"content-length", str(len(BODY)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/responses", "raw_path": b"/v1/responses", "root_path": "",
             "query_string": b"", "headers": headers, "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 50000)}
    statuses: Counter[int] = Counter()

    async def one() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] += 1

        await app(dict(scope), receive, send)  # type: ignore[arg-type]

    async def producer(count: int) -> None:
        for _ in range(count):
            await one()

    async with app.lifespan():
        db: Database = app.state.services.db
        await asyncio.gather(*(producer(max(50, posts // 10) // producers)
                               for _ in range(producers)))  # warm-up
        with counted_statements(db) as seen:
            profiler = cProfile.Profile() if profile else None
            started, wall = time.process_time(), time.perf_counter()
            loop_started = time.thread_time()
            if profiler:
                profiler.enable()
            await asyncio.gather(*(producer(posts // producers) for _ in range(producers)))
            if profiler and profile:
                profiler.disable()
                profiler.dump_stats(profile)
            cpu, wall = time.process_time() - started, time.perf_counter() - wall
            loop_cpu = time.thread_time() - loop_started
    return {"cpu_ms": 1000 * cpu / posts, "loop_ms": 1000 * loop_cpu / posts,
            "statements": sum(seen.values()) / posts,
            "by_kind": {k: v / posts for k, v in seen.most_common()},
            "rate": posts / wall, "statuses": dict(statuses)}


async def _store_only(settings: Settings, producers: int, posts: int,
                      keyed: bool) -> dict[str, Any]:
    """The group commit alone (`handlers.enqueuing.Enqueuer`, no HTTP): `producers`
    coroutines enqueueing one task after another, each with an Idempotency-Key of its
    own if `keyed`; CPU of this process (all threads: the writer thread's too) per
    enqueue, and the mean batch."""
    from core.idempotency import IdempotencyClaim
    from core.store.births import NewTask
    from handlers.enqueuing import Enqueuer

    db = Database(create_db_engine(settings))
    enqueuer = Enqueuer(db, idempotency_ttl_ms=3_600_000)
    request = json.dumps({"model": MODEL, "input": "words=1", "seed": 1})
    keys = iter(range(10**9))
    batches: list[int] = []
    taking = enqueuer._take

    def counted() -> Any:
        batch = taking()
        batches.append(len(batch))
        return batch

    enqueuer._take = counted  # type: ignore[method-assign]

    async def producer(count: int) -> None:
        for _ in range(count):
            claim = IdempotencyClaim(f"k{next(keys)}", "digest") if keyed else None
            await enqueuer.enqueue(NewTask(client_id="bench", model=MODEL,
                                           request_json=request), claim)

    try:
        await asyncio.gather(*(producer(max(50, posts // 10) // producers)
                               for _ in range(producers)))  # warm-up
        batches.clear()
        started, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(producer(posts // producers) for _ in range(producers)))
        cpu, wall = time.process_time() - started, time.perf_counter() - wall
    finally:
        await enqueuer.close()
        db.dispose()
    return {"cpu_ms": 1000 * cpu / posts, "rate": posts / wall,
            "batch": sum(batches) / max(1, len(batches))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--posts", type=int, default=3000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--stores", default="postgresql,sqlite")
    parser.add_argument("--workers", type=int, default=0,
                        help="serve workers (default: 1, as `taskward serve` and bench.peers)")
    parser.add_argument("--bare", action="store_true",
                        help="served: bench/bare_app.py instead of taskward (1 worker "
                        "unless --workers; --stores then only names the run)")
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--profile", help="with --in-process: cProfile output file")
    parser.add_argument("--fake-store", action="store_true",
                        help="with --in-process: the group commit answers at once, "
                        "storing nothing (the HTTP layer's own cost)")
    parser.add_argument("--store-only", action="store_true",
                        help="the group commit alone, no HTTP: CPU of the process per "
                        "enqueue (--producers 2 gives PostgreSQL's served batches of ~2)")
    parser.add_argument("--keyed", action="store_true",
                        help="with --store-only: an Idempotency-Key per request")
    parser.add_argument("--spy", help="served: py-spy's raw --gil samples of each serve "
                        "worker into FILE.<store>.<pid> (the CPU figures are then inflated)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="taskward-enqueue-cpu-") as tmp:
        for kind in args.stores.split(","):
            logs = Path(tmp) / f"logs-{kind}"
            logs.mkdir()
            with store(kind, Path(tmp)) as settings:
                db = Database(create_db_engine(settings))
                token = create_client(db, name="bench",
                                      scopes=frozenset({"responses:create"})).token
                with db.read() as conn:
                    conn.execute(text("SELECT 1"))
                db.dispose()
                if args.store_only:
                    import uvloop
                    figures = uvloop.run(_store_only(settings, args.producers, args.posts,
                                                     args.keyed))
                    print(f"{kind:10} store only{' (keyed)' if args.keyed else ''}: "
                          f"{figures['cpu_ms']:.3f} CPU-ms/enqueue, mean batch "
                          f"{figures['batch']:.2f}, {figures['rate']:.0f}/s", flush=True)
                    continue
                if args.in_process:
                    import uvloop
                    figures = uvloop.run(_in_process(settings, token, args.producers,
                                                     args.posts, args.profile,
                                                     args.fake_store))
                    print(f"{kind:10} in-process: {figures['cpu_ms']:.3f} CPU-ms/POST "
                          f"(event loop's thread {figures['loop_ms']:.3f}), "
                          f"{figures['statements']:.2f} statements/POST {figures['by_kind']}, "
                          f"{figures['rate']:.0f}/s, {figures['statuses']}", flush=True)
                    continue
                workers = args.workers or 1
                figures = served(settings, token, workers, args.producers, args.posts, logs,
                                 args.spy and f"{args.spy}.{kind}", args.bare)
                kind = "bare" if args.bare else kind
                threads = ", ".join(f"{name} {ms:.3f}" for name, ms in
                                    sorted(figures["threads"].items(), key=lambda x: -x[1])
                                    if ms >= 0.005)
                print(f"{kind:10} served x{workers}: {figures['cpu_ms']:.3f} CPU-ms/POST "
                      f"({threads}); db server {figures['server_ms']:.3f}; "
                      f"commits/POST {figures['commits']:.3f}; {figures['rate']:.0f}/s "
                      f"p50 {figures['p50_ms']:.1f} ms {figures['statuses']}; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
