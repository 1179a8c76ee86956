"""kill -9 of `taskward serve` in the middle of a burst of POSTs, then a restart.

The promise under test: a 202 means the task is stored (the API's group commit answers
only after its commit), and a client that retries with its Idempotency-Key after the
crash gets exactly one task per key, whether or not it heard the first answer.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from subprocess import Popen

import httpx
from sqlalchemy import select

from core.settings import Settings
from core.store.database import Database
from core.tables import tasks
from tests.api.helpers import register_test_model
from tests.api.served import Service, process, service_env, wait_ready
from tests.scheduler.processes import free_port, group_alive, wait_until

KEYS = [f"burst-{n}" for n in range(600)]
CLIENTS = 8
KILL_AFTER_ANSWERS = 150


def serve(stack: ExitStack, env: dict[str, str], log: Path) -> tuple[str, Popen[bytes]]:
    """Start `taskward serve --workers 2`; its base URL and process (a group leader)."""
    port = free_port()
    child = stack.enter_context(process(["serve", "--port", str(port), "--workers", "2"],
                                        env, log))
    base_url = f"http://127.0.0.1:{port}"
    wait_ready(base_url, child, log)
    return base_url, child


def post(client: httpx.Client, base_url: str, key: str) -> httpx.Response:
    return client.post(f"{base_url}/v1/responses", headers={"Idempotency-Key": key},
                       json={"model": "words", "input": f"words=2 {key}"})


def test_every_202_survives_a_kill_9_and_retried_keys_make_one_task_each(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    register_test_model(db, settings.models_dir)
    env = service_env(settings.database_url, settings.models_dir)
    issued = Service("", env).cli_json("pair", "--token", "--scopes", "responses:create")
    auth = {"Authorization": f"Bearer {issued['token']}"}  # type: ignore[index]
    acknowledged: dict[str, str] = {}
    lock = threading.Lock()

    with ExitStack() as stack, httpx.Client(headers=auth, timeout=10) as client:
        base_url, server = serve(stack, env, tmp_path / "serve-1.log")

        def first_try(key: str) -> None:
            try:
                answer = post(client, base_url, key)
            except httpx.HTTPError:
                return  # no answer: the client cannot know, and will retry
            if answer.status_code == 202:
                with lock:
                    acknowledged[key] = answer.json()["id"]

        with ThreadPoolExecutor(CLIENTS) as pool:
            burst = [pool.submit(first_try, key) for key in KEYS]
            wait_until(lambda: len(acknowledged) >= KILL_AFTER_ANSWERS, timeout=60,
                       what="the burst under way")
            os.killpg(server.pid, signal.SIGKILL)  # granian and both its workers
            server.wait(timeout=10)
            wait_until(lambda: not group_alive(server.pid), timeout=10,
                       what="the server's workers to die")
            for attempt in burst:
                attempt.result()
        assert KILL_AFTER_ANSWERS <= len(acknowledged) < len(KEYS)  # killed mid-burst

        with db.read() as conn:  # before any retry: every 202 is already stored
            stored = set(conn.execute(select(tasks.c.id)).scalars())
        assert set(acknowledged.values()) <= stored

        base_url, _ = serve(stack, env, tmp_path / "serve-2.log")
        with ThreadPoolExecutor(CLIENTS) as pool:
            retried = dict(zip(KEYS, pool.map(lambda key: post(client, base_url, key), KEYS)))

    assert {answer.status_code for answer in retried.values()} == {202}
    final = {key: answer.json()["id"] for key, answer in retried.items()}
    assert {key: final[key] for key in acknowledged} == acknowledged
    assert all(retried[key].headers.get("Idempotent-Replayed") == "true" for key in acknowledged)
    with db.read() as conn:
        assert sorted(conn.execute(select(tasks.c.id)).scalars()) == sorted(set(final.values()))
    assert len(set(final.values())) == len(KEYS)
