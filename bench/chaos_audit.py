"""The chaos run's pure parts (`dispatch.bench.chaos`): the job mix and what each job must end in,
the counts over the events log and the workers' run files, and the verdict.

Nothing here touches a process, a socket or the clock: the run gathers the facts, these
functions count them (tests/unit/test_chaos_audit.py).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch.core.events import Completed, Enqueued, Event, JobEvent
from dispatch.core.fence import EpochFence

FAULT_KINDS = ("broker", "leader", "worker", "pause", "streaming")
DEFAULT_FAULTS = ("broker", "leader", "leader", "leader", "worker", "worker", "pause", "streaming")
PLAIN_KILLS = frozenset({"leader", "worker", "streaming"})
"""Faults after which the canary must finish within `CANARY_BOUND_S`."""
CANARY_BOUND_S = 10.0
TERMINAL = frozenset({"succeeded", "dead", "cancelled"})

# --- the job mix ---------------------------------------------------------------------------------

MIX: tuple[tuple[str, float], ...] = (
    ("ok", 0.80),
    ("flaky", 0.06),
    ("fail", 0.04),
    ("stall", 0.01),
    ("duplicate", 0.04),
    ("kafka", 0.04),
    ("malformed", 0.01),
)
EXPECTED_STATUS = {
    "ok": "succeeded",
    "flaky": "succeeded",
    "fail": "dead",
    "stall": "dead",
    "kafka": "succeeded",
    "canary": "succeeded",
}
"""The terminal state each kind of job must end in (a duplicate is its original's)."""
MALFORMED_VALUES: tuple[bytes, ...] = (
    b"{not json",
    b'{"exec": "chaos.ok", "payload": {}}',  # no id
    b'{"id": "x", "exec": 7, "payload": {}}',
    b"[1, 2, 3]",
    b"\xff\xfe\x00",
)
DUPLICATE_DISTANCE = 50
"""A duplicate repeats a job planned at least this many jobs earlier (not in its own batch)."""


@dataclass(frozen=True, slots=True)
class PlannedJob:
    id: str
    kind: str
    """ok, flaky, fail, stall, duplicate, kafka, malformed, canary."""
    exec: str = "chaos.ok"
    payload: Any = None
    timeout_s: float | None = None
    max_attempts: int | None = None
    priority: int = 0
    raw: bytes | None = None
    """The record value of a malformed job (sent as is, key = id)."""

    @property
    def via_kafka(self) -> bool:
        return self.kind in ("kafka", "malformed")

    def body(self) -> dict[str, Any]:
        """The REST / Kafka submission."""
        body: dict[str, Any] = {"id": self.id, "exec": self.exec, "payload": self.payload}
        if self.timeout_s is not None:
            body["timeout_s"] = self.timeout_s
        if self.max_attempts is not None:
            body["max_attempts"] = self.max_attempts
        if self.priority:
            body["priority"] = self.priority
        return body


def job_mix(count: int, seed: int, prefix: str = "chaos") -> list[PlannedJob]:
    """`count` planned jobs of the mix, reproducible from `seed`."""
    draw = random.Random(seed)
    kinds = [kind for kind, _ in MIX]
    weights = [weight for _, weight in MIX]
    planned: list[PlannedJob] = []
    for number in range(count):
        kind = draw.choices(kinds, weights)[0]
        job_id = f"{prefix}-{seed}-{number}"
        if kind == "duplicate":
            earlier = [job for job in planned[: max(0, number - DUPLICATE_DISTANCE)]
                       if job.kind == "ok"]  # fmt: skip
            if earlier:
                original = draw.choice(earlier)
                planned.append(PlannedJob(original.id, "duplicate", payload=original.payload))
                continue
            kind = "ok"
        planned.append(_planned(job_id, kind, draw))
    return planned


def _planned(job_id: str, kind: str, draw: random.Random) -> PlannedJob:
    if kind == "ok":
        return PlannedJob(job_id, kind, payload={"ms": draw.choice((5, 20, 50, 200))})
    if kind == "flaky":
        return PlannedJob(job_id, kind, exec="chaos.flaky", payload={})
    if kind == "fail":
        return PlannedJob(job_id, kind, exec="chaos.fail", payload={})
    if kind == "stall":
        # Attempt 1 times out after 1 s, attempt 2 after 2 s (backoff): dead after 2.
        return PlannedJob(job_id, kind, exec="chaos.stall", payload={"s": 2.5},
                          timeout_s=1.0, max_attempts=2)  # fmt: skip
    if kind == "kafka":
        return PlannedJob(job_id, kind, payload={"ms": 5})
    if kind == "malformed":
        return PlannedJob(job_id, kind, raw=draw.choice(MALFORMED_VALUES))
    raise ValueError(f"unknown kind {kind!r}")


def expected_status(planned: Sequence[PlannedJob]) -> dict[str, str]:
    """Job id -> the terminal status it must end in (malformed records make no job)."""
    expected: dict[str, str] = {}
    for job in planned:
        if job.kind in EXPECTED_STATUS:
            expected[job.id] = EXPECTED_STATUS[job.kind]
    return expected


# --- counting -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogRecord:
    at: float
    """The Kafka record's time (unix seconds)."""
    epoch: int
    events: list[Event]


@dataclass
class LogAudit:
    enqueued: set[str] = field(default_factory=set)
    completions: Counter[str] = field(default_factory=Counter)
    completion_times: list[float] = field(default_factory=list)
    """Record times of the records holding admitted `completed` events, in log order."""
    deposed_events: int = 0
    deposed_batches: int = 0
    elected: list[tuple[int, float]] = field(default_factory=list)
    """(epoch, record time) of every admitted `leader_elected`."""
    orphans: set[str] = field(default_factory=set)
    """Jobs with admitted events but no admitted `enqueued` before them: the log lacks what
    the leader acted on (a rebuild from it would not know the job)."""
    first_completed_at: dict[str, float] = field(default_factory=dict)
    """Job id -> the record time of its first admitted `completed`."""


def audit_log(records: Iterable[LogRecord]) -> LogAudit:
    """The log read with the core's epoch fence: what a deposed epoch wrote after a newer one
    was elected (void, counted), and the admitted enqueues and completions."""
    fence = EpochFence()
    audit = LogAudit()
    for record in records:
        voided = 0
        completed_here = False
        for event in record.events:
            if not fence.admit(event):
                voided += 1
                continue
            if event.type == "leader_elected":
                audit.elected.append((event.epoch, record.at))
            elif isinstance(event, Enqueued):
                audit.enqueued.add(event.job_id)
            elif isinstance(event, JobEvent) and event.job_id not in audit.enqueued:
                audit.orphans.add(event.job_id)
            elif isinstance(event, Completed):
                audit.completions[event.job_id] += 1
                audit.first_completed_at.setdefault(event.job_id, record.at)
                completed_here = True
        if voided:
            audit.deposed_events += voided
            audit.deposed_batches += 1
        if completed_here:
            audit.completion_times.append(record.at)
    return audit


def first_after(times: Iterable[float], moment: float) -> float | None:
    """The earliest time at or after `moment`, or None."""
    later = [at for at in times if at >= moment]
    return min(later) if later else None


@dataclass
class RunsAudit:
    successes: dict[str, int]
    """Job id -> attempts that ran to success on a worker."""
    twice: list[str]
    """Jobs run to success more than once, not explained by a worker kill."""
    twice_after_worker_kill: list[str]
    """Jobs run to success again after the worker of an earlier success was killed before
    it could have settled it (at-least-once by design)."""
    overruns: int
    """Attempts started while the worker already held as many as its slots."""
    max_running: dict[int, int]
    """Worker pid -> the most attempts it held at once."""
    started: int


KILL_SETTLE_WINDOW_S = 5.0
"""A success this long (or less) before its worker was killed may not have been settled."""


def audit_runs(lines: Iterable[Mapping[str, Any]], killed: Mapping[int, float]) -> RunsAudit:
    """The workers' run records (`dispatch.bench.chaos_worker`): `killed` is pid -> kill time."""
    successes: dict[str, list[tuple[float, int]]] = defaultdict(list)
    overruns = 0
    started = 0
    max_running: dict[int, int] = {}
    for line in lines:
        pid = int(line["pid"])
        if line["e"] == "start":
            started += 1
            running, slots = int(line["running"]), int(line["slots"])
            max_running[pid] = max(max_running.get(pid, 0), running)
            if running > slots:
                overruns += 1
        elif line["e"] == "end" and line.get("outcome") == "ok":
            successes[str(line["id"])].append((float(line["t"]), pid))
    twice: list[str] = []
    after_kill: list[str] = []
    for job_id, runs in successes.items():
        if len(runs) < 2:
            continue
        earlier = sorted(runs)[:-1]
        explained = all(
            pid in killed and 0 <= killed[pid] - at <= KILL_SETTLE_WINDOW_S for at, pid in earlier
        )
        (after_kill if explained else twice).append(job_id)
    return RunsAudit(
        successes={job_id: len(runs) for job_id, runs in successes.items()},
        twice=sorted(twice),
        twice_after_worker_kill=sorted(after_kill),
        overruns=overruns,
        max_running=max_running,
        started=started,
    )


OUTAGE_FAULTS = frozenset({"broker", "leader", "pause"})
"""Faults during which no leader serves (and deadlines are not watched)."""

OUTAGE_SLACK_S = 5.0
"""After an outage's recovery, the time a worker takes to reconnect and resend."""


def outage_windows(faults: Iterable[FaultRecord]) -> list[tuple[float, float]]:
    """(from, to) unix times during which no leader served, plus the workers' reconnection."""
    return [
        (fault.killed_at, fault.killed_at + (fault.recovered_s or 0.0) + OUTAGE_SLACK_S)
        for fault in faults
        if fault.kind in OUTAGE_FAULTS
    ]


def ran_across_an_outage(
    lines: Iterable[Mapping[str, Any]], windows: Sequence[tuple[float, float]]
) -> set[str]:
    """Ids with an attempt whose run (start to end, from the workers' records) overlapped an
    outage. A new leader moves the deadlines that fall in the outage later by its length
    (`Dispatcher.resume`), so a late attempt that overlapped one may be accepted: a stall
    job may then end succeeded, and that is not a wrong state."""
    starts: dict[tuple[str, int], float] = {}
    overlapped: set[str] = set()
    for line in lines:
        key = (str(line["id"]), int(line["attempt"]))
        if line["e"] == "start":
            starts[key] = float(line["t"])
        elif line["e"] == "end" and key in starts:
            began, ended = starts[key], float(line["t"])
            if any(began <= to and ended >= since for since, to in windows):
                overlapped.add(key[0])
    return overlapped


def wrong_states(
    expected: Mapping[str, str],
    statuses: Mapping[str, str | None],
    across_outage: Iterable[str] = (),
) -> list[str]:
    """Ids that ended (terminal) in another state than the mix expects; a job expected dead
    that succeeded is excused when an attempt of it ran across an outage."""
    excused = set(across_outage)
    return sorted(
        job_id
        for job_id, status in statuses.items()
        if status in TERMINAL
        and job_id in expected
        and expected[job_id] != status
        and not (job_id in excused and expected[job_id] == "dead" and status == "succeeded")
    )


def lost_jobs(accepted: Iterable[str], statuses: Mapping[str, str | None]) -> list[str]:
    """Accepted ids the API does not know, or that never ended."""
    return sorted(job_id for job_id in set(accepted) if statuses.get(job_id) not in TERMINAL)


def unexpected_jobs(enqueued: Iterable[str], planned_ids: Iterable[str]) -> list[str]:
    """Ids enqueued in the log that this run never submitted."""
    return sorted(set(enqueued) - set(planned_ids))


def disagreements(
    api: Mapping[str, str | None], delta: Mapping[str, str], ids: Iterable[str]
) -> list[str]:
    """Ids whose status in Delta is not the API's (or is missing from one side)."""
    return sorted(job_id for job_id in set(ids) if api.get(job_id) != delta.get(job_id))


@dataclass
class FaultRecord:
    kind: str
    at_s: float
    """Seconds after the load started."""
    killed_at: float
    """Unix time of the kill (or SIGSTOP)."""
    target: str
    recovered_s: float | None = None
    """Kill -> the component back (a ready leader, a restarted worker, the broker answering,
    the fold's next commit)."""
    kill_to_first_completion_s: float | None = None
    kill_to_first_accept_s: float | None = None
    broker_answering_to_first_accept_s: float | None = None
    answering_at: float | None = None
    """Unix time the restarted broker answered (broker faults)."""
    canary_id: str = ""
    canary_s: float | None = None
    """Fault -> the canary's end as its client saw it (the SDK's retries and long-polls in)."""
    canary_completed_in_log_s: float | None = None
    """Fault -> the canary's `completed` in the log (the dispatcher's part of `canary_s`)."""
    canary_status: str | None = None
    note: str = ""


def canary_failures(faults: Sequence[FaultRecord], bound_s: float = CANARY_BOUND_S) -> list[str]:
    """Why the canaries fail the run: slower than `bound_s` or unfinished after a plain kill."""
    reasons = []
    for number, fault in enumerate(faults, start=1):
        if fault.kind not in PLAIN_KILLS:
            continue
        if fault.canary_status != "succeeded" or fault.canary_s is None:
            reasons.append(f"fault {number} ({fault.kind}): canary {fault.canary_status}")
        elif fault.canary_s > bound_s:
            reasons.append(f"fault {number} ({fault.kind}): canary took {fault.canary_s:.1f} s")
    return reasons


def verdict(safety: Mapping[str, int | None], faults: Sequence[FaultRecord]) -> list[str]:
    """Every reason the run fails; empty when it passes."""
    reasons = [f"{name}: {count}" for name, count in safety.items() if count]
    reasons += [f"{name}: not measured" for name, count in safety.items() if count is None]
    reasons += [
        f"fault {number} ({fault.kind}): never recovered ({fault.note})"
        for number, fault in enumerate(faults, start=1)
        if fault.recovered_s is None
    ]
    return reasons + canary_failures(faults)


# --- the faults' schedule -------------------------------------------------------------------------


def fault_times(count: int, window_s: float) -> list[float]:
    """When each of `count` faults is due, spread evenly inside a load of `window_s`."""
    return [window_s * (number + 1) / (count + 1) for number in range(count)]


def parse_faults(text: str) -> tuple[str, ...]:
    faults = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [kind for kind in faults if kind not in FAULT_KINDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown faults {unknown}; known: {FAULT_KINDS}")
    return faults
