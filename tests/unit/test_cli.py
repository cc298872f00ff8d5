"""The `dispatch` command module itself: what importing it costs every `dispatch` process."""

from __future__ import annotations

import os

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
