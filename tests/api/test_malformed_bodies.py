"""A chunked body the server cannot frame is answered truthfully: granian reports it as a
client that left, so `400 client_disconnected` may reach a client that is still there,
and its detail must hold for both. Not a store test: one SQLite file is enough.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.served import process, service_env, wait_ready
from tests.databases import copy_sqlite
from tests.scheduler.processes import free_port

HEAD = (b"POST /v1/pair HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[int]:
    workdir = tmp_path_factory.mktemp("malformed-bodies")
    env = service_env(copy_sqlite(sqlite_template, workdir / "taskward.db"), workdir / "models")
    port, log = free_port(), workdir / "serve.log"
    with process(["serve", "--port", str(port)], env, log) as child:
        wait_ready(f"http://127.0.0.1:{port}", child, log)
        yield port


def answer_to(port: int, sent: bytes) -> tuple[bytes, dict[str, object]]:
    """The status line and the problem document the server answers to `sent`."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(sent)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body)


@pytest.mark.parametrize("body", [
    b"zz\r\n{}\r\n0\r\n\r\n",  # a chunk size that is not hexadecimal
    b"2;" + b"e" * 100_000 + b"\r\n{}\r\n0\r\n\r\n",  # a chunk extension without end
], ids=["chunk-size", "chunk-extension"])
def test_a_body_that_cannot_be_framed_is_told_so(port: int, body: bytes) -> None:
    status, problem = answer_to(port, HEAD + body)
    assert status == b"HTTP/1.1 400 Bad Request"
    assert problem["code"] == "client_disconnected"
    assert problem["detail"] == ("the request body could not be read: the client left or "
                                 "sent a malformed body")
