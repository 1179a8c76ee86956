"""The `cyllama` binding, imported once with the OpenMP settings this service needs.

This llama.cpp build computes on an OpenMP thread team, and libgomp's threads by
default spin 300,000 times at every barrier of a compute graph (hundreds per token)
before they sleep. On a host where anything else wants the same cores — another
taskward process, a neighbour, a test run — spinning threads take turns with
descheduled ones: measured here, two processes fell to 17 tokens/s in all, against 116
for one alone. Sleeping at once (`OMP_WAIT_POLICY=passive`) cures that but pays a futex
wake-up at every barrier: one process alone fell to 45 tokens/s. A short spin,
`GOMP_SPINCOUNT=300` (about a microsecond), catches a partner that is running and
sleeps when it is not: 120 tokens/s alone, 109 in all for two processes, 229 for eight
batched sequences (176 passive), and more than passive beside CPU-bound neighbours
(docs/benchmarks.md, "Two processes").

libgomp reads its environment once, when the binding's shared library loads, so every
module of the engine imports `llama_cpp` from here. An operator's own
`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` is left as it is.
"""

from __future__ import annotations

import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "300"

from cyllama.llama import llama_cpp

__all__ = ["llama_cpp"]
