"""A deterministic engine for tests (not a product engine).

Loaded into real `taskward` processes through `TASKWARD_ENGINE_MODULES=tests.engines`.
It stands in for inference only; the database, workers and processes stay real.

The stored request's `input` steers it: `"words=N delay=S fail=retryable|fatal
fail_at=K retry_after=S hang=1"`. It yields `N` chunks `"w0 ", "w1 ", …` (so any output
can be checked for gaps or repeats), sleeps `S` seconds per chunk, and resumes from `{"pos": k}`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from core.engines.base import (
    Chunk,
    Emit,
    EngineError,
    EngineOptions,
    GenerationRequest,
    LoadedModel,
    ModelSource,
    Snapshot,
    Usage,
)
from core.engines.registry import register_engine

NAME = "test.words"


def parse_directives(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def expected_text(words: int) -> str:
    return "".join(f"w{i} " for i in range(words))


class WordsModel:
    def generate(
        self,
        request: GenerationRequest,
        snapshot: Snapshot | None,
        should_stop: Callable[[], bool],
        emit: Emit | None = None,
    ) -> Iterator[Chunk]:
        options = parse_directives(request.messages[-1]["content"])
        words = int(options.get("words", "5"))
        delay = float(options.get("delay", "0"))
        fail_at = int(options.get("fail_at", "-1"))
        start = int(snapshot["pos"]) if snapshot else 0
        for pos in range(start, words):
            if should_stop():
                return
            if pos == fail_at:
                kind = options.get("fail", "retryable")
                after = options.get("retry_after")
                raise EngineError("engine_error" if kind == "retryable" else "bad_request",
                                  "injected failure", retryable=kind == "retryable",
                                  retry_after_seconds=float(after) if after else None)
            if delay:
                time.sleep(delay)
            yield Chunk(f"w{pos} ", {"pos": pos + 1}, Usage(input_tokens=3, output_tokens=pos + 1))


class WordsEngine:
    name = NAME

    def __init__(self, options: EngineOptions) -> None:
        self.options = options

    def load(self, model: ModelSource) -> LoadedModel:
        return WordsModel()


register_engine(NAME, WordsEngine)
