"""`serve` and `run` listen only where nothing else does, on an address of this machine
(docs/cli.md): real `taskward` processes on random loopback ports.

granian binds with SO_REUSEPORT, so a second server on a taken port used to start and
share it (a `run` on another store answered some of the first one's requests); a host
that was not an IP address, or not one of this machine's, was a traceback or a panic.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.served import TASKWARD, process, service_env, wait_ready
from tests.databases import copy_sqlite
from tests.scheduler.processes import free_port

COMMANDS = ["serve", "run"]
NOT_OURS = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine


@dataclass(frozen=True)
class Held:
    """A `taskward serve` listening on `port`, and the environment of its store."""

    port: int
    server: subprocess.Popen[bytes]
    env: dict[str, str]

    def still_serves(self) -> bool:
        answer = httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=5)
        return self.server.poll() is None and answer.status_code == 200


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Held]:
    workdir = tmp_path_factory.mktemp("held")
    env = service_env(copy_sqlite(sqlite_template, workdir / "taskward.db"), workdir / "models")
    port = free_port()
    with process(["serve", "--port", str(port)], env, workdir / "serve.log") as server:
        wait_ready(f"http://127.0.0.1:{port}", server, workdir / "serve.log")
        yield Held(port, server, env)


@pytest.fixture
def fresh_store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A store that does not exist yet (`run` would create and migrate it), its env."""
    path = tmp_path / "fresh.db"
    return path, service_env(f"sqlite:///{path}", tmp_path / "models")


def taskward(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a command that must end by itself. A server that starts instead is a timeout,
    and its whole process group (granian's workers too) is killed."""
    with subprocess.Popen([TASKWARD, *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def in_use(port: int) -> str:
    return (f"Error: 127.0.0.1:{port} is already in use (another taskward or another "
            "program listens there); stop it or choose another --port")


def test_a_second_serve_on_a_port_a_serve_holds_is_refused_and_the_first_keeps_serving(
        held: Held, tmp_path: Path) -> None:
    started = time.monotonic()
    done = taskward(held.env, tmp_path, "serve", "--port", str(held.port))
    assert (done.returncode, done.stderr.splitlines()) == (1, [in_use(held.port)])
    assert time.monotonic() - started < 10
    assert held.still_serves()


def test_run_on_a_port_a_serve_holds_is_refused_before_it_touches_its_store(
        held: Held, fresh_store: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    path, env = fresh_store
    done = taskward(env, tmp_path, "run", "--port", str(held.port))
    assert (done.returncode, done.stderr.splitlines()) == (1, [in_use(held.port)])
    assert done.stdout == ""  # no schema line, no default model, no pairing code
    assert not path.exists()
    assert held.still_serves()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_port_another_program_listens_on_is_refused(
        command: str, held: Held, tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = taskward(held.env, tmp_path, command, "--port", str(port))
    assert (done.returncode, done.stderr.splitlines()) == (1, [in_use(port)])


@pytest.mark.parametrize("command", COMMANDS)
def test_a_host_that_is_not_an_ip_address_is_a_usage_error(
        command: str, held: Held, tmp_path: Path) -> None:
    done = taskward(held.env, tmp_path, command, "--host", "no.such.host.invalid")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--host': 'no.such.host.invalid' is not an IP address "
        "(e.g. 127.0.0.1, 0.0.0.0, ::1)")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_an_address_not_of_this_machine_is_refused_with_one_line(
        command: str, held: Held, tmp_path: Path) -> None:
    done = taskward(held.env, tmp_path, command, "--host", NOT_OURS,
                    "--port", str(free_port()))
    assert (done.returncode, done.stderr.splitlines()) == (1, [
        f"Error: cannot listen on {NOT_OURS}: Cannot assign requested address; --host must "
        "be an IP address of this machine"])


@pytest.mark.parametrize("command", COMMANDS)
def test_a_port_beyond_65535_is_a_usage_error_before_anything_is_written(
        command: str, fresh_store: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    path, env = fresh_store
    done = taskward(env, tmp_path, command, "--port", "70000")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--port': 70000 is not in the range 0<=x<=65535.")
    assert done.stdout == "" and not path.exists()
