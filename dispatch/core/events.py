"""Events: the facts the core emits and folds. Each is one line of the `dispatch.events` log.

Every event has a `type` (class constant), the leader `epoch` that wrote it and `at`, the
unix time (seconds) at which it was decided. Events about one job derive from `JobEvent` and
carry `job_id`; the per-job reducer (`dispatch.core.reducer`) folds exactly those.

`to_dict()` gives a plain JSON-able dict; `event_from_dict()` validates one and raises
ValueError naming the bad field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar

from dispatch.core import _validate as v
from dispatch.core.commands import MAX_EXEC_LENGTH
from dispatch.core.job import PRIORITY_MAX, PRIORITY_MIN, DeadReason, RequeueReason
from dispatch.core.limits import Limit, LimitScope, check_key, check_target
from dispatch.core.progress import check_progress
from dispatch.core.retry import RetryPolicy
from dispatch.core.subjects import compile_pattern, validate_exec, validate_patterns


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of all events."""

    type: ClassVar[str] = ""
    epoch: int
    at: float

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of JSON-able values, `type` first."""
        out: dict[str, Any] = {"type": self.type}
        for name in _FIELDS[type(self)]:
            value = getattr(self, name)
            if isinstance(value, StrEnum):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out


# --- facts about the leader and the log ----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderElected(Event):
    """A leader took over with `epoch`; later events of lower epochs are void (EpochFence)."""

    type: ClassVar[str] = "leader_elected"
    holder: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pruned(Event):
    """Succeeded and cancelled jobs that became terminal at or before `before` are forgotten
    by the core (dedup window). The Delta tables keep them; the per-job fold ignores this."""

    type: ClassVar[str] = "pruned"
    before: float


class PauseScope(StrEnum):
    """What a pause holds: the queues of an exec pattern, or a client's jobs."""

    EXEC = "exec"
    CLIENT = "client"


@dataclass(frozen=True, slots=True, kw_only=True)
class Paused(Event):
    """No new attempt starts for `target` (an exec pattern, or a client id, per `scope`)
    until it is resumed; running attempts go on."""

    type: ClassVar[str] = "paused"
    scope: PauseScope
    target: str
    by: str | None = None
    """The name of the API key that paused it (None: not recorded)."""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        _drop_unset(out, ("by", "reason"))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed(Event):
    """A pause of `target` ended: its queued jobs may start again."""

    type: ClassVar[str] = "resumed"
    scope: PauseScope
    target: str
    by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        _drop_unset(out, ("by",))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitSet(Event):
    """A runtime limit on `target` (a client id, an exec pattern, or a key or key pattern,
    per `scope`) is in force from now: it replaces the one before (or the settings' one).
    At least one of `max_inflight` and `rate` is set; `burst` goes with `rate`."""

    type: ClassVar[str] = "limit_set"
    scope: LimitScope
    target: str
    max_inflight: int | None = None
    rate: float | None = None
    burst: int | None = None
    by: str | None = None
    """The name of the API key that set it (None: not recorded)."""
    reason: str = ""

    @property
    def limit(self) -> Limit:
        return Limit(self.max_inflight, self.rate, self.burst)

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        _drop_unset(out, ("max_inflight", "rate", "burst", "by", "reason"))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitRemoved(Event):
    """The runtime limit on `target` ended (the settings' one, if any, applies again)."""

    type: ClassVar[str] = "limit_removed"
    scope: LimitScope
    target: str
    by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        _drop_unset(out, ("by",))
        return out


# --- facts about workers -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerJoined(Event):
    """A worker (re)registered with its subject patterns; it starts with no credit.

    `owner` is the name of the API key that registered the worker id (the id is bound to it
    until the worker is lost); None keeps the owner already recorded (an admin's join, or a
    log written before owners existed)."""

    type: ClassVar[str] = "worker_joined"
    worker_id: str
    subjects: tuple[str, ...]
    owner: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        if out["owner"] is None:
            # Left out rather than null: a join without an owner is written exactly as
            # before owners existed, so nodes that do not know the field still read it.
            del out["owner"]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CreditGranted(Event):
    """A worker can take `credits` more jobs (or exactly `credits` jobs, if `replace`)."""

    type: ClassVar[str] = "credit_granted"
    worker_id: str
    credits: int
    replace: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerHeartbeat(Event):
    """A worker is alive."""

    type: ClassVar[str] = "worker_heartbeat"
    worker_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLost(Event):
    """A worker is gone. Its jobs were requeued (or dead-lettered) by the events just before."""

    type: ClassVar[str] = "worker_lost"
    worker_id: str
    reason: str = ""


# --- facts about one job -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEvent(Event):
    """Base of events about one job."""

    job_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Enqueued(JobEvent):
    """A new job entered its exec queue (`not_before`: not runnable before that time)."""

    type: ClassVar[str] = "enqueued"
    client_id: str
    exec: str
    payload: Any
    max_attempts: int
    timeout_s: float
    priority: int = 0
    not_before: float | None = None
    seq: int
    retry: RetryPolicy | None = None
    """The job's own retry policy (None: its exec's default when a delay is decided)."""
    expires_at: float | None = None
    """Not started by then, the job expires (None: never)."""
    max_run_s: float | None = None
    """Hard time limit of each attempt, the job's own or its exec's default (None: none)."""
    key: str | None = None
    """The job's concurrency key (None: none)."""

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        # Left out when unset, so that a job using none of them is written exactly as
        # before they existed (older nodes still read it).
        if self.retry is None:
            del out["retry"]
        else:
            out["retry"] = self.retry.to_dict()
        _drop_unset(out, ("expires_at", "max_run_s", "key"))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Assigned(JobEvent):
    """A queued job was given to `worker_id` (spending one credit) as attempt `attempt`."""

    type: ClassVar[str] = "assigned"
    worker_id: str
    attempt: int
    lease: str
    deadline: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Reassigned(JobEvent):
    """A running job's deadline passed; it moved to `worker_id` as attempt `attempt`.

    A different worker spends one credit; the same worker (`worker_id ==
    previous_worker_id`) keeps the slot of its timed-out attempt and spends none."""

    type: ClassVar[str] = "reassigned"
    worker_id: str
    previous_worker_id: str
    attempt: int
    lease: str
    deadline: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JobHeartbeat(JobEvent):
    """The worker running attempt `attempt` is alive; its deadline is now `deadline`."""

    type: ClassVar[str] = "job_heartbeat"
    worker_id: str
    attempt: int
    lease: str
    deadline: float
    progress: Mapping[str, Any] | None = None
    """The worker's progress report (`{done, total, message}`), at most one a second per
    job (None: none, or one too soon after the last)."""

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        if self.progress is None:
            del out["progress"]
        else:
            out["progress"] = dict(self.progress)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Completed(JobEvent):
    """The worker acked attempt `attempt` with `result`: the job succeeded."""

    type: ClassVar[str] = "completed"
    worker_id: str
    attempt: int
    lease: str
    result: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Requeued(JobEvent):
    """A running job went back to its queue at position `seq` (before later submissions),
    not runnable before `not_before` (its retry delay; None: at once)."""

    type: ClassVar[str] = "requeued"
    reason: RequeueReason
    worker_id: str
    attempt: int
    error: str | None = None
    seq: int
    not_before: float | None = None
    retry_after_s: float | None = None
    """The delay the worker asked for, when it did (None: the job's retry policy decided).
    Folding ignores it (`not_before` is the fact); a replay gives the worker's answer again."""

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        # Left out when unset: written as before retry delays existed.
        if out["not_before"] is None:
            del out["not_before"]
        if out["retry_after_s"] is None:
            del out["retry_after_s"]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLettered(JobEvent):
    """A running job went to the dead-letter queue."""

    type: ClassVar[str] = "dead_lettered"
    reason: DeadReason
    worker_id: str
    attempt: int
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested(JobEvent):
    """A cancel was asked for while the job ran attempt `attempt` on `worker_id`: the worker
    is told to stop, and its deadline is now `deadline` (at most the cancel grace away). The
    job ends `cancelled` when the worker confirms (a failure of that attempt) or at that
    deadline; an ack before then still completes it (the work was done)."""

    type: ClassVar[str] = "cancel_requested"
    worker_id: str
    attempt: int
    deadline: float
    by: str | None = None
    """The name of the API key that asked (None: an admin without a name, or the core)."""
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancelled(JobEvent):
    """A job was cancelled: a queued one at once; a running one (`worker_id` and `attempt`
    set) when its worker confirmed it stopped, or its cancel grace passed."""

    type: ClassVar[str] = "cancelled"
    worker_id: str | None = None
    attempt: int | None = None
    by: str | None = None
    """The name of the API key that asked (None: not recorded, or the core itself)."""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        # A queued job's cancel without a reason is written exactly as before these fields.
        _drop_unset(out, ("worker_id", "attempt", "by", "reason"))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Expired(JobEvent):
    """A queued job reached its `expires_at` before an attempt started: it never runs."""

    type: ClassVar[str] = "expired"
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Redriven(JobEvent):
    """A dead job was requeued at position `seq` with its attempts reset to 0."""

    type: ClassVar[str] = "redriven"
    seq: int
    by: str | None = None
    """The name of the API key that redrove it (None: not recorded)."""

    def to_dict(self) -> dict[str, Any]:
        out = Event.to_dict(self)
        _drop_unset(out, ("by",))
        return out


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        LeaderElected,
        Pruned,
        Paused,
        Resumed,
        LimitSet,
        LimitRemoved,
        WorkerJoined,
        CreditGranted,
        WorkerHeartbeat,
        WorkerLost,
        Enqueued,
        Assigned,
        Reassigned,
        JobHeartbeat,
        Completed,
        Requeued,
        DeadLettered,
        CancelRequested,
        Cancelled,
        Expired,
        Redriven,
    )
}
"""Every event class by its `type` string."""

_FIELDS: dict[type[Event], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in EVENT_TYPES.values()
}


def _drop_unset(out: dict[str, Any], names: tuple[str, ...]) -> None:
    """Leave out optional fields at their default (None or ""): an event that does not use
    a field added later is written exactly as before it existed."""
    for name in names:
        if out[name] is None or out[name] == "":
            del out[name]


# --- validation ----------------------------------------------------------------------------

_Parse = Callable[[Any, str], Any]


def _exec(value: Any, label: str) -> str:
    try:
        return validate_exec(value)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


def _subjects(value: Any, label: str) -> tuple[str, ...]:
    patterns = v.as_str_tuple(value, label)
    try:
        # Unbounded: a log written before the pattern limits must still replay (the limits
        # apply to what a worker sends, in `join`).
        return validate_patterns(patterns, bounded=False)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


def _any(value: Any, label: str) -> Any:
    return value


def _attempt(value: Any, label: str) -> int:
    return v.as_int(value, label, minimum=1)


def _lease(value: Any, label: str) -> str:
    lease = v.as_str(value, label)
    if not lease:
        raise ValueError(f"{label}: expected a non-empty string")
    return lease


def _pause_target(value: Any, label: str) -> str:
    target = v.as_str(value, label)
    if not target:
        raise ValueError(f"{label}: expected a non-empty string")
    return target


def _check_pause_target(type_name: str, scope: PauseScope, target: str) -> None:
    """A pause's target as its scope wants it: a well-formed exec pattern, or a client id
    (so that folding the event cannot fail on it)."""
    label = f"{type_name}.target"
    if scope is PauseScope.CLIENT:
        v.as_id(target, label)
        return
    try:
        compile_pattern(target)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


_COMMON: dict[str, _Parse] = {
    "epoch": lambda value, label: v.as_int(value, label, minimum=0),
    "at": v.as_number,
}
_JOB: dict[str, _Parse] = {"job_id": v.as_id}
_SCHEMAS: dict[type[Event], dict[str, _Parse]] = {
    LeaderElected: {"holder": v.as_str},
    Pruned: {"before": v.as_number},
    Paused: {
        "scope": lambda value, label: v.as_enum(PauseScope, value, label),
        "target": _pause_target,
        "by": v.as_opt_str,
        "reason": v.as_str,
    },
    Resumed: {
        "scope": lambda value, label: v.as_enum(PauseScope, value, label),
        "target": _pause_target,
        "by": v.as_opt_str,
    },
    LimitSet: {
        "scope": lambda value, label: v.as_enum(LimitScope, value, label),
        "target": _pause_target,
        "max_inflight": lambda value, label: None if value is None else v.as_int(value, label, 1),
        "rate": lambda value, label: (
            None if value is None else float(v.as_number(value, label, positive=True))
        ),
        "burst": lambda value, label: None if value is None else v.as_int(value, label, 1),
        "by": v.as_opt_str,
        "reason": v.as_str,
    },
    LimitRemoved: {
        "scope": lambda value, label: v.as_enum(LimitScope, value, label),
        "target": _pause_target,
        "by": v.as_opt_str,
    },
    WorkerJoined: {"worker_id": v.as_id, "subjects": _subjects, "owner": v.as_opt_str},
    CreditGranted: {
        "worker_id": v.as_id,
        "credits": lambda value, label: v.as_int(value, label, minimum=0),
        "replace": v.as_bool,
    },
    WorkerHeartbeat: {"worker_id": v.as_id},
    WorkerLost: {"worker_id": v.as_id, "reason": v.as_str},
    Enqueued: {
        **_JOB,
        "client_id": v.as_id,
        "exec": _exec,
        "payload": _any,
        "max_attempts": lambda value, label: v.as_int(value, label, minimum=1),
        "timeout_s": lambda value, label: v.as_number(value, label, positive=True),
        "priority": lambda value, label: v.as_int(value, label, PRIORITY_MIN, PRIORITY_MAX),
        "not_before": v.as_opt_number,
        "seq": v.as_int,
        "retry": lambda value, label: (
            None if value is None else RetryPolicy.from_dict(value, label)
        ),
        "expires_at": v.as_opt_number,
        "max_run_s": lambda value, label: (
            None if value is None else v.as_number(value, label, positive=True)
        ),
        "key": lambda value, label: None if value is None else check_key(value, label),
    },
    Assigned: {
        **_JOB,
        "worker_id": v.as_id,
        "attempt": _attempt,
        "lease": _lease,
        "deadline": v.as_number,
    },
    Reassigned: {
        **_JOB,
        "worker_id": v.as_id,
        "previous_worker_id": v.as_id,
        "attempt": _attempt,
        "lease": _lease,
        "deadline": v.as_number,
    },
    JobHeartbeat: {
        **_JOB,
        "worker_id": v.as_id,
        "attempt": _attempt,
        "lease": _lease,
        "deadline": v.as_number,
        "progress": lambda value, label: None if value is None else check_progress(value, label),
    },
    Completed: {
        **_JOB,
        "worker_id": v.as_id,
        "attempt": _attempt,
        "lease": _lease,
        "result": _any,
    },
    Requeued: {
        **_JOB,
        "reason": lambda value, label: v.as_enum(RequeueReason, value, label),
        "worker_id": v.as_id,
        "attempt": _attempt,
        "error": v.as_opt_str,
        "seq": v.as_int,
        "not_before": v.as_opt_number,
        "retry_after_s": v.as_opt_number,
    },
    DeadLettered: {
        **_JOB,
        "reason": lambda value, label: v.as_enum(DeadReason, value, label),
        "worker_id": v.as_id,
        "attempt": _attempt,
        "error": v.as_opt_str,
    },
    CancelRequested: {
        **_JOB,
        "worker_id": v.as_id,
        "attempt": _attempt,
        "deadline": v.as_number,
        "by": v.as_opt_str,
        "reason": v.as_str,
    },
    Cancelled: {
        **_JOB,
        "worker_id": v.as_opt_id,
        "attempt": lambda value, label: None if value is None else _attempt(value, label),
        "by": v.as_opt_str,
        "reason": v.as_str,
    },
    Expired: {**_JOB, "reason": v.as_str},
    Redriven: {**_JOB, "seq": v.as_int, "by": v.as_opt_str},
}
_ALLOWED: dict[type[Event], frozenset[str]] = {
    cls: frozenset({"type", *_FIELDS[cls]}) for cls in EVENT_TYPES.values()
}
# Fields with a default in the dataclass may be absent from the dict.
_DEFAULTED: dict[type[Event], frozenset[str]] = {
    cls: frozenset(
        f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING
    )
    for cls in EVENT_TYPES.values()
}


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Build and validate an event from its `to_dict()` form.

    Raises ValueError naming the bad field (e.g. "assigned.attempt: expected an integer >= 1,
    got 0") for an unknown type, a missing or unknown field, or a wrongly typed value.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"event: expected a JSON object, got {type(data).__name__}")
    type_name = data.get("type")
    cls = EVENT_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None or not isinstance(type_name, str):
        raise ValueError(f"event.type: unknown event type {type_name!r}")
    v.check_keys(data, _ALLOWED[cls], type_name)
    parsers = _SCHEMAS[cls]
    defaulted = _DEFAULTED[cls]
    kwargs: dict[str, Any] = {}
    for name in _FIELDS[cls]:
        label = f"{type_name}.{name}"
        if name not in data:
            if name in defaulted:
                continue
            raise ValueError(f"{label}: missing required field")
        parse = _COMMON.get(name) or parsers[name]
        kwargs[name] = parse(data[name], label)
    if cls is Cancelled and (kwargs.get("worker_id") is None) != (kwargs.get("attempt") is None):
        raise ValueError(
            "cancelled.attempt: a running job's cancel names both worker_id and attempt, a "
            "queued job's neither"
        )
    if cls is Paused or cls is Resumed:
        _check_pause_target(type_name, kwargs["scope"], kwargs["target"])
    if cls is LimitSet or cls is LimitRemoved:
        _check_limit(type_name, kwargs)
    return cls(**kwargs)


def _check_limit(type_name: str, kwargs: dict[str, Any]) -> None:
    """A limit's target as its scope wants it, and (for `limit_set`) knobs a command could
    have decided, so that folding the event cannot fail on them."""
    try:
        check_target(kwargs["scope"], kwargs["target"], MAX_EXEC_LENGTH)
        if type_name == LimitSet.type:
            Limit.checked(kwargs.get("max_inflight"), kwargs.get("rate"), kwargs.get("burst"))
    except ValueError as error:
        raise ValueError(f"{type_name}.{error}") from None
