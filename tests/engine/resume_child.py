"""Continue a generation in a fresh process, as a worker does after a crash.

Reads `{"request": {...}, "snapshot": {...}, "beside": [requests]}` as JSON on stdin
and prints the texts of the chunks it generates as a JSON list. The `beside` requests
are already generating in the same decode loop when the resume joins it. Uses one
thread where the parent uses two, so a resume on a differently configured worker is
covered too.
"""

from __future__ import annotations

import json
import sys
import threading

from core.engines.base import EngineOptions, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine, LlamaLoadedModel
from core.model_files import DEFAULT_MODEL_ID, default_model_source, sha256_of


def start_beside(model: LlamaLoadedModel, requests: list[dict]) -> list[threading.Thread]:
    """Threads generating `requests`, returned once each has made its first chunk."""
    started = [threading.Event() for _ in requests]

    def consume(request: dict, first: threading.Event) -> None:
        for _chunk in model.generate(GenerationRequest(**request), None, lambda: False):
            first.set()
        first.set()

    threads = [threading.Thread(target=consume, args=(r, e)) for r, e in zip(requests, started)]
    for thread in threads:
        thread.start()
    for event in started:
        event.wait(60)
    return threads


def main() -> None:
    job = json.load(sys.stdin)
    source = default_model_source()
    model = LlamaEngine(EngineOptions(threads=1)).load(
        ModelFile(DEFAULT_MODEL_ID, source, sha256_of(source))
    )
    beside = start_beside(model, job.get("beside", []))
    chunks = model.generate(GenerationRequest(**job["request"]), job["snapshot"], lambda: False)
    texts = [chunk.text for chunk in chunks]
    for thread in beside:
        thread.join(60)
    json.dump(texts, sys.stdout)


if __name__ == "__main__":
    main()
