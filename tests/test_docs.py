"""The reference in docs/ says what the code does: settings, routes and commands are
read from the code and compared with the pages, so neither can change alone, and no
file points at a contract document this repository does not contain."""

from __future__ import annotations

import ast
import re
import socket
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import click
import msgspec
from msgspec import Meta

from core.engines.base import usable_cores
from core.settings import ENV_PREFIX, SETTING_NAMES, Settings, decode_path
from handlers.errors import _HTTP_CODES as FRAMEWORK_CODES
from infra.app import serving_app
from infra.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in `text` (header and rule rows included)."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.lstrip().startswith("|")]


def unquoted(cell: str) -> str:
    return cell.strip("`")


# --- docs/settings.md ---------------------------------------------------------------

def settings_table() -> dict[str, tuple[str, str]]:
    """`TASKWARD_*` name -> (default cell, rule cell) from docs/settings.md."""
    rows = table_rows((DOCS / "settings.md").read_text())
    return {unquoted(row[0]): (row[1], row[2]) for row in rows
            if len(row) == 4 and unquoted(row[0]).startswith(ENV_PREFIX)}


def setting_types() -> dict[str, Any]:
    """Each setting's annotation, `Annotated[…, Meta(…)]` where it has bounds."""
    return get_type_hints(Settings, include_extras=True)


def rule_of(annotation: Any) -> str:
    """A setting's bounds as the rule column writes them (`1..256`, `> 0`, …)."""
    if get_origin(annotation) is Literal:
        return " or ".join(f"`{choice}`" for choice in get_args(annotation))
    meta = next((item for item in get_args(annotation) if isinstance(item, Meta)), Meta())
    if meta.min_length is not None and meta.max_length is not None:
        return f"{meta.min_length}..{meta.max_length} characters"
    if meta.ge is not None and meta.le is not None:
        return f"{meta.ge}..{meta.le}"
    lower = (f"> {meta.gt}" if meta.gt is not None
             else f">= {meta.ge}" if meta.ge is not None else "")
    upper = f"at most {meta.le}" if meta.le is not None else ""
    return "; ".join(part for part in (lower, upper) if part)


def test_the_settings_page_names_every_setting_and_no_other() -> None:
    documented = set(settings_table())
    assert documented == {ENV_PREFIX + name.upper() for name in SETTING_NAMES}


def test_the_settings_page_gives_each_default_of_core_settings() -> None:
    table = settings_table()
    types = setting_types()
    for setting in fields(Settings):
        cell = table[ENV_PREFIX + setting.name.upper()][0]
        if setting.default_factory is socket.gethostname:
            assert cell == "the host name"
            continue
        if setting.default_factory is usable_cores:
            assert cell == "the usable cores"
            continue
        written: Any = "" if cell == "(empty)" else unquoted(cell)
        # As `load_settings` reads the cell from the environment.
        read = msgspec.convert(written, type=types[setting.name], strict=False,
                               dec_hook=decode_path)
        assert read == setting.default, setting.name


def test_the_settings_page_states_each_bound_of_core_settings() -> None:
    table = settings_table()
    for name, annotation in setting_types().items():
        rule = table[ENV_PREFIX + name.upper()][1]
        assert rule.startswith(rule_of(annotation)) and rule, name


# --- docs/http-api.md ---------------------------------------------------------------

def _route_key(method: str, path: str) -> tuple[str, str]:
    """`{task_id:str}` and `{id}` alike become `{}`, so the page may name ids simply."""
    return method, re.sub(r"\{[^}]*\}", "{}", path)


def test_the_http_page_lists_exactly_the_routes_of_the_app(tmp_path: Path) -> None:
    app = serving_app(Settings(database_url=f"sqlite:///{tmp_path}/unused.db",
                               models_dir=tmp_path))
    served = {_route_key(method, route.path)
              for route in app.routes if not route.path.startswith("/schema")
              for method in getattr(route, "methods", ())
              if method not in ("HEAD", "OPTIONS")}
    documented = set()
    for row in table_rows((DOCS / "http-api.md").read_text()):
        match = re.fullmatch(r"`([A-Z]+) (/\S*)`", row[0])
        if match:
            documented.add(_route_key(match[1], match[2]))
    assert documented == served


# Codes the code raises that no HTTP answer carries, and why.
UNANSWERED_CODES = {
    "lease_lost", "cancel_requested",  # a worker's own fenced writes
    "forbidden_transition",  # a move the state machine lacks: a fault of the caller's code
    "default_model_missing", "engine_module_missing",  # a process's start-up (the CLI)
    "models_dir_unwritable",  # `taskward run`'s start-up, before it serves
    "invalid_catch_up",  # `core.cron`'s guard: bodies bound `catch_up` first
    "login_required",  # a console page answers it with a 303 to the login form
}
# Besides the domain errors, what takes a code as its first argument: the URL check,
# whose code the registry passes on (`core.models_registry`).
CODE_CARRIERS = {"UrlRefused"}


def codes_in_the_code() -> set[str]:
    """Every literal error code of core/, handlers/ and infra/: the first argument of a
    `DomainError` subclass (or of `super().__init__` inside one) or of `UrlRefused`,
    the code of `problem(status, code, …)`, and the framework's fallback codes."""
    trees = [ast.parse(path.read_text()) for folder in ("core", "handlers", "infra")
             for path in (ROOT / folder).rglob("*.py")]
    bases: dict[str, list[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]

    def is_domain_error(name: str) -> bool:
        return name == "DomainError" or any(is_domain_error(b) for b in bases.get(name, []))

    def first_literals(scope: ast.AST, carriers: set[str]) -> set[str]:
        found = set()
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            args = node.args[1:] if name == "problem" else node.args
            if (name in carriers or name == "problem") and args \
                    and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                found.add(args[0].value)
        return found

    errors = {name for name in bases if is_domain_error(name)}
    found = set(FRAMEWORK_CODES.values()) | {"http_error"}  # the fallbacks' own fallback
    for tree in trees:
        found |= first_literals(tree, errors | CODE_CARRIERS)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in errors:
                found |= first_literals(node, {"__init__"})
    return found


def codes_in_the_error_table() -> set[str]:
    """The codes of the first column of docs/http-api.md's table under "Errors"."""
    section = (DOCS / "http-api.md").read_text().split("\n## Errors\n", 1)[1]
    rows = table_rows(section.split("\n## ", 1)[0])[2:]  # past the header and rule rows
    return {code for row in rows for code in re.findall(r"`([a-z_]+)`", row[0])}


def test_the_error_table_names_every_code_the_api_answers_and_no_other() -> None:
    answered = codes_in_the_code() - UNANSWERED_CODES
    documented = codes_in_the_error_table()
    assert (answered - documented, documented - answered) == (set(), set())


# --- docs/cli.md --------------------------------------------------------------------

def commands(group: click.Group, prefix: str = "taskward") -> dict[str, click.Command]:
    """Every runnable command by its full name (`taskward models add`)."""
    found: dict[str, click.Command] = {}
    context = click.Context(group)
    for name in group.list_commands(context):  # the top group loads its commands lazily
        command = group.get_command(context, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            found.update(commands(command, f"{prefix} {name}"))
        else:
            found[f"{prefix} {name}"] = command
    return found


def cli_sections() -> dict[str, str]:
    """docs/cli.md's `### \\`taskward …\\`` sections by command name."""
    parts = re.split(r"^### `(taskward[^`]*)`\s*$", (DOCS / "cli.md").read_text(),
                     flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_cli_page_has_a_section_for_exactly_the_commands_of_the_code() -> None:
    assert set(cli_sections()) == set(commands(main))


def test_the_cli_page_lists_exactly_the_commands_that_take_json() -> None:
    listing = re.search(r"^`--json` is taken by exactly these commands: (.*?)\.$",
                        (DOCS / "cli.md").read_text(), flags=re.MULTILINE | re.DOTALL)
    assert listing is not None
    taking = {name for name, command in commands(main).items()
              if any("--json" in param.opts for param in command.params)}
    assert set(re.findall(r"`(taskward [^`]+)`", listing[1])) == taking


def test_each_cli_section_names_every_option_of_its_command() -> None:
    sections = cli_sections()
    for name, command in commands(main).items():
        for param in command.params:
            if isinstance(param, click.Option):
                flag = max(param.opts, key=len)
                assert f"`{flag}" in sections[name], f"{name} {flag}"


# --- docs/operations.md and infra/deploy --------------------------------------------

DEPLOY = ROOT / "infra" / "deploy"
SETTINGS_FILE = "/etc/taskward/env"


def test_the_operations_page_names_exactly_the_systemd_units_of_infra_deploy() -> None:
    named = set(re.findall(r"taskward[a-z-]*\.(?:service|timer)",
                           (DOCS / "operations.md").read_text()))
    shipped = {unit.name for unit in DEPLOY.iterdir() if unit.suffix in (".service", ".timer")}
    assert named == shipped


def test_each_deployment_shape_names_shipped_examples_that_run_its_commands() -> None:
    section = (DOCS / "operations.md").read_text().split("\n## Deployment\n", 1)[1]
    rows = table_rows(section.split("\n## ", 1)[0])[2:]  # past the header and rule rows
    assert rows
    for _shape, _store, runs, example in rows:
        paths = re.findall(r"`infra/deploy/([^`]+)`", example)
        assert paths, example
        for name in paths:
            assert (DEPLOY / name).is_file(), name
            started = re.findall(r"^ExecStart=\S*taskward (\S+)", (DEPLOY / name).read_text(),
                                 flags=re.MULTILINE)
            assert all(f"`taskward {command}" in runs for command in started), (name, runs)


def test_every_systemd_unit_reads_the_settings_file_the_operations_page_names() -> None:
    assert f"`{SETTINGS_FILE}`" in (DOCS / "operations.md").read_text()
    for unit in DEPLOY.glob("*.service"):
        assert re.search(rf"^EnvironmentFile=-?{SETTINGS_FILE}$", unit.read_text(),
                         flags=re.MULTILINE), unit.name


# --- pointers -----------------------------------------------------------------------

def test_nothing_points_at_a_contract_file_outside_the_repository() -> None:
    """Code, tests and pages point at docs/; a reference to a specification file or its
    numbered sections would send the reader to something they cannot open."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    reference = re.compile("SP" + r"EC(\.md| section| [0-9])")  # not a match of itself
    offenders = []
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file() and path.suffix not in {".gguf", ".bin", ".png"}:
            text = path.read_text(encoding="utf-8", errors="replace")
            offenders += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1)
                          if reference.search(line)]
    assert offenders == []


def test_every_link_between_pages_names_a_page_that_exists() -> None:
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([a-z-]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (DOCS / target).is_file(), f"{page.name} -> {target}"
