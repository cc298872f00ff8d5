"""One replay from end to end: read the window, build the fleet and the policy, simulate,
compare. `replay_history` is the pure part (a history in, a report out); `run_replay` adds the
reading from Delta."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dispatch.replay.fleet import DEFAULT_SUBJECTS, FleetWorker, recorded_fleet, typical_slots
from dispatch.replay.fleet import uniform_fleet as make_uniform_fleet
from dispatch.replay.history import recorded_history
from dispatch.replay.model import History
from dispatch.replay.overrides import ReplayPolicy, apply_overrides
from dispatch.replay.report import ReplayReport, compare
from dispatch.replay.simulation import simulate
from dispatch.replay.source import DEFAULT_TAIL_S, DEFAULT_WARMUP_S, read_events
from dispatch.settings import DispatcherSettings

if TYPE_CHECKING:
    from dispatch.warehouse import Warehouse


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """What `dispatch replay` was asked (its options)."""

    since: float | None = None
    until: float | None = None
    version: int | None = None
    group: str = "default"
    tail_s: float = DEFAULT_TAIL_S
    warmup_s: float = DEFAULT_WARMUP_S
    assignments: tuple[str, ...] = ()
    workers: int | None = None
    """None: the recorded fleet."""
    slots: int | None = None
    """Slots (credit) per worker of a `workers` fleet; None: the recorded workers' median."""
    subjects: tuple[str, ...] = DEFAULT_SUBJECTS
    seed: int = 0


def fleet_for(request: ReplayRequest, history: History) -> tuple[FleetWorker, ...]:
    if request.workers is None:
        return recorded_fleet(history)
    slots = request.slots if request.slots is not None else typical_slots(history)
    return make_uniform_fleet(request.workers, slots, request.subjects)


def parameters_of(
    request: ReplayRequest, policy: ReplayPolicy, history: History, fleet: Sequence[FleetWorker]
) -> dict[str, Any]:
    """Everything the run depends on, as plain JSON (no wall-clock time)."""
    return {
        "window": {
            "since": history.since,
            "until": history.until,
            "version": request.version,
            "group": request.group,
            "tail_s": request.tail_s,
            "warmup_s": request.warmup_s,
        },
        "set": list(request.assignments),
        "policy": policy.to_dict(),
        "fleet": {
            "recorded": request.workers is None,
            "workers": len(fleet),
            "slots": sum(worker.slots for worker in fleet),
        },
        "seed": request.seed,
        "jobs": len(history.reported),
    }


def replay_history(
    history: History,
    policy: ReplayPolicy,
    fleet: Sequence[FleetWorker],
    *,
    recorded_under: DispatcherSettings,
    seed: int = 0,
    parameters: dict[str, Any] | None = None,
    input_events: int | None = None,
) -> ReplayReport:
    """Simulate `history` under `policy` on `fleet` and compare it with the recording."""
    result = simulate(
        history.jobs,
        fleet,
        policy,
        recorded_under=recorded_under,
        seed=seed,
        iterations=history.instants,
        controls=history.controls,
    )
    return ReplayReport(
        parameters=parameters or {},
        input_events=len(history.events) if input_events is None else input_events,
        simulated_events=len(result.events),
        groups=tuple(compare(history.events, result.events, history.reported)),
    )


def run_replay(
    warehouse: Warehouse, recorded_under: DispatcherSettings, request: ReplayRequest
) -> ReplayReport:
    """Read the window from Delta `events` and replay it (raises `WindowError`,
    `OverrideError`, or ValueError for a bad fleet)."""
    policy = apply_overrides(recorded_under, request.assignments)
    events = read_events(
        warehouse,
        group=request.group,
        since=None if request.since is None else request.since - request.warmup_s,
        until=request.until,
        tail_s=request.tail_s,
        version=request.version,
    )
    history = recorded_history(
        events, since=request.since, until=request.until, warmup_s=request.warmup_s
    )
    fleet = fleet_for(request, history)
    return replay_history(
        history,
        policy,
        fleet,
        recorded_under=recorded_under,
        seed=request.seed,
        parameters=parameters_of(request, policy, history, fleet),
        input_events=len(events),
    )
