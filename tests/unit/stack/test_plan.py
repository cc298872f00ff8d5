"""The stack's plan file: written and read back, absent, unreadable; and a module light enough
for every `dispatch` process to read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.settings import load_settings
from dispatch.stack.plan import StackPlan, plan_path, read_plan, recorded_profile, write_plan
from dispatch.stack.process import ProcessError
from tests.unit.loaded_modules import modules_loaded_by


def test_a_plan_is_read_back_as_written(tmp_path: Path) -> None:
    settings = load_settings(paths={"var": str(tmp_path)})
    path = plan_path(settings)
    assert path == tmp_path / "run" / "stack.json"
    path.parent.mkdir(parents=True)
    plan = StackPlan(streaming=False, workers=3, profile="cluster")
    write_plan(path, plan)
    assert read_plan(path) == plan
    assert recorded_profile(settings) == "cluster"


def test_without_a_plan_there_is_no_recorded_profile(tmp_path: Path) -> None:
    settings = load_settings(paths={"var": str(tmp_path)})
    assert read_plan(plan_path(settings)) is None
    assert recorded_profile(settings) == ""


def test_missing_keys_take_the_defaults_and_a_broken_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    path.write_text("{}")
    assert read_plan(path) == StackPlan()
    path.write_text("{not json")
    with pytest.raises(ProcessError, match=r"stack\.json is unreadable .*; remove it"):
        read_plan(path)


def test_reading_the_plan_imports_none_of_the_stack() -> None:
    # A fresh interpreter, as `dispatch serve` and `dispatch streaming` are.
    loaded = modules_loaded_by("import dispatch.stack.plan")
    assert "dispatch.stack.plan" in loaded
    heavy = ("kafka", "httpx", "dispatch.stack.local", "dispatch.stack.broker")
    assert [name for name in heavy if name in loaded] == []
