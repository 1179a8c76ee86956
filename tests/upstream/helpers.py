"""Set-up shared by the upstream tests: an upstream entry and tasks for it, and a
certificate for a TLS stand-in."""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path
from typing import Any

from core.models_registry import register_upstream
from core.states import OnRestart
from core.store.births import NewTask, insert_task
from core.store.database import Database

MODEL = "smol"
COUNTING = "Count from one to twenty in words, separated by commas."


def add_upstream(db: Database, base_urls: list[str], **options: Any) -> str:
    register_upstream(db, MODEL, base_urls=base_urls, model="smollm2", **options)
    return MODEL


def enqueue(
    db: Database, count: int = 1, *, model: str = MODEL, on_restart: OnRestart = OnRestart.RETRY,
    max_attempts: int = 3, **request: Any,
) -> list[str]:
    """`count` tasks (greedy unless told otherwise) in one transaction."""
    body = json.dumps({"model": model, "input": COUNTING, "temperature": 0, **request})
    with db.write() as conn:
        now = db.clock.now_ms()
        rows = [insert_task(db, conn, NewTask(client_id="client-a", model=model,
                                              request_json=body, on_restart=on_restart,
                                              max_attempts=max_attempts), now)
                for _ in range(count)]
        db.announce_work(conn)
    return [row.id for row in rows if row is not None]


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A key and a certificate for 127.0.0.1, valid for a day, written into `folder`."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return key, cert


def serving_tls(key: Path, cert: Path) -> ssl.SSLContext:
    """A TLS stand-in's server side, presenting `cert` (`self_signed`)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
