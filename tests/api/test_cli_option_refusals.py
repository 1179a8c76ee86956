"""Options the CLI took without a word where the API refuses the same thing: an integer
with a leading zero (`tasks list --priority 05`, which `GET /v1/tasks?priority=05`
refuses), and `pair --admin --scopes …`, whose scopes were ignored (the client got
every scope). Each is a usage error naming the option, exit 2, before the store is
opened (docs/cli.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.test_cli_store_url import taskward

DIGITS = "must be an integer written in decimal digits, without leading zeros"


@pytest.mark.parametrize(("args", "option"), [
    (["tasks", "list", "--priority", "05"], "--priority"),
    (["tasks", "list", "--priority", "+5"], "--priority"),
    (["tasks", "list", "--limit", "020"], "--limit"),
    (["tasks", "list", "--limit", " 20"], "--limit"),
    (["tasks", "list", "--limit", "2_0"], "--limit"),
    (["dead-letters", "list", "--limit", "\u0665"], "--limit"),  # an Arabic-Indic 5
    (["schedules", "list", "--limit", "05"], "--limit"),
    (["pair", "--max-streams", "010"], "--max-streams"),
    (["serve", "--port", "08000"], "--port"),
])
def test_an_integer_option_not_in_plain_digits_is_a_usage_error(
        tmp_path: Path, args: list[str], option: str) -> None:
    done = taskward(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == f"Error: Invalid value for '{option}': {DIGITS}"


def test_plain_digits_are_read(tmp_path: Path) -> None:
    env = {"TASKWARD_DATABASE_URL": f"sqlite:///{tmp_path / 'taskward.db'}"}
    assert taskward("migrate", cwd=tmp_path, env=env).returncode == 0
    for value in ("0", "5", "9"):
        done = taskward("tasks", "list", "--priority", value, "--limit", "20",
                        cwd=tmp_path, env=env)
        assert (done.returncode, done.stdout) == (0, "(none)\n"), done.stderr
    done = taskward("tasks", "list", "--priority", "10", cwd=tmp_path, env=env)
    assert done.returncode == 2 and "10 is not in the range 0<=x<=9" in done.stderr


def test_admin_with_scopes_is_a_usage_error(tmp_path: Path) -> None:
    env = {"TASKWARD_DATABASE_URL": f"sqlite:///{tmp_path / 'taskward.db'}"}
    assert taskward("migrate", cwd=tmp_path, env=env).returncode == 0
    done = taskward("pair", "--admin", "--scopes", "tasks:read", "--token", cwd=tmp_path,
                    env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "Error: --admin holds every scope; drop --scopes, or --admin to grant only those "
        "scopes")
    listed = taskward("clients", "list", cwd=tmp_path, env=env)
    assert listed.stdout == "(none)\n", listed.stdout  # no client was made
