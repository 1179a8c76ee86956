"""HTTP figures of the API beside the store-level enqueue rate, in one run.

Run from the repository root: `.venv/bin/python -m bench.http [--seconds 10]`.
It migrates a fresh SQLite file (synchronous=FULL), measures `enqueue` (with an
idempotency key) straight on the store in this process, then starts `taskward serve
--workers 2` and drives it from a load generator in this process:
- `POST /v1/responses` (asynchronous, a fresh `Idempotency-Key` per request);
- `GET /v1/tasks/{id}` of tasks created in the first phase;
each over `--connections` keep-alive connections (default 64) from loopback, printing
requests/s and p50/p99 latency of the requests served (202, 200), and every status
answered (a refusal counts there only). With `--compare-timeouts` the two phases also run,
in the same run and over the same store, against a server whose slow-client timeouts
are off (`TASKWARD_HTTP_IDLE_TIMEOUT_SECONDS=0`, `TASKWARD_HTTP_BODY_TIMEOUT_SECONDS=0`:
granian's auto HTTP mode, no bounded body reads), the behaviour before they existed.
The generator is a minimal HTTP/1.1 client on asyncio
streams (uvloop when available): httpx costs more CPU per request than the server, and
the server, the generator and the store share the same cores.
The machine is shared and noisy: compare figures within one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

import tests.engines  # noqa: F401  registers the `test.words` engine its model names
from bench.store import rate
from core.clients import ADMIN
from core.idempotency import IdempotencyClaim
from core.models_registry import register
from core.settings import Settings
from core.store import births, new_tasks
from core.store.clients import create_client
from core.store.connect import open_database
from infra.migrate import upgrade

BODY = json.dumps({"model": "bench", "input": "words=3"}).encode()


@dataclass
class Run:
    """One load phase. `latencies` are those of the answers with the `ok` status only:
    a refusal (a 429, a 5xx) is not a request served, its time is not an
    acknowledgement's; `statuses` counts every answer."""

    ok: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    task_ids: list[str] = field(default_factory=list)

    def line(self, name: str) -> str:
        ordered = sorted(self.latencies)
        count = len(ordered)
        p50 = ordered[count // 2] * 1000 if count else 0.0
        p99 = ordered[min(count - 1, int(count * 0.99))] * 1000 if count else 0.0
        return (f"{name:28} {count / self.seconds:8.0f} req/s   p50 {p50:6.1f} ms   "
                f"p99 {p99:6.1f} ms   statuses {dict(sorted(self.statuses.items()))}")


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


async def _connection(port: int, build: object, run: Run, deadline: float,
                      keep_ids: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            request = build()  # type: ignore[operator]
            began = time.perf_counter()
            status, body = await exchange(reader, writer, request)
            elapsed = time.perf_counter() - began
            run.statuses[status] = run.statuses.get(status, 0) + 1
            if status == run.ok:
                run.latencies.append(elapsed)
                if keep_ids:
                    run.task_ids.append(json.loads(body)["id"])
    finally:
        writer.close()


async def load(port: int, build: object, connections: int, seconds: float, *, ok: int,
               keep_ids: bool = False) -> Run:
    """`connections` closed loops for `seconds`; `ok` is the status of a served request."""
    run = Run(ok)
    start = time.perf_counter()
    await asyncio.gather(*(_connection(port, build, run, start + seconds, keep_ids)
                           for _ in range(connections)))
    run.seconds = time.perf_counter() - start
    return run


def post_request(token: str) -> bytes:
    head = (f"POST /v1/responses HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nIdempotency-Key: {secrets.token_hex(12)}\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n")
    return head.encode() + BODY


def get_request(token: str, task_id: str) -> bytes:
    return (f"GET /v1/tasks/{task_id} HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer {token}\r\n\r\n").encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(env: dict[str, str], port: int, workers: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("taskward")), "serve", "--port", str(port),
         "--workers", str(workers)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("taskward serve did not become ready in 30 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--store-count", type=int, default=2000)
    parser.add_argument("--compare-timeouts", action="store_true",
                        help="also measure a server with the slow-client timeouts off")
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = Path(tmp, "models")
        models_dir.mkdir()
        Path(models_dir, "bench.bin").write_bytes(b"bench")
        env = {**os.environ, "TASKWARD_DATABASE_URL": f"sqlite:///{tmp}/bench.db",
               "TASKWARD_MODELS_DIR": str(models_dir), "TASKWARD_SQLITE_SYNCHRONOUS": "FULL"}
        settings = Settings(database_url=env["TASKWARD_DATABASE_URL"], models_dir=models_dir)
        db = open_database(settings)
        upgrade(db.engine)
        register(db, models_dir, "bench.bin", engine="test.words")
        token = create_client(db, name="bench", scopes=frozenset({ADMIN})).token
        request_json = json.dumps({"model": "bench", "input": "words=3"})
        store_rate = rate(args.store_count, lambda i: new_tasks.enqueue(
            db, births.NewTask(client_id="store-bench", model="bench",
                                  request_json=request_json),
            idempotency=IdempotencyClaim(f"store-{i}", "digest")))
        db.dispose()

        servers = [("timeouts on (defaults)", env)]
        if args.compare_timeouts:
            servers.append(("timeouts off", {**env, "TASKWARD_HTTP_IDLE_TIMEOUT_SECONDS": "0",
                                             "TASKWARD_HTTP_BODY_TIMEOUT_SECONDS": "0"}))
        results = [(label, *measure(server_env, token, args)) for label, server_env in servers]
    print(f"SQLite synchronous=FULL, {args.workers} granian workers, "
          f"{args.connections} connections, {args.seconds:.0f} s per phase")
    print(f"{'store enqueue (1 thread)':28} {store_rate:8.0f} ops/s")
    for label, posts, gets in results:
        if len(results) > 1:
            print(f"-- server with {label}")
        print(posts.line("HTTP POST /v1/responses"))
        print(f"{'':28} {len(posts.latencies) / posts.seconds / store_rate:8.2f} x store enqueue")
        print(gets.line("HTTP GET /v1/tasks/{id}"))


def measure(env: dict[str, str], token: str, args: argparse.Namespace) -> tuple[Run, Run]:
    """The POST phase, then the GET phase over the tasks it created, on a fresh server."""
    port = free_port()
    server = start_server(env, port, args.workers)
    try:
        posts = asyncio.run(load(port, lambda: post_request(token), args.connections,
                                 args.seconds, ok=202, keep_ids=True))
        ids = posts.task_ids or ["resp_missing"]
        counter = iter(range(10**12))
        gets = asyncio.run(load(
            port, lambda: get_request(token, ids[next(counter) % len(ids)]),
            args.connections, args.seconds, ok=200))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return posts, gets


if __name__ == "__main__":
    main()
