"""`--port 0` (docs/cli.md): `serve` and `run` listen on a free port the kernel picks,
and every line they print names that port. Real `taskward` processes.

granian given port 0 listened on a random port and printed `:0`, and so did `run`'s
`serving on` line: the port that answered was only to be found with `ss -ltnp`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.api.served import process, service_env, wait_ready
from tests.databases import copy_sqlite
from tests.scheduler.processes import wait_until

URL = re.compile(r"http://127\.0\.0\.1:(\d+)")


@pytest.mark.parametrize(("command", "names_it"), [
    ("serve", "Listening at: "), ("run", "serving on "),
])
def test_port_0_serves_on_the_port_every_printed_url_names(
        command: str, names_it: str, tmp_path: Path, sqlite_template: Path) -> None:
    env = service_env(copy_sqlite(sqlite_template, tmp_path / "taskward.db"),
                      tmp_path / "models")
    log = tmp_path / f"{command}.log"
    with process([command, "--port", "0"], env, log) as child:
        said = wait_until(lambda: re.search(re.escape(names_it) + URL.pattern, log.read_text()),
                          timeout=60, what=f"`{command}` naming its URL")
        assert said[1] != "0", said[0]
        wait_ready(f"http://127.0.0.1:{said[1]}", child, log, probe="/healthz")
        printed = set(URL.findall(log.read_text()))
    assert printed == {said[1]}
