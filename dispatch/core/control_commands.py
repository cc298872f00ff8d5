"""Operator controls: pausing and resuming an exec pattern's queues or a client's jobs.

A pause holds what has not started: no new attempt of a matching job starts (a timed-out
attempt is requeued rather than reassigned), while running attempts go on and settle as
usual. Submissions are still accepted and wait. Each pause and resume is an event
(`paused`, `resumed`) naming the key that asked, so it is in the log, survives a failover
(the streaming fold keeps the pauses in force in Delta) and a replay sees it.
"""

from __future__ import annotations

from dispatch.core import _validate as v
from dispatch.core.client_commands import checked_by
from dispatch.core.commands import MAX_EXEC_LENGTH
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Event, Paused, PauseScope, Resumed
from dispatch.core.scheduler import Scheduler
from dispatch.core.state import DispatcherState
from dispatch.core.subjects import compile_pattern

MAX_PAUSES = 10_000
"""Most pauses in force at once (each exec pause is checked for every new exec queue)."""
MAX_PAUSE_REASON = 1_000
"""Longest reason a pause may record."""


def checked_target(scope: object, target: object) -> tuple[PauseScope, str]:
    """(scope, target) of a pause, or Rejected INVALID naming the field: an exec pattern
    (`*` one token, a final `>` one or more; at most MAX_EXEC_LENGTH characters) or a client
    id."""
    try:
        kind = v.as_enum(PauseScope, scope, "scope")
        if kind is PauseScope.EXEC:
            name = v.as_str(target, "exec")
            if len(name) > MAX_EXEC_LENGTH:
                raise ValueError(f"exec: longer than {MAX_EXEC_LENGTH} characters")
            try:
                compile_pattern(name)
            except ValueError as error:
                raise ValueError(f"exec: {error}") from None
        else:
            name = v.as_id(target, "client_id")
    except ValueError as error:
        raise Rejected(RejectCode.INVALID, str(error)) from None
    return kind, name


class ControlCommands:
    """Pause and unpause (the `resumed` event)."""

    def __init__(self, state: DispatcherState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    def pause(
        self, scope: str, target: str, now: float, *, by: str | None = None, reason: str = ""
    ) -> list[Event]:
        """Pause an exec pattern's queues (`scope="exec"`) or a client's jobs
        (`scope="client"`): nothing new of theirs starts until `unpause`. Pausing what is
        paused answers [] (the first pause's reason and key stay)."""
        kind, name = checked_target(scope, target)
        by = checked_by(by, None)
        if not isinstance(reason, str) or len(reason) > MAX_PAUSE_REASON:
            raise Rejected(
                RejectCode.INVALID, f"reason: a string of at most {MAX_PAUSE_REASON} characters"
            )
        state = self._state
        if (kind, name) in state._pauses:
            return []
        if len(state._pauses) >= MAX_PAUSES:
            raise Rejected(RejectCode.INVALID, f"{MAX_PAUSES} pauses are in force: resume some")
        now = state.advance_to(now)
        out: list[Event] = []
        event = Paused(
            epoch=state.fence.epoch, at=now, scope=kind, target=name, by=by, reason=reason
        )
        state.emit(event, out)
        return out

    def unpause(self, scope: str, target: str, now: float, *, by: str | None = None) -> list[Event]:
        """End a pause (exactly the one of this scope and target: resuming `image.*` does
        not resume `image.>`), then assign what it held. Resuming what is not paused answers
        []."""
        kind, name = checked_target(scope, target)
        by = checked_by(by, None)
        state = self._state
        if (kind, name) not in state._pauses:
            return []
        now = state.advance_to(now)
        out: list[Event] = []
        state.emit(Resumed(epoch=state.fence.epoch, at=now, scope=kind, target=name, by=by), out)
        self._scheduler.assignment_pass(now, out)
        return out

    def pauses(self) -> list[Paused]:
        """The pauses in force, oldest first."""
        return sorted(self._state._pauses.values(), key=lambda event: event.at)
