"""The `cyllama` binding, imported once with the OpenMP settings this service needs.

This llama.cpp build computes on an OpenMP thread team, and libgomp's threads by
default spin at every barrier of a compute graph (hundreds per token) before they
sleep. On a host where anything else wants the same cores — another taskward process,
a neighbour, a test run — spinning threads take turns with descheduled ones and a
token that takes 12 ms alone takes hundreds: measured here, one process under load
fell from 78-90 to about 2 tokens/s, and with `OMP_WAIT_POLICY=passive` the same load
gave 65 tokens/s across two processes (docs/benchmarks.md, "two processes"). Passive
threads sleep on a futex at each barrier instead.

libgomp reads its environment once, when the binding's shared library loads, so every
module of the engine imports `llama_cpp` from here. An operator's own
`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` is left as it is.
"""

from __future__ import annotations

import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "passive"

from cyllama.llama import llama_cpp

__all__ = ["llama_cpp"]
