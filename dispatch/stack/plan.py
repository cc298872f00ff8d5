"""The stack's plan, `var/run/stack.json`: which optional parts `dispatch up` started and with
which settings profile, so `status`, `down` and `restart` know what to expect.

Apart from `dispatch.stack.local`, which writes and acts on it, every `dispatch` command that
loads the settings without a profile reads it (`recorded_profile`), among them `dispatch
serve` and `dispatch streaming`, which `up` starts: so this module imports only the standard
library and the settings, never the stack's processes (kafka-python, httpx).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dispatch.settings import Settings
from dispatch.stack.process import ProcessError  # the standard library only


@dataclass(frozen=True)
class StackPlan:
    """What `up` started besides the broker and the API nodes, and with which profile."""

    streaming: bool = True
    workers: int = 0
    profile: str = ""
    """The settings profile (conf/profiles/) the stack runs with; "": none."""


def plan_path(settings: Settings) -> Path:
    """Where the plan of the stack under these settings' `var` is kept."""
    return settings.paths.var / "run" / "stack.json"


def write_plan(path: Path, plan: StackPlan) -> None:
    path.write_text(json.dumps(plan.__dict__))


def read_plan(path: Path) -> StackPlan | None:
    """The plan saved at `path`; None if there is none. Raises ProcessError if unreadable."""
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as error:
        raise ProcessError(f"{path} is unreadable ({error}); remove it") from error
    return StackPlan(
        bool(saved.get("streaming", True)),
        int(saved.get("workers", 0)),
        str(saved.get("profile", "")),
    )


def recorded_profile(settings: Settings) -> str:
    """The profile of the stack `up` started under these settings' `var` ("": none, or no
    stack): `down` and `status` load it so they see the parts that profile runs."""
    plan = read_plan(plan_path(settings))
    return plan.profile if plan is not None else ""
