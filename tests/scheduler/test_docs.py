"""docs/state-machine.md draws exactly the transitions and restart policy of the code."""

from __future__ import annotations

import re
from pathlib import Path

from core.states import TRANSITIONS, OnRestart, Status
from core.store.recovery import RESTART_POLICY

DOC = (Path(__file__).resolve().parents[2] / "docs" / "state-machine.md").read_text()


def test_the_diagram_has_exactly_the_transitions_of_core_states() -> None:
    edges = set(re.findall(r"^\s+(\w+) --> (\w+):", DOC, flags=re.MULTILINE))
    assert edges == {(a.value, b.value) for a, b in TRANSITIONS}


def test_the_restart_table_matches_the_recovery_policy() -> None:
    table = {}
    for line in DOC.split("## Restart policy", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] in {s.value for s in Status}:
            for policy, cell in zip(OnRestart, cells[1:]):
                table[(Status(cells[0]), policy)] = Status(cell.split()[0].rstrip(","))
    assert table == RESTART_POLICY
