"""An upstream served over TLS with a certificate of a private CA (an in-house vLLM
behind its own CA, say): a sweeper whose environment names that CA in `SSL_CERT_FILE`
runs tasks through it, on the real llama-server serving HTTPS. The error a process
that does not trust it reports is in test_errors.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from tests.scheduler.helpers import output_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import task_row
from tests.upstream.helpers import COUNTING, add_upstream, enqueue, self_signed
from tests.upstream.llama import LlamaServer
from tests.upstream.served import sweeper, upstream_env


def test_a_sweeper_trusts_the_ca_that_ssl_cert_file_names(
    db: Database, settings: Settings, tmp_path: Path, llamas: list[LlamaServer]
) -> None:
    key, cert = self_signed(tmp_path)
    server = LlamaServer(tmp_path / "llama", parallel=1, tls=(cert, key)).start()
    llamas.append(server)
    add_upstream(db, [server.base_url])
    [task_id] = enqueue(db, max_output_tokens=8)
    env = {**upstream_env(settings.database_url, tmp_path), "SSL_CERT_FILE": str(cert)}
    env.pop("SSL_CERT_DIR", None)
    child = sweeper(env, tmp_path / "sweeper.log")
    try:
        wait_until(lambda: task_row(db, task_id).status == Status.COMPLETED, timeout=60,
                   what="the task to complete over TLS")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)

    direct = httpx.post(f"{server.base_url}/chat/completions", timeout=60, verify=server.verify,
                        json={"model": "smollm2", "temperature": 0, "max_tokens": 8,
                              "messages": [{"role": "user", "content": COUNTING}]}).json()
    assert task_row(db, task_id).attempts == 1
    assert output_text(db, task_id) == direct["choices"][0]["message"]["content"]
