"""Threads named for the kernel (`core.thread_names`): what `top -H` and /proc show."""

from __future__ import annotations

import threading
from pathlib import Path

from core.thread_names import named_thread


def this_threads_kernel_name() -> str:
    """The calling thread's name as the kernel knows it."""
    return Path("/proc/thread-self/comm").read_text().rstrip("\n")


def _run_named(name: str, kernel_name: str | None = None) -> tuple[str, threading.Thread]:
    seen: list[str] = []
    thread = named_thread(lambda: seen.append(this_threads_kernel_name()), name,
                          kernel_name=kernel_name)
    thread.start()
    thread.join(10)
    return seen[0], thread


def test_a_named_thread_tells_the_kernel_its_name_without_the_process_prefix() -> None:
    kernel, thread = _run_named("taskward-live-tail")

    assert kernel == "live-tail"
    assert thread.name == "taskward-live-tail"  # Python's name is kept whole
    assert thread.daemon


def test_a_long_name_is_cut_to_the_kernels_fifteen_bytes() -> None:
    kernel, _ = _run_named("engine-resp_0123456789abcdef")

    assert kernel == "engine-resp_012"


def test_a_kernel_name_can_differ_from_the_python_name() -> None:
    kernel, thread = _run_named("engine-resp_0123", kernel_name="engine")

    assert (kernel, thread.name) == ("engine", "engine-resp_0123")


def test_the_target_gets_its_arguments() -> None:
    got: list[tuple[int, str]] = []
    thread = named_thread(lambda number, word: got.append((number, word)), "claimer",
                          args=(7, "seven"))
    thread.start()
    thread.join(10)

    assert got == [(7, "seven")]
