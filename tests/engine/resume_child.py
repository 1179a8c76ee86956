"""Continue a generation in a fresh process, as a worker does after a crash.

Reads `{"request": {...}, "snapshot": {...}}` as JSON on stdin and prints the texts of
the chunks it generates as a JSON list. Uses one thread where the parent uses two, so a
resume on a differently configured worker is covered too.
"""

from __future__ import annotations

import json
import sys

from core.engines.base import EngineOptions, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine
from core.model_files import DEFAULT_MODEL_ID, default_model_source, sha256_of


def main() -> None:
    job = json.load(sys.stdin)
    source = default_model_source()
    model = LlamaEngine(EngineOptions(threads=1)).load(
        ModelFile(DEFAULT_MODEL_ID, source, sha256_of(source))
    )
    chunks = model.generate(GenerationRequest(**job["request"]), job["snapshot"], lambda: False)
    json.dump([chunk.text for chunk in chunks], sys.stdout)


if __name__ == "__main__":
    main()
