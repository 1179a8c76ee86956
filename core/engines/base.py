"""The engine plug-in contract.

An engine turns a model file into a loaded model (state `loading`) and a loaded model
turns a request into text chunks (state `running`). The worker in `scheduler/` owns
threads, fencing and events; an engine owns only inference, so a new engine is one
module that implements these two small protocols and registers a factory.

Resume is part of the contract: every chunk carries the snapshot *after* it, and
`generate(request, snapshot)` continues exactly from that point, never repeating or
dropping text. A snapshot is a JSON-serialisable dict opaque to everyone but its engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Snapshot = dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """Token counts of one response, cumulative over all its attempts."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class GenerationRequest:
    """What an engine needs from a stored `POST /v1/responses` body.

    `messages` already holds `instructions` as a leading system message. A sampling
    field left None is the model entry's default (`core.engines.sampling`), else the
    engine's own; `temperature` 0 means greedy decoding.
    """

    messages: list[dict[str, str]]
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    top_k: int | None = None
    repeat_penalty: float | None = None


@dataclass(frozen=True)
class Chunk:
    """A piece of generated text and the state needed to continue right after it.

    The snapshot is written as JSON when the attempt's output is flushed; a value JSON
    has no form for is written as its `str`, so an engine may hand over a large part of
    it as a view made into text only then (the upstream engine's text so far)."""

    text: str
    snapshot: Snapshot
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class ModelFile:
    """A verified model file: the worker checks the digest before handing it over.

    `metadata` is the registry entry's, where sampling defaults live; engines cache
    loaded models by `sha256` alone, so two entries of one file share a loaded model.
    """

    model_id: str
    path: Path
    sha256: str
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class UpstreamModel:
    """An upstream entry: inference servers the user runs, reached over OpenAI's Chat
    Completions (docs/upstream.md). `api_key_env` names the variable holding the key;
    the key itself is read only when a request is sent."""

    model_id: str
    base_urls: tuple[str, ...]
    model: str
    api_key_env: str | None
    max_concurrency: int
    timeout_seconds: float


ModelSource = ModelFile | UpstreamModel
"""What an engine loads: a verified file, or the servers of an upstream entry."""


class EngineError(Exception):
    """A failure of inference with a stable code; `retryable` decides backoff vs fail.

    `retry_after_seconds` is the shortest wait before the next attempt (an upstream's
    `Retry-After`, say): the backoff never goes below it.
    """

    def __init__(
        self, code: str, message: str, *, retryable: bool,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_seconds = retry_after_seconds


class NotStarted(EngineError):
    """The engine could start nothing and sent no work anywhere (an upstream entry whose
    every URL is cooling down): not a failure of the task, and no attempt spent. The
    worker hands the task back with the attempt refunded, due again in
    `retry_after_seconds`."""

    def __init__(self, code: str, message: str, *, retry_after_seconds: float) -> None:
        super().__init__(code, message, retryable=True,
                         retry_after_seconds=retry_after_seconds)


Emit = Callable[[Chunk], None]
# May the producer hand on more? False holds it until the wake-up it passed is called.
Room = Callable[[Callable[[], None]], bool]


@runtime_checkable
class HoldsBack(Protocol):
    """An `emit` that can ask its producer to hold back (the attempt's inbox,
    `scheduler.inbox.Intake`). `room(wake)` is True while it can take more; False while
    it holds more than its bound, and then `wake` is called once (from the thread that
    takes) when it can again: a `Room`. A producer that can wait without a thread of its
    own asks after handing chunks on (the upstream engine's network loop)."""

    def __call__(self, chunk: Chunk) -> None: ...

    def room(self, wake: Callable[[], None]) -> bool: ...


@runtime_checkable
class ExcludesWaits(Protocol):
    """A `should_stop` that keeps apart the time its attempt waits for room inside the
    engine (the local engine's KV cells, until others leave): the engine calls
    `waiting(True)` as such a wait begins and `waiting(False)` once the attempt runs.
    The attempt's execution timeout does not count the wait (`scheduler.attempt`); the
    poll itself goes on, so a cancel, a lost lease or a hand-back stops a waiting
    attempt as soon as a running one."""

    def __call__(self) -> bool: ...

    def waiting(self, waiting: bool) -> None: ...


class LoadedModel(Protocol):
    def generate(
        self,
        request: GenerationRequest,
        snapshot: Snapshot | None,
        should_stop: Callable[[], bool],
        emit: Emit | None = None,
    ) -> Iterator[Chunk]:
        """Yield chunks until end of generation, the token limit or `should_stop()`.

        Blocking; the worker runs it in a thread. `should_stop` is polled between tokens.
        `emit`, when given, may take chunks instead of the iterator, called from any
        thread (the upstream engine's network loop, sparing its thread a wake-up per
        read): in order with the yielded ones, and never after `generate` returns.
        An engine producing on the calling thread ignores it.
        """
        ...


class Engine(Protocol):
    name: str

    def load(self, model: ModelSource) -> LoadedModel:
        """Load (or take from the per-process cache) a model. Blocking."""
        ...


CGROUP_ROOT = Path("/sys/fs/cgroup")  # where cgroup v2 is mounted


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), not the machine's count,
    and no more than a cgroup CPU quota grants it (a container's `--cpus`, a systemd
    unit's `CPUQuota`): threads beyond the quota are throttled together, and a compute
    step that waits at its barriers for a throttled thread stalls them all."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(CGROUP_ROOT, _own_cgroup())
    return cores if quota is None else min(cores, quota)


def _own_cgroup() -> str:
    """This process's cgroup v2 path ("/" where it has none, or only cgroup v1)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    return next((line[3:] for line in lines if line.startswith("0::")), "/")


def cgroup_cpu_quota(root: Path, cgroup: str) -> int | None:
    """Whole cores the tightest `cpu.max` ("QUOTA PERIOD", or "max PERIOD": none) grants
    from `cgroup` up to the hierarchy's `root`, at least 1; None without a quota."""
    tightest: int | None = None
    directory = root / cgroup.strip("/")
    while True:
        try:
            quota, period = (directory / "cpu.max").read_text().split()
            cores = max(1, int(quota) // int(period))
        except (OSError, ValueError):  # no file (the root), "max", or unreadable
            cores = None
        if cores is not None and (tightest is None or cores < tightest):
            tightest = cores
        if directory == root or root not in directory.parents:
            return tightest
        directory = directory.parent


@dataclass(frozen=True)
class EngineOptions:
    """Process-wide engine knobs, taken from Settings by whoever builds engines.

    `threads` is what one loaded model's decode loop computes with, however many
    attempts it serves, and (the loops taking turns) what the process computes with,
    however many models are in use; `sequences` is how many attempts one loop decodes
    at once (the worker's slots); `context_tokens` is the KV cache one loop shares
    among them (at most the model's training context); `host_lock` is a file that
    every taskward process naming it locks around each compute step (None: no such
    lock).
    """

    threads: int = field(default_factory=usable_cores)
    cache_size: int = 2
    sequences: int = 8
    context_tokens: int = 8192
    host_lock: Path | None = None
    upstream_allowed_hosts: tuple[str, ...] = ()  # host patterns; empty: any host
    upstream_key_envs: tuple[str, ...] = ()  # api_key_env patterns; empty: any allowed name
    upstream_cooldown_seconds: float = 10.0
    upstream_concurrency: int = 64  # the HTTP pool's connections to all upstreams


EngineFactory = Callable[[EngineOptions], Engine]


def storable(text: str) -> str:
    """`text` with every lone surrogate and every NUL made U+FFFD, as an upstream's
    undecodable bytes are (`core.engines.upstream.protocol.payload`): what an engine
    stores, and what the local engine hands llama.cpp, whose C strings end at a NUL.

    JSON may escape either (`"\\ud800"`, `"\\u0000"`) and Python's parser keeps it, but
    no UTF-8 text holds a lone surrogate (the attempt failed where its output is
    measured and stored) and no PostgreSQL text holds a NUL (the attempt's write was
    refused; SQLite stored it): from a broken or hostile upstream, again on every
    retry. A valid pair is one character by then, so only lone ones change."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text
