"""Fixtures of the upstream tests: real `llama-server` processes (tests/upstream/llama.py)
and a `taskward` service whose model `smol` is an upstream entry pointing at them."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from core.engines.registry import register_engine
from core.engines.upstream.engine import NAME, OpenAIEngine
from core.settings import Settings
from tests.upstream.llama import LlamaServer
from tests.upstream.scripted import Scripted


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One server with two slots for the module's tests."""
    server = LlamaServer(tmp_path_factory.mktemp("llama"), parallel=2).start()
    yield server
    server.kill9()


@pytest.fixture
def llamas(tmp_path: Path) -> Iterator[list[LlamaServer]]:
    """Servers a test starts (and may kill) itself: append started ones."""
    started: list[LlamaServer] = []
    yield started
    for server in started:
        server.kill9()


@pytest.fixture
def quick(settings: Settings) -> Settings:
    """Settings scaled down so leases, backoff and cool-downs happen in test time."""
    return replace(settings, lease_seconds=5, heartbeat_seconds=1, flush_interval_ms=50,
                   backoff_base_seconds=0.05, backoff_max_seconds=0.2, drain_seconds=2,
                   poll_interval_ms=20, upstream_cooldown_seconds=0.05)


@pytest.fixture(autouse=True)
def fresh_openai_engine() -> None:
    """The registry keeps one engine per process, built from the first settings it sees
    (a process has one set); each in-process test gets one built from its own."""
    register_engine(NAME, OpenAIEngine)


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    """Stand-in upstreams (tests/upstream/scripted.py) a test starts; stopped after it."""
    servers: list[Scripted] = []

    def make(reads: list[bytes], pause: float = 0.05, headers: bytes = b"",
             keep_alive: bool = False, tls: ssl.SSLContext | None = None) -> Scripted:
        servers.append(Scripted(reads, pause, headers, keep_alive, tls))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()
