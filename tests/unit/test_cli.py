"""The `dispatch` command module itself: what importing it costs every `dispatch` process."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.loaded_modules import modules_loaded_by

HEAVY = (
    "httpx",
    "websockets",
    "pydantic",
    "pyarrow",
    "kafka",
    "dispatch.settings",
    "dispatch.client",
    "dispatch.replay.run",
    "dispatch.stack.local",
    "dispatch.stack.broker",
)
"""Modules the commands import when they run: `dispatch --help`, and every command that does
not use them, would pay for them (over a second in all) if `dispatch.cli` imported them."""


def test_importing_the_cli_leaves_the_heavy_modules_to_the_commands() -> None:
    loaded = modules_loaded_by("import dispatch.cli")
    assert "dispatch.cli_jobs" in loaded
    assert [name for name in HEAVY if name in loaded] == []


def test_the_settings_without_a_profile_leave_the_stack_unimported() -> None:
    # `dispatch serve` and `dispatch streaming`, as `up` starts them: no profile given, so the
    # settings read the profile the stack recorded (dispatch.stack.plan), not the stack.
    environment = {name: value for name, value in os.environ.items() if name != "DISPATCH_PROFILE"}
    loaded = modules_loaded_by("import dispatch.cli; dispatch.cli._settings()", environment)
    assert "dispatch.stack.plan" in loaded
    stack = ("kafka", "httpx", "dispatch.stack.local", "dispatch.stack.broker")
    assert [name for name in stack if name in loaded] == []


# --- what every command shows: version, help, exit codes, --json ----------------------------


def _commands() -> list[tuple[str, ...]]:
    """The path of every command and group of `dispatch` (`("dlq", "list")`...)."""
    import typer.main

    from dispatch.cli import app

    root = typer.main.get_command(app)
    found: list[tuple[str, ...]] = []

    # typer carries its own click: groups are told by their `commands`, not by a class.
    def walk(command: Any, path: tuple[str, ...]) -> None:
        found.append(path)
        if hasattr(command, "commands"):
            for name, child in command.commands.items():
                walk(child, (*path, name))

    walk(root, ())
    return found


def _invoke(*args: str) -> Any:
    from typer.testing import CliRunner

    from dispatch.cli import app

    # Wide, so that a line break in the output is one the help text made, not the terminal.
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400", "NO_COLOR": "1"})


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = _invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dispatch {version('dispatch')}"


def test_every_help_renders_its_paragraphs_whole_and_cites_no_internal_issue() -> None:
    import inspect

    import typer.main

    from dispatch.cli import app

    root = typer.main.get_command(app)
    commands = _commands()
    assert ("dlq", "list") in commands and ("chaos",) in commands and ("submit",) in commands
    overview = _invoke("--help").stdout
    for path in commands:
        result = _invoke(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        assert re.search(r"issue \d+", result.stdout, re.IGNORECASE) is None, path
        if path == ("chaos",):  # argparse's help, passed through
            continue
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        first, *_ = inspect.cleandoc(command.help or "").split("\n\n")
        # Each paragraph on one line, as Markdown joins it (backticks shown as code).
        joined = " ".join(first.replace("`", "").split())
        shown = [" ".join(line.strip(" │").split()) for line in result.stdout.splitlines()]
        assert joined in shown, (path, joined, result.stdout)
        if len(path) == 1:  # the list of commands shows the same paragraph whole
            listed = [" ".join(line.strip(" │").split()) for line in overview.splitlines()]
            assert f"{path[0]} {joined}" in listed, (path, overview)


def test_the_exit_codes_are_listed_once_each_with_one_meaning() -> None:
    from dispatch.cli_jobs import EXIT_CODES, EXIT_JOB_FAILED, EXIT_NOT_RUNNING, EXIT_TIMEOUT

    assert list(EXIT_CODES)[:3] == [0, 1, 2]
    assert len({EXIT_NOT_RUNNING, EXIT_JOB_FAILED, EXIT_TIMEOUT}) == 3
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    overview = _invoke("--help").stdout
    for code, meaning in EXIT_CODES.items():
        lines = [line for line in overview.splitlines() if line.strip().startswith(f"• {code} ")]
        assert len(lines) == 1, (code, overview)
        assert " ".join(meaning.replace("`", "").split()) in " ".join(lines[0].split())


def test_a_usage_error_exits_2_in_every_command() -> None:
    for args in (
        ("restart", "node"),  # node without its port
        ("restart", "broker", "8000"),  # a port with something else than node
        ("submit",),  # no exec, no file
        ("submit", "a.b", "--timeout", "3"),  # --timeout without --wait
        ("status", "--json"),  # --json of the stack's status
        ("dlq", "list", "--limit", "0"),
        ("no-such-command",),
    ):
        result = _invoke(*args)
        assert result.exit_code == 2, (args, result.output)


def test_json_is_a_flag_everywhere() -> None:
    import typer.main

    from dispatch.bench import chaos, restart_bench
    from dispatch.cli import app

    root = typer.main.get_command(app)
    with_json = []
    for path in _commands():
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        for parameter in command.params:
            if "--json" in getattr(parameter, "opts", ()):
                assert getattr(parameter, "is_flag", False), path
                with_json.append(path)
    assert ("submit",) in with_json and ("replay",) in with_json
    # The benchmarks `dispatch chaos` runs and the broker restart one: argparse flags too.
    for module in (chaos, restart_bench):
        parser_help = _argparse_help(module.main)
        assert "--json " in parser_help and "--json JSON" not in parser_help
        assert "--out OUT" in parser_help


def test_no_benchmark_takes_a_file_after_json() -> None:
    """`--json` prints JSON; a file to write is `--out FILE`, in every benchmark module too."""
    import ast

    bench = Path(__file__).resolve().parents[2] / "bench"
    takes_a_value = []
    for path in sorted(bench.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
                and any(isinstance(a, ast.Constant) and a.value == "--json" for a in node.args)
                and not any(
                    k.arg == "action"
                    and isinstance(k.value, ast.Constant)
                    and k.value.value == "store_true"
                    for k in node.keywords
                )
            ):
                takes_a_value.append(f"{path.name}:{node.lineno}")
    assert takes_a_value == []


def _argparse_help(main: Any) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return out.getvalue()
