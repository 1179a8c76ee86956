"""Load a copy of the default model, damage the copy on disk, then generate from it.

`python damage_child.py DIRECTORY truncate|overwrite` copies the default model into
DIRECTORY, loads it as a worker does, then truncates the file or copies another file
over it in place (`cp other model.gguf`, an operator's "update"), and prints the greedy
text of `REQUEST` as JSON. A process whose weights were still read from the file dies
of SIGBUS here instead.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from core.engines.base import EngineOptions, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine
from core.model_files import DEFAULT_MODEL_ID, default_model_source, sha256_of

REQUEST = GenerationRequest([{"role": "user", "content": "Count from 1 to 20."}],
                            max_output_tokens=24)


def main() -> None:
    directory, damage = Path(sys.argv[1]), sys.argv[2]
    copy = directory / "model.gguf"
    shutil.copyfile(default_model_source(), copy)
    model = LlamaEngine(EngineOptions(threads=2)).load(
        ModelFile(DEFAULT_MODEL_ID, copy, sha256_of(copy)))
    if damage == "truncate":
        os.truncate(copy, 1 << 20)
    else:
        with copy.open("r+b") as file:  # what `cp` does: truncate, then write
            file.truncate(0)
            file.write(Path(__file__).read_bytes())
    chunks = model.generate(REQUEST, None, lambda: False)
    json.dump("".join(chunk.text for chunk in chunks), sys.stdout)


if __name__ == "__main__":
    main()
