"""The benchmarks' plug-in engine: the no-op model of `tests/engines.py` that also notes
each generation as it is entered, the way the peers' job functions note theirs
(`bench/peer_drivers/common.py`, `Executions`).

Loaded into `taskward sweeper` / `taskward run` through the public
`TASKWARD_ENGINE_MODULES=bench.noop_engine`; models registered with engine `bench.noop`.
Each call to `generate` appends `<job> <epoch>` (the request's `job=` directive, the
wall clock with sub-millisecond digits) to the file named by `BENCH_EXECUTIONS_LOG`,
in one unbuffered append, before any output: the bench takes a task's start, a
process's first job and the count of executions from these lines, outside taskward's
own records, so taskward is stamped where the peers are and a second run of a task
inside one claim shows as a second line. A plug-in gets no settings but its
`EngineOptions`, hence the environment variable; without it nothing is written.

Standard library and `tests.engines` only: this module is imported by every sweeper
the benchmarks spawn, before its first claim.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from core.engines.base import (
    Chunk,
    Emit,
    EngineOptions,
    GenerationRequest,
    LoadedModel,
    ModelSource,
    Snapshot,
)
from core.engines.registry import register_engine
from tests.engines import WordsModel, parse_directives

NAME = "bench.noop"
MODULE = "bench.noop_engine"
LOG_VARIABLE = "BENCH_EXECUTIONS_LOG"
# The directive that names a benchmark job in a request's input: `words=1 job=<tag>`.
JOB = "job"


def noop_input(tag: str) -> str:
    """A request input for one no-op job (one chunk) that the engine's lines name `tag`."""
    return f"words=1 {JOB}={tag}"


def tag_of(text: str) -> str | None:
    """The job tag of an input written by `noop_input`, or None."""
    return parse_directives(text).get(JOB)


def read_executions(path: Path) -> list[tuple[str, float]]:
    """The `(job tag, epoch at entry)` lines of one process's log, in order (none if the
    process never generated)."""
    if not path.exists():
        return []
    words = path.read_text().split()
    return list(zip(words[::2], map(float, words[1::2]), strict=True))


class RecordingModel(WordsModel):
    def __init__(self, record: Callable[[str], None]) -> None:
        self._record = record

    def generate(
        self,
        request: GenerationRequest,
        snapshot: Snapshot | None,
        should_stop: Callable[[], bool],
        emit: Emit | None = None,
    ) -> Iterator[Chunk]:
        # Stamped on the call itself, not on the generator's first step.
        self._record(tag_of(request.messages[-1]["content"]) or "?")
        return super().generate(request, snapshot, should_stop, emit)


class RecordingEngine:
    name = NAME

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        log = os.environ.get(LOG_VARIABLE)
        self._fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if log else None

    def load(self, model: ModelSource) -> LoadedModel:
        return RecordingModel(self._record)

    def _record(self, tag: str) -> None:
        at = time.time()
        if self._fd is not None:
            os.write(self._fd, f"{tag} {at:.6f}\n".encode())


register_engine(NAME, RecordingEngine)
