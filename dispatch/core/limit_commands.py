"""Operator controls: setting and removing runtime limits, and reading them.

A runtime limit (`dispatch.core.limits`) is an event (`limit_set`, `limit_removed`) naming
the key that asked, so it is in the log, survives a failover (the streaming fold keeps the
limits in force in Delta) and a replay sees it. Setting a limit never stops a running job:
it holds what has not started.
"""

from __future__ import annotations

from typing import Any

from dispatch.core import _validate as v
from dispatch.core.client_commands import checked_by
from dispatch.core.commands import MAX_EXEC_LENGTH
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Event, LimitRemoved, LimitSet
from dispatch.core.limits import (
    MAX_LIMIT_REASON,
    MAX_LIMITS,
    KeyGate,
    Limit,
    LimitScope,
    check_target,
)
from dispatch.core.scheduler import Scheduler
from dispatch.core.state import DispatcherState


def checked_limit_target(scope: object, target: object) -> tuple[LimitScope, str]:
    """(scope, target) of a limit, or Rejected INVALID naming the field."""
    try:
        kind = v.as_enum(LimitScope, scope, "scope")
        name = check_target(kind, target, MAX_EXEC_LENGTH)
    except ValueError as error:
        raise Rejected(RejectCode.INVALID, str(error)) from None
    return kind, name


class LimitCommands:
    """`set_limit`, `remove_limit` and the views of the limits in force."""

    def __init__(self, state: DispatcherState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    def set_limit(
        self,
        scope: str,
        target: str,
        now: float,
        *,
        max_inflight: int | None = None,
        rate: float | None = None,
        burst: int | None = None,
        by: str | None = None,
        reason: str = "",
    ) -> list[Event]:
        """Put a runtime limit on (scope, target), replacing the one in force there (or the
        settings' one), then assign what a looser limit lets start. The same knobs as the
        runtime limit in force answer []."""
        kind, name = checked_limit_target(scope, target)
        try:
            limit = Limit.checked(max_inflight, rate, burst)
        except ValueError as error:
            raise Rejected(RejectCode.INVALID, str(error)) from None
        by = checked_by(by, None)
        if not isinstance(reason, str) or len(reason) > MAX_LIMIT_REASON:
            raise Rejected(
                RejectCode.INVALID, f"reason: a string of at most {MAX_LIMIT_REASON} characters"
            )
        state = self._state
        current = state._limits.get((kind, name))
        if current is not None and current.limit == limit:
            return []
        if current is None and len(state._limits) >= MAX_LIMITS:
            raise Rejected(RejectCode.INVALID, f"{MAX_LIMITS} limits are in force: remove some")
        now = state.advance_to(now)
        out: list[Event] = []
        event = LimitSet(
            epoch=state.fence.epoch,
            at=now,
            scope=kind,
            target=name,
            max_inflight=limit.max_inflight,
            rate=limit.rate,
            burst=limit.burst,
            by=by,
            reason=reason,
        )
        state.emit(event, out)
        self._scheduler.assignment_pass(now, out)
        return out

    def remove_limit(
        self, scope: str, target: str, now: float, *, by: str | None = None
    ) -> list[Event]:
        """End the runtime limit on (scope, target) (the settings' one, if any, applies
        again), then assign what it held. No runtime limit there answers []."""
        kind, name = checked_limit_target(scope, target)
        by = checked_by(by, None)
        state = self._state
        if (kind, name) not in state._limits:
            return []
        now = state.advance_to(now)
        out: list[Event] = []
        state.emit(
            LimitRemoved(epoch=state.fence.epoch, at=now, scope=kind, target=name, by=by), out
        )
        self._scheduler.assignment_pass(now, out)
        return out

    def limits(self) -> list[LimitSet]:
        """The runtime limits in force, oldest first."""
        return sorted(self._state._limits.values(), key=lambda event: event.at)

    def limit_views(self) -> list[dict[str, Any]]:
        """Every limit in force, runtime ones (oldest first) then the settings' ones not
        replaced, each with what it counts now (see `limit_view`)."""
        state = self._state
        out = [self._view(event.scope, event.target) for event in self.limits()]
        for scope_name, targets in state.config.limits.items():
            scope = LimitScope(scope_name)
            for target in targets:
                if (scope, target) not in state._limits:
                    out.append(self._view(scope, target))
        return [view for view in out if view is not None]

    def limit_view(self, scope: str, target: str) -> dict[str, Any] | None:
        """The limit in force on (scope, target) as plain data, or None: its knobs, where it
        comes from (`runtime` or `settings`; who set it, why and when), `inflight` (its
        running jobs; None for a key pattern, which counts each key on its own) and `held`
        (queued jobs it holds now). O(keys) for a key pattern."""
        kind, name = checked_limit_target(scope, target)
        return self._view(kind, name)

    def _view(self, scope: LimitScope, target: str) -> dict[str, Any] | None:
        state = self._state
        event = state._limits.get((scope, target))
        limit = state._limit_of(scope, target)
        if limit is None:
            return None
        inflight: int | None
        if scope is LimitScope.CLIENT:
            client = state._clients.get(target)
            inflight = 0 if client is None else client.inflight
            held = 0 if client is None else sum(lane.live for lane in client.parked)
        elif scope is LimitScope.EXEC:
            gate = state._exec_gates[target]
            inflight = gate.inflight
            held = sum(state._queues[exec_name].ready for exec_name in gate.held)
        elif target.endswith("*"):
            inflight = None
            held = sum(len(gate.held_jobs) for gate in self._keys_under(target))
        else:
            key_gate = state._keys.get(target)
            inflight = 0 if key_gate is None else key_gate.inflight
            held = 0 if key_gate is None else len(key_gate.held_jobs)
        return {
            "scope": scope.value,
            "target": target,
            "max_inflight": limit.max_inflight,
            "rate": limit.rate,
            "burst": limit.burst,
            "source": "settings" if event is None else "runtime",
            "by": None if event is None else event.by,
            "reason": "" if event is None else event.reason,
            "at": None if event is None else event.at,
            "inflight": inflight,
            "held": held,
        }

    def _keys_under(self, pattern: str) -> list[KeyGate]:
        """The live keys whose limit is this key pattern's."""
        state = self._state
        limit = state._key_limits.get(pattern)
        return [
            gate
            for gate in state._keys.values()
            if gate.limit is limit and gate.key.startswith(pattern[:-1])
        ]
