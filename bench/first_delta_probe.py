"""A `taskward run` that stamps each task's way to its first delta, for `bench.upstream
--stages`.

Run in place of `taskward` (`python -m bench.first_delta_probe <taskward> run ...`), it
wraps the steps between a task's claim and its first delta's commit before starting
the real command, and appends a line `<epoch ms> <stage> <task id>` to the file
`BENCH_STAGES_OUT` names the first time each task passes each stage (line-buffered:
the bench ends the process with SIGKILL). The stages, in the order a task passes them:

- `claim begun` and `claim returned`: the claimer's call that took the task
  (`core.store.claims.claim`, its commit included) was entered and returned: the first
  is the in-process wake-up's share of stored -> claimed, the second the rest of the
  claim's transaction after the lease's stamp (`claimed`);
- `runner`: a runner thread starts the attempt (`scheduler.execute.execute`);
- `engine`: its engine thread starts (`scheduler.execute._produce`);
- `request`: the engine hands the request to the transport's loop (`open_stream`);
- `first read`: the loop's first read of the answer that brought payloads;
- `first text`: the runner takes the first text (`scheduler.output.Output.add`);
- `write begun` and `written`: the first write of its output (one flush group's
  transaction, `worker_writes.append_outputs`), entered and returned;

and, as a duration rather than a stamp, `write waited for a CPU`: how long the thread
writing that transaction was runnable but not running (the kernel's run delay,
`/proc/thread-self/schedstat`), which on a machine whose cores the inference server
keeps busy is most of what the write's wall time has beyond its own work.

The task's row and log stamp the rest (stored, claimed); the bench's client stamps the
send and the first delta it reads. Stamps are the wall clock's milliseconds, as the
log's are. Granian forks its worker from this process, so the wrappers go with it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STAGES = ("claim begun", "claim returned", "runner", "engine", "request", "first read",
          "first text", "write begun", "written")
WAITED = "write waited for a CPU"
_current = threading.local()  # the task whose engine runs on this thread


class _Stamps:
    """The first stamp of each (stage, task), appended to the output file."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # open for the process's life
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def stamp(self, stage: str, task_id: str | None, value: float | None = None) -> None:
        """`value`: what to record instead of the time now (a stamp taken earlier, or
        a duration in ms)."""
        if task_id is None:
            return
        now = time.time() * 1000 if value is None else value
        with self._lock:
            if (stage, task_id) in self._seen:
                return
            self._seen.add((stage, task_id))
            self._file.write(f"{now:.2f} {stage.replace(' ', '_')} {task_id}\n")


def install(out: str) -> None:
    """Wrap the stages' steps (before the command starts)."""
    import core.store.worker_writes as worker_writes
    import scheduler.execute as execute
    import scheduler.output as output
    from core.engines.upstream import engine, transport
    from core.store import claims

    stamps = _Stamps(out)
    claim = claims.claim

    def stamped_claim(*args: Any, **kwargs: Any) -> Any:
        begun = time.time() * 1000
        taken = claim(*args, **kwargs)
        for each in taken:
            stamps.stamp("claim begun", each.task_id, begun)
            stamps.stamp("claim returned", each.task_id)
        return taken
    claims.claim = stamped_claim

    run_attempt = execute.execute

    def stamped_execute(db: Any, settings: Any, attempt: Any, **kwargs: Any) -> Any:
        stamps.stamp("runner", attempt.task_id)
        return run_attempt(db, settings, attempt, **kwargs)
    execute.execute = stamped_execute

    produce = execute._produce

    def stamped_produce(engine_: Any, model: Any, request: Any, snapshot: Any,
                        attempt: Any) -> None:
        stamps.stamp("engine", attempt.task_id)
        _current.task_id = attempt.task_id
        try:
            produce(engine_, model, request, snapshot, attempt)
        finally:
            _current.task_id = None
    execute._produce = stamped_produce  # type: ignore[assignment]

    open_stream = transport.open_stream

    def stamped_open(*args: Any, **kwargs: Any) -> Any:
        stamps.stamp("request", getattr(_current, "task_id", None))
        return open_stream(*args, **kwargs)
    transport.open_stream = stamped_open

    relay_init, relay_put = engine._Relay.__init__, engine._Relay.put

    def relay_of_task(self: Any, *args: Any, **kwargs: Any) -> None:
        relay_init(self, *args, **kwargs)
        self.probe_task_id = getattr(_current, "task_id", None)  # made on the engine thread

    def stamped_put(self: Any, item: Any) -> None:
        if isinstance(item, list):
            stamps.stamp("first read", self.probe_task_id)
        relay_put(self, item)
    engine._Relay.__init__ = relay_of_task  # type: ignore[method-assign]
    engine._Relay.put = stamped_put  # type: ignore[method-assign]

    add = output.Output.add

    def stamped_add(self: Any, chunk: Any, now_ms: int) -> None:
        if chunk.text:
            stamps.stamp("first text", self._task_id)
        add(self, chunk, now_ms)
    output.Output.add = stamped_add  # type: ignore[method-assign]

    append_outputs = worker_writes.append_outputs

    def stamped_append(db: Any, writes: Sequence[Any]) -> list[Exception | None]:
        for write in writes:
            stamps.stamp("write begun", write.task_id)
        delay = _run_delay_ms()
        written = append_outputs(db, writes)
        delay = _run_delay_ms() - delay
        for write in writes:
            stamps.stamp("written", write.task_id)
            stamps.stamp(WAITED, write.task_id, delay)
        return written
    worker_writes.append_outputs = stamped_append


def _run_delay_ms() -> float:
    """The calling thread's time so far waiting on a run queue, in ms."""
    with open("/proc/thread-self/schedstat") as schedstat:
        return int(schedstat.read().split()[1]) / 1e6


def read(path: Path) -> dict[str, dict[str, float]]:
    """The stamps of a run: task id -> stage -> epoch ms (`WAITED`: its ms)."""
    stamps: dict[str, dict[str, float]] = {}
    with open(path) as lines:
        for line in lines:
            at, stage, task_id = line.split()
            stamps.setdefault(task_id, {})[stage.replace("_", " ")] = float(at)
    return stamps


if __name__ == "__main__":
    install(os.environ["BENCH_STAGES_OUT"])
    from infra.cli import main

    sys.argv = ["taskward", *sys.argv[2:]]  # argv[1] is the taskward script the bench named
    main()
