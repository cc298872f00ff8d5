"""What the demo tells a new user to run next is runnable from where they are: `dispatch` when
the PATH finds it, else its path (a fresh checkout's venv is not on the PATH)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dispatch.demo import dispatch_command

OURS = Path(sys.executable).parent / "dispatch"


def test_the_bare_name_when_the_path_finds_this_executable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", str(OURS.parent))
    assert dispatch_command() == "dispatch"


def test_the_path_relative_to_the_checkout_when_the_path_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(OURS.parents[2])
    command = dispatch_command()
    assert command == str(OURS.relative_to(OURS.parents[2]))
    assert Path(command).is_file()


def test_the_absolute_path_from_elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    assert dispatch_command() == str(OURS)
