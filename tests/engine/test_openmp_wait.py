"""The engine's OpenMP wait (core/engines/llama_native.py): a short spin unless the
operator chose one, set before libgomp reads the environment (a fresh process each)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SHOW = ("import os, core.engines.llama_native; "
         "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")


def _seen(**chosen: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", _SHOW], env={**env, **chosen},
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.split("\n")[-2]


def test_the_engine_spins_briefly_by_default() -> None:
    assert _seen() == "300 None"


@pytest.mark.parametrize(("chosen", "expected"), [
    ({"OMP_WAIT_POLICY": "active"}, "None active"),
    ({"GOMP_SPINCOUNT": "100000"}, "100000 None"),
])
def test_an_operators_own_choice_is_kept(chosen: dict[str, str], expected: str) -> None:
    assert _seen(**chosen) == expected
