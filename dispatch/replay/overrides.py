"""`--set key=value`: the policy a replay runs under, checked against the typed settings.

Keys are the `[dispatcher]` settings (`dispatcher.default_cap=50`, `dispatcher.caps.acme=10`,
`dispatcher.ack_timeout_s=5`, `dispatcher.max_run_s=600`, `dispatcher.max_run_by_exec.report.>=900`,
`dispatcher.cancel_grace_s=10`, ...) plus job priorities, which are no setting of the leader but
a policy a replay can try: `jobs.exec_priority.<exec>=N` and `jobs.client_priority.<client>=N`
(a client's wins over an exec's), and what-if pauses, no setting either:
`dispatcher.pause.exec.<pattern>=true` or `dispatcher.pause.client.<client>=true` holds that
exec pattern's queues or that client's jobs for the whole replay, `=false` never (either way
the recorded pauses and resumes of that same pattern or client are left out). Limits are
settings like any other: `dispatcher.limits.<scope>.<target>.<knob>=V` sets one knob
(`max_inflight`, `rate`, `burst`; `null` drops it, and a limit left with no knob is gone),
`dispatcher.limits.<scope>.<target>={...}` a whole limit (`null`: none); the recorded runtime
limits of a (scope, target) so named are left out, so the limit tried holds for the whole
replay. A value is read as JSON when it parses (`10`, `2.5`, `true`, `{"a": 1}`), else as
text; every value is then validated by the same pydantic models the leader's settings use, so
a wrong key or value fails with the key named.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dispatch.core.config import CoreConfig
from dispatch.core.control_commands import checked_target
from dispatch.core.errors import Rejected
from dispatch.core.job import PRIORITY_MAX, PRIORITY_MIN
from dispatch.settings import LIMIT_SCOPES, DispatcherSettings, LimitSettings, check_limit_target

IGNORED_BY_REPLAY = frozenset(
    {
        "group",
        "worker_expiry_s",
        "dedup_window_s",
        "dedup_filter_mb",
        "finished_window_s",
        "finished_max",
        "accept_log_gap",
    }
)
"""Settings that cannot change a replay (the simulated fleet never goes silent; the group is
chosen with `--group`; what the leader keeps in memory changes no decision): setting one is an
error rather than a silent no-op."""

PRIORITY_KEYS = ("exec_priority", "client_priority")

KEYED_SETTINGS = ("caps", "retry_by_exec", "max_run_by_exec")
"""Settings that are tables (client or exec pattern -> value): `dispatcher.<name>.<key>=value`
sets one entry, `dispatcher.<name>={...}` replaces the whole table."""


class OverrideError(ValueError):
    """A `--set` that names no setting, or gives it a value it cannot take; the message names
    the key."""


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    """The settings a replay runs under."""

    dispatcher: DispatcherSettings = field(default_factory=DispatcherSettings)
    exec_priority: Mapping[str, int] = field(default_factory=dict)
    client_priority: Mapping[str, int] = field(default_factory=dict)
    pauses: Mapping[tuple[str, str], bool] = field(default_factory=dict)
    """(scope, target) -> paused for the whole replay (True) or never (False); the recorded
    pauses and resumes of a target named here are not replayed."""
    limit_targets: frozenset[tuple[str, str]] = frozenset()
    """The (scope, target) whose limit a `--set dispatcher.limits...` named: their recorded
    runtime limits (`limit_set`/`limit_removed`) are not replayed."""

    def core_config(self) -> CoreConfig:
        # The simulated workers never go silent: expiry would only lose idle workers.
        return dataclasses.replace(self.dispatcher.core_config(), worker_expiry_s=None)

    def priority_of(self, exec_name: str, client_id: str, recorded: int) -> int:
        if client_id in self.client_priority:
            return self.client_priority[client_id]
        return self.exec_priority.get(exec_name, recorded)

    def to_dict(self) -> dict[str, Any]:
        """The policy as plain JSON (what a `replays` row records)."""
        settings = self.dispatcher.model_dump(mode="json", exclude=set(IGNORED_BY_REPLAY))
        settings["limits"] = self.dispatcher.model_dump(
            mode="json", include={"limits"}, exclude_none=True
        )["limits"]
        if self.pauses:
            pauses: dict[str, dict[str, bool]] = {}
            for (scope, target), paused in sorted(self.pauses.items()):
                pauses.setdefault(scope, {})[target] = paused
            settings = {**settings, "pause": pauses}
        return {
            "dispatcher": settings,
            "jobs": {
                "exec_priority": dict(sorted(self.exec_priority.items())),
                "client_priority": dict(sorted(self.client_priority.items())),
            },
        }


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, value read as JSON, else as text)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise OverrideError(f"--set {text!r}: expected key=value, e.g. dispatcher.default_cap=50")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def apply_overrides(base: DispatcherSettings, assignments: Sequence[str]) -> ReplayPolicy:
    """`base` with every `key=value` of `assignments` applied, in order (a later one wins)."""
    dispatcher: dict[str, Any] = base.model_dump()
    priorities: dict[str, dict[str, int]] = {name: {} for name in PRIORITY_KEYS}
    pauses: dict[tuple[str, str], bool] = {}
    limit_targets: set[tuple[str, str]] = set()
    for text in assignments:
        key, value = parse_assignment(text)
        section, _, rest = key.partition(".")
        if section == "dispatcher" and rest.partition(".")[0] == "pause":
            _set_pause(pauses, key, rest.partition(".")[2], value)
        elif section == "dispatcher" and rest.partition(".")[0] == "limits":
            _set_limit(dispatcher, limit_targets, key, rest.partition(".")[2], value)
        elif section == "dispatcher":
            _set_dispatcher(dispatcher, key, rest, value)
        elif section == "jobs":
            _set_priority(priorities, key, rest, value)
        else:
            raise OverrideError(
                f"--set {key}: unknown setting (a replay takes dispatcher.<setting>, "
                "jobs.exec_priority.<exec> and jobs.client_priority.<client>)"
            )
    try:
        settings = DispatcherSettings.model_validate(dispatcher)
    except ValidationError as error:
        raise OverrideError(_validation_message(error)) from None
    return ReplayPolicy(
        settings,
        priorities["exec_priority"],
        priorities["client_priority"],
        pauses,
        frozenset(limit_targets),
    )


def _set_pause(pauses: dict[tuple[str, str], bool], key: str, rest: str, value: Any) -> None:
    """`dispatcher.pause.exec.<pattern>` or `dispatcher.pause.client.<client>` = true/false."""
    scope, _, target = rest.partition(".")
    if scope not in ("exec", "client") or not target:
        raise OverrideError(
            f"--set {key}: expected dispatcher.pause.exec.<pattern>=true|false or "
            "dispatcher.pause.client.<client>=true|false"
        )
    if not isinstance(value, bool):
        raise OverrideError(f"--set {key}: expected true or false, got {value!r}")
    try:
        kind, name = checked_target(scope, target)
    except Rejected as error:
        raise OverrideError(f"--set {key}: {error.detail}") from None
    pauses[(kind.value, name)] = value


_LIMIT_FORM = (
    "expected dispatcher.limits.<client|exec|key>.<target>.<max_inflight|rate|burst>=N, "
    "dispatcher.limits.<client|exec|key>.<target>={...} or dispatcher.limits={...}"
)


def _set_limit(
    dispatcher: dict[str, Any],
    targets: set[tuple[str, str]],
    key: str,
    rest: str,
    value: Any,
) -> None:
    """`dispatcher.limits...` (`rest`: what follows `limits.`): a knob, a whole limit, or
    the whole table; the (scope, target) it names go to `targets`. The values are validated
    with the rest of the settings."""
    limits: dict[str, dict[str, Any]] = {
        scope: {target: dict(limit) for target, limit in by_target.items()}
        for scope, by_target in dispatcher.get("limits", {}).items()
    }
    if not rest:
        if not isinstance(value, dict):
            raise OverrideError(f"--set {key}: {_LIMIT_FORM}")
        for scope, by_target in value.items():
            if isinstance(by_target, dict):
                targets.update((scope, target) for target in by_target)
        targets.update(
            (scope, target) for scope, by_target in limits.items() for target in by_target
        )
        dispatcher["limits"] = value
        return
    scope, _, path = rest.partition(".")
    if scope not in LIMIT_SCOPES or not path:
        raise OverrideError(f"--set {key}: {_LIMIT_FORM}")
    head, _, last = path.rpartition(".")
    if head and last in LimitSettings.model_fields and not isinstance(value, dict):
        target, knob = head, last
    else:
        target, knob = path, None
    try:
        check_limit_target(scope, target)
    except ValueError as error:
        raise OverrideError(f"--set {key}: {scope} {target!r}: {error}") from None
    by_target = limits.setdefault(scope, {})
    if knob is None:
        if value is None:
            by_target.pop(target, None)
        elif isinstance(value, dict):
            by_target[target] = value
        else:
            raise OverrideError(f"--set {key}: {_LIMIT_FORM}")
    else:
        limit = {
            name: number for name, number in by_target.get(target, {}).items() if number is not None
        }
        if value is None:
            limit.pop(knob, None)
        else:
            limit[knob] = value
        if limit:
            by_target[target] = limit
        else:
            by_target.pop(target, None)
    targets.add((scope, target))
    dispatcher["limits"] = limits


def _set_dispatcher(dispatcher: dict[str, Any], key: str, rest: str, value: Any) -> None:
    name, _, sub = rest.partition(".")
    if name not in DispatcherSettings.model_fields:
        known = ", ".join(sorted(set(DispatcherSettings.model_fields) - IGNORED_BY_REPLAY))
        raise OverrideError(f"--set {key}: unknown setting (dispatcher settings: {known})")
    if name in IGNORED_BY_REPLAY:
        raise OverrideError(f"--set {key}: does not change a replay (see docs/replay.md)")
    if name in KEYED_SETTINGS:
        if sub:
            dispatcher[name] = {**dispatcher[name], sub: value}
        elif isinstance(value, dict):
            dispatcher[name] = value
        else:
            entry = "<client>" if name == "caps" else "<exec pattern>"
            raise OverrideError(
                f"--set {key}: expected dispatcher.{name}.{entry}=value or a JSON object"
            )
        return
    if sub:
        raise OverrideError(f"--set {key}: dispatcher.{name} has no sub-keys")
    dispatcher[name] = value


def _set_priority(priorities: dict[str, dict[str, int]], key: str, rest: str, value: Any) -> None:
    name, _, target = rest.partition(".")
    if name not in priorities or not target:
        raise OverrideError(
            f"--set {key}: unknown setting (jobs.exec_priority.<exec> or "
            "jobs.client_priority.<client>)"
        )
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not PRIORITY_MIN <= value <= PRIORITY_MAX
    ):
        raise OverrideError(
            f"--set {key}: expected an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {value!r}"
        )
    priorities[name][target] = value


def _validation_message(error: ValidationError) -> str:
    parts = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"])
        key = f"dispatcher.{where}" if where else "dispatcher"
        parts.append(f"--set {key}: {problem['msg']}")
    return "; ".join(parts)


__all__ = [
    "IGNORED_BY_REPLAY",
    "OverrideError",
    "ReplayPolicy",
    "apply_overrides",
    "parse_assignment",
]
