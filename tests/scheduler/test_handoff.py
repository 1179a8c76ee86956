"""The watcher hands an engine that runs long to a runner, exactly once, and never one
whose thread already took its stream back."""

from __future__ import annotations

import threading
import time

from scheduler.handoff import Handoffs


def test_an_engine_that_returns_in_time_keeps_its_stream() -> None:
    handoffs = Handoffs(after_seconds=0.05)
    handoffs.start()
    handed: list[str] = []
    try:
        kept = handoffs.watch(lambda: handed.append("a"))
        assert kept()
        time.sleep(0.15)  # past the time it would have been handed over
    finally:
        handoffs.stop()
    assert handed == []


def test_an_engine_still_running_is_handed_over_once_and_its_thread_told_so() -> None:
    handoffs = Handoffs(after_seconds=0.02)
    handoffs.start()
    handed = threading.Event()
    calls: list[int] = []

    def hand_over() -> None:
        calls.append(1)
        handed.set()

    try:
        kept = handoffs.watch(hand_over)
        assert handed.wait(5)
        time.sleep(0.1)
        assert not kept()
    finally:
        handoffs.stop()
    assert calls == [1]


def test_a_watch_after_a_quiet_spell_wakes_the_sleeping_watcher() -> None:
    handoffs = Handoffs(after_seconds=0.02)
    handoffs.start()
    handed = threading.Event()
    try:
        assert handoffs.watch(lambda: None)()
        time.sleep(0.2)  # nothing watched for many periods: the watcher sleeps untimed
        start = time.monotonic()
        kept = handoffs.watch(handed.set)
        assert handed.wait(5)
        assert time.monotonic() - start < 1
        assert not kept()
    finally:
        handoffs.stop()


def test_stop_ends_the_watcher_with_engines_still_watched() -> None:
    handoffs = Handoffs(after_seconds=60)
    handoffs.start()
    handoffs.watch(lambda: None)
    handoffs.stop()
    assert not any(t.name == "handoff" and t.is_alive() for t in threading.enumerate())
