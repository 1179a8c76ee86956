"""A pool of taskward's store and runner threads that never holds up the process's exit."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from core.thread_names import named_thread

P = ParamSpec("P")
T = TypeVar("T")


class DaemonThreadPool(Executor):
    """A thread pool whose threads never hold up the process's exit.

    `ThreadPoolExecutor` joins every one of its threads as the interpreter exits, so
    one stuck in a call to a store that stopped answering (its request long since
    answered 503, its attempt handed back) kept `taskward serve` and the sweeper alive
    after their graceful stop, for good. These threads are daemons (`named_thread`,
    called `{prefix}_{n}`, for the kernel too): what still runs at exit is left, as its
    caller's bound already decided. Like `ThreadPoolExecutor`, a thread is started for
    new work only while none is idle, up to `max_workers`.
    """

    def __init__(self, max_workers: int, prefix: str) -> None:
        self._max_workers = max_workers
        self._prefix = prefix
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue())
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shut_down = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = named_thread(self._serve, f"{self._prefix}_{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut_down = True
            while cancel_futures:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # the caller's to see, as in ThreadPoolExecutor
                    future.set_exception(exc)
            del item, future, call  # nothing of the call is kept while idle
            self._idle.release()
