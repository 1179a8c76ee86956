"""`taskward run` with the real default model on a data directory of its own, and the
HTTP calls a client makes to it. Shared by `tests/service` and `bench/service.py`.

Processes are started and killed through `tests.scheduler.processes.Children` (whole
process group, SIGKILL); every wait here is bounded.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from core.model_files import DEFAULT_MODEL_ID
from core.objects import TERMINAL_EVENTS
from core.settings import Settings
from tests.scheduler.processes import Children, environment, free_port, wait_until

STORY = {
    "instructions": "You are a storyteller.",
    "input": "Tell a long story about a lighthouse keeper.",
    "temperature": 0,
}
TERMINAL_STATUSES = {"completed", "failed", "cancelled"}
_ADMIN_CODE = re.compile(r"admin pairing code [^:]*: (\S+)")


def run_env(data_dir: Path, **settings: object) -> dict[str, str]:
    """The environment of a `taskward run` that keeps its SQLite store and models under
    `data_dir`, with only the product engines (no test plug-ins)."""
    base = Settings(database_url=f"sqlite:///{data_dir / 'taskward.db'}",
                    models_dir=data_dir / "models", node_id="service-tests")
    env = environment(base, engine_modules="", **settings)
    env["PYTHONUNBUFFERED"] = "1"  # the admin code line must reach the log at once
    return env


@dataclass(frozen=True)
class Running:
    """One `taskward run` child: its process group, address and console log."""

    children: Children
    index: int
    process: subprocess.Popen[bytes]
    base_url: str
    env: dict[str, str]

    def kill9(self) -> None:
        """SIGKILL the whole process group (granian's worker included) and reap it."""
        self.children.kill9(self.process)

    def log(self) -> str:
        return self.children.log_of(self.index)

    def admin_code(self) -> str:
        found = _ADMIN_CODE.search(self.log())
        assert found, f"no admin pairing code printed:\n{self.log()[-2000:]}"
        return found.group(1)

    def pair(self) -> str:
        """Redeem the printed admin code over HTTP; the new client's bearer token."""
        with httpx.Client(base_url=self.base_url, timeout=10) as anonymous:
            answer = anonymous.post("/v1/pair", json={"code": self.admin_code()})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(90),
                            headers={"Authorization": f"Bearer {token}"})


class Runs:
    """Starts `taskward run` children through one `Children` owned by the caller alone
    (log indexes are counted here)."""

    def __init__(self, children: Children) -> None:
        self.children = children
        self._started = 0

    def start(self, env: dict[str, str], *, ready_seconds: float = 60,
              wrapper: Sequence[str] = ()) -> Running:
        port = free_port()
        child = self.children.start(env, "run", "--port", str(port), wrapper=wrapper)
        running = Running(self.children, self._started, child,
                          f"http://127.0.0.1:{port}", env)
        self._started += 1

        def ready() -> bool:
            if child.poll() is not None:
                raise AssertionError(f"taskward run exited:\n{running.log()[-3000:]}")
            try:
                return httpx.get(f"{running.base_url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=ready_seconds, what="`taskward run` to be ready")
        return running


def create(client: httpx.Client, **body: Any) -> dict[str, Any]:
    """`POST /v1/responses` for the default model (unless `model` is given); 202 body."""
    answer = client.post("/v1/responses", json={"model": DEFAULT_MODEL_ID, **body})
    assert answer.status_code == 202, answer.text
    return dict(answer.json())


def finished(client: httpx.Client, task_id: str, *, seconds: float = 60) -> dict[str, Any]:
    """The task once terminal, long-polling with `?wait=`; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"task {task_id} not finished within {seconds}s")
        task = client.get(f"/v1/tasks/{task_id}", params={"wait": min(60, max(1, left))})
        assert task.status_code == 200, task.text
        if task.json()["status"] in TERMINAL_STATUSES:
            return dict(task.json())


def events(client: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    """The whole event log so far, page by page."""
    collected: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = client.get(f"/v1/tasks/{task_id}/events", params={"after": after, "limit": 1000})
        assert page.status_code == 200, page.text
        body = page.json()
        collected += body["data"]
        if not body["data"]:
            break
        after = body["next_after"]
    return collected


def deltas(log: list[dict[str, Any]]) -> str:
    """What a client following the log has read: every delta, in order."""
    return "".join(e["data"]["delta"] for e in log if e["type"] == "response.output_text.delta")


def output_text(response: dict[str, Any]) -> str:
    """The text of a response object's single output_text part ('' before any output)."""
    if not response["output"]:
        return ""
    return str(response["output"][0]["content"][0]["text"])


def response(client: httpx.Client, task_id: str) -> dict[str, Any]:
    answer = client.get(f"/v1/responses/{task_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def assert_log_sound(log: list[dict[str, Any]], last_seq: int) -> None:
    """Gapless seq from 1 up to `last_seq`, `sequence_number` = seq, one terminal, last."""
    assert [e["seq"] for e in log] == list(range(1, last_seq + 1))
    assert all(e["data"]["sequence_number"] == e["seq"] for e in log)
    terminal = [i for i, e in enumerate(log) if e["type"] in TERMINAL_EVENTS]
    assert terminal == [len(log) - 1]
