"""A sequence that waits for KV cells tells its attempt so, and when it starts to run:
the attempt's execution timeout leaves that wait out (scheduler/attempt.py)."""

from __future__ import annotations

import threading
import time

import pytest

from core.engines.base import Chunk, EngineOptions, ExcludesWaits, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine

# Each needs the prompt plus 200 cells: two never fit in 256 at once.
REQUEST = GenerationRequest([{"role": "user", "content": "Tell a long story."}],
                            max_output_tokens=200, temperature=0)


class _Poll:
    """A `should_stop` that records the waits it is told of."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.waits: list[bool] = []

    def __call__(self) -> bool:
        return self.stop.is_set()

    def waiting(self, waiting: bool) -> None:
        self.waits.append(waiting)


@pytest.mark.model
def test_a_sequence_waiting_for_kv_cells_is_told_as_waiting_until_admitted(
    default_model_file: ModelFile,
) -> None:
    model = LlamaEngine(EngineOptions(threads=2, context_tokens=256)).load(default_model_file)
    first, second = _Poll(), _Poll()
    assert isinstance(second, ExcludesWaits)
    second_chunks: list[Chunk] = []
    first_running = threading.Event()

    def run_first() -> None:
        for _chunk in model.generate(REQUEST, None, first):
            first_running.set()

    def run_second() -> None:
        for chunk in model.generate(REQUEST, None, second):
            second_chunks.append(chunk)
            second.stop.set()  # one chunk shows it ran

    threads = [threading.Thread(target=run_first), threading.Thread(target=run_second)]
    threads[0].start()
    assert first_running.wait(60)
    threads[1].start()
    deadline = time.monotonic() + 30  # its prompt tokenized and submitted, on a busy box too
    while not second.waits and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # many steps of the first: the second is still not in
    waits_while_blocked = list(second.waits)
    first.stop.set()
    for thread in threads:
        thread.join(60)

    assert waits_while_blocked == [True]
    assert second.waits == [True, False]
    assert second_chunks  # it ran once admitted
    assert first.waits == [True, False]  # admitted at the next step
