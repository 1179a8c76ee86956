"""How many transactions a process group committed to one SQLite database, counted from
its file syncs under `perf trace`.

With `synchronous=FULL` (taskward's default) SQLite syncs the WAL once per commit, once
per checkpoint, which also syncs the database file once, and once more when a WAL starts
afresh after a checkpoint; so the commits lie between the WAL's syncs less twice the
database file's and the WAL's syncs less the database file's (checkpoints come every
1,000 pages, so the two are close), and the syncs of a file whose descriptor was closed
before `SyncFiles` looked (a connection opened and closed in the window) may each be one
more commit. `perf trace` reads the system calls from kernel tracepoints without
stopping the traced threads (strace, which stops them, multiplied a threaded process's
CPU time many times over here), but it names a synced file only by its descriptor:
`SyncFiles` reads what each descriptor is from /proc while the traced processes still
run.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

# `2369015.199 ( 0.285 ms): python/23397 fdatasync(fd: 5)   = 0`: monotonic ms, thread id
# (no duration, and `...` for the result, when another event came in between)
_SYNC = re.compile(r"^ *([\d.]+) \([^)]*\): .*?/(\d+) f(?:data)?sync\(fd: (\d+)",
                   re.MULTILINE)


def traced(trace: Path) -> list[str]:
    """The command prefix that runs a command with every sync of its processes and
    their threads written to `trace`, timed in milliseconds as `time.monotonic()` counts
    seconds (give or take `CLOCK_SLACK_SECONDS`)."""
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("counting commits needs perf: apt-get install linux-perf")
    return [perf, "trace", "-T", "-e", "fdatasync,fsync", "-o", str(trace), "--"]


def stop(tracer: subprocess.Popen[bytes]) -> None:
    """End the tracer started by `traced` (and the command it runs), so that it writes
    out the syncs it still holds."""
    tracer.send_signal(signal.SIGINT)
    tracer.wait(timeout=30)


_WAL, _MAIN = "wal", "main"
# perf times events by the kernel's scheduler clock, which runs some milliseconds off
# CLOCK_MONOTONIC (seen here: 0.1-3 ms late): a sync just inside a window may be stamped
# just outside it.
CLOCK_SLACK_SECONDS = 0.05


@dataclass(frozen=True)
class SyncFiles:
    """What each descriptor of the traced processes is (`database`, its WAL or another
    file), and which process each live thread is of, read from /proc. A sync by a thread
    that has ended (one attempt's, say) is placed by its descriptor number where every
    process that has that number open agrees on what it is."""

    kinds: dict[int, dict[int, str | None]]  # process id -> descriptor -> _WAL, _MAIN, None
    process_of: dict[int, int]  # thread id -> process id

    @classmethod
    def read(cls, processes: list[Path], database: Path) -> SyncFiles:
        """`processes`: /proc folders of the live traced processes (not the tracer's:
        its own descriptors would spoil the agreement on a number)."""
        names = {f"{database}-wal": _WAL, str(database): _MAIN}
        kinds = {int(process.name): {fd: names.get(target)
                                     for fd, target in _descriptors(process)}
                 for process in processes}
        process_of = {thread: int(process.name)
                      for process in processes for thread in _threads(process)}
        return cls(kinds, process_of)

    @cached_property
    def agreed(self) -> dict[int, str | None]:
        """Descriptor -> what it is in every process that has it open (None where they
        differ), worked out once for all the syncs a trace holds."""
        seen: dict[int, set[str | None]] = {}
        for descriptors in self.kinds.values():
            for fd, kind in descriptors.items():
                seen.setdefault(fd, set()).add(kind)
        return {fd: next(iter(found)) if len(found) == 1 else None
                for fd, found in seen.items()}

    def kind(self, thread: int, fd: int) -> str | None:
        own = self.kinds.get(self.process_of.get(thread, -1), {})
        return own[fd] if fd in own else self.agreed.get(fd)


@dataclass(frozen=True)
class Commits:
    fewest: int
    most: int


def count(trace: Path, files: SyncFiles, start: float, end: float) -> Commits:
    """The commits between the monotonic seconds `start` and `end`, give or take
    `CLOCK_SLACK_SECONDS`: so time the window where the traced processes write nothing
    else."""
    first, last = (start - CLOCK_SLACK_SECONDS) * 1000, (end + CLOCK_SLACK_SECONDS) * 1000
    found_kinds = Counter(
        files.kind(int(found.group(2)), int(found.group(3)))
        for found in _SYNC.finditer(trace.read_text())
        if first <= float(found.group(1)) <= last)
    wal, main, unknown = found_kinds[_WAL], found_kinds[_MAIN], found_kinds[None]
    return Commits(fewest=wal - 2 * main, most=wal - main + unknown)


def _descriptors(process: Path) -> Iterator[tuple[int, str]]:
    try:
        links = list((process / "fd").iterdir())
    except OSError:  # ended while we looked
        return
    for link in links:
        try:
            yield int(link.name), str(link.readlink())
        except OSError:
            continue


def _threads(process: Path) -> list[int]:
    try:
        return [int(task.name) for task in (process / "task").iterdir()]
    except OSError:
        return []
