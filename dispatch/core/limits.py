"""Runtime limits: how many jobs may run at once, and how fast they may start.

A limit applies to one of three scopes, each with the same two knobs:

- `client`: a tenant (client id). Its `max_inflight` is the client's cap (it replaces
  `CoreConfig.default_cap`/`caps` for that client).
- `exec`: an exec pattern (`*` one token, a final `>` one or more). One shared budget over
  every exec the pattern matches; a job must fit every exec limit whose pattern matches.
- `key`: a concurrency key a job carries (`"account:42"`), or a key pattern ending in `*`
  (`account:*`, or `*` for every key). A pattern's limit applies to *each* key it matches
  separately; a key's limit is its exact one, else the longest pattern it starts with.

`max_inflight` counts running jobs; `rate` (starts per second, with `burst`) is a token
bucket whose level follows from the times of the starts (`assigned` and `reassigned`
events) alone, so the fold, a rebuild and a replay compute the same level: no clock and no
randomness. Everything here is state the scheduler keeps beside its queues; the limits in
force are events (`limit_set`, `limit_removed`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from dispatch.core import _validate as v
from dispatch.core.keys import MAX_KEY_LENGTH, check_key
from dispatch.core.subjects import compile_pattern

if TYPE_CHECKING:
    from dispatch.core.job import JobRecord

__all__ = [
    "MAX_KEY_LENGTH",
    "ExecGate",
    "Gate",
    "KeyGate",
    "KeyLimits",
    "Limit",
    "LimitScope",
    "RateBucket",
    "WakeHeap",
    "check_key",
    "check_target",
]

MAX_INFLIGHT = 1_000_000_000
MAX_RATE = 1_000_000.0
MAX_BURST = 1_000_000
MAX_LIMITS = 100_000
"""Most runtime limits in force at once."""
MAX_LIMIT_REASON = 1_000
TOKEN_SLACK = 1e-9
"""A bucket at 1 - TOKEN_SLACK admits a start: the level is a float sum, and a wake-up timed
for the instant it reaches 1 must find it there."""


class LimitScope(StrEnum):
    """What a limit holds: a client's jobs, the execs a pattern matches, or a key's jobs."""

    CLIENT = "client"
    EXEC = "exec"
    KEY = "key"


@dataclass(frozen=True, slots=True)
class Limit:
    """The knobs of one limit: at most `max_inflight` running, at most `rate` starts per
    second with bursts of `burst`. None: that knob does not limit."""

    max_inflight: int | None = None
    rate: float | None = None
    burst: int | None = None

    @classmethod
    def checked(
        cls, max_inflight: object = None, rate: object = None, burst: object = None
    ) -> Limit:
        """A valid limit (ValueError naming the field): at least one knob; a burst only
        with a rate, which defaults to max(1, ceil(rate))."""
        inflight = (
            None
            if max_inflight is None
            else v.as_int(max_inflight, "max_inflight", 1, MAX_INFLIGHT)
        )
        per_s: float | None = None
        if rate is not None:
            per_s = float(v.as_number(rate, "rate", positive=True))
            if per_s > MAX_RATE:
                raise ValueError(f"rate: expected a number <= {MAX_RATE:g}, got {per_s:g}")
        size: int | None = None
        if burst is not None:
            if per_s is None:
                raise ValueError("burst: a burst needs a rate")
            size = v.as_int(burst, "burst", 1, MAX_BURST)
        elif per_s is not None:
            size = max(1, min(MAX_BURST, math.ceil(per_s)))
        if inflight is None and per_s is None:
            raise ValueError("max_inflight: give max_inflight, rate or both")
        return cls(inflight, per_s, size)

    def to_dict(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        if self.max_inflight is not None:
            out["max_inflight"] = self.max_inflight
        if self.rate is not None:
            out["rate"] = self.rate
        if self.burst is not None:
            out["burst"] = self.burst
        return out


def check_target(scope: LimitScope, value: object, max_exec_length: int) -> str:
    """A limit's target as its scope wants it (ValueError naming the field): a client id,
    an exec pattern, or a key or key pattern (`*` only at the end)."""
    if scope is LimitScope.CLIENT:
        return v.as_id(value, "client_id")
    if scope is LimitScope.EXEC:
        name = v.as_str(value, "exec")
        if len(name) > max_exec_length:
            raise ValueError(f"exec: longer than {max_exec_length} characters")
        try:
            compile_pattern(name)
        except ValueError as error:
            raise ValueError(f"exec: {error}") from None
        return name
    target = v.as_str(value, "key")
    if target.endswith("*"):
        check_key(target[:-1] or "x", "key")  # the prefix, as a key ("*" alone: every key)
        return target
    return check_key(target, "key")


class RateBucket:
    """A token bucket: `burst` tokens at most, refilled at `rate` per second; each start
    takes one (the level may go below 0: a start folded from the log is a fact)."""

    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: int, tokens: float, at: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = tokens
        self.at = at

    def level(self, now: float) -> float:
        tokens = self.tokens + (now - self.at) * self.rate
        return tokens if tokens < self.burst else float(self.burst)

    def admits(self, now: float) -> bool:
        return self.level(now) >= 1.0 - TOKEN_SLACK

    def take(self, now: float) -> None:
        if now > self.at:
            self.tokens = self.level(now)
            self.at = now
        self.tokens -= 1.0

    def ready_at(self, now: float) -> float:
        """The first time at which the bucket admits a start (now if it does). Computed,
        then moved up a float step at a time until `admits` agrees: at unix times a step is
        ~2e-7 s, and a wake-up computed a step early would find the bucket just short of a
        token and ask for the same time again, forever."""
        level = self.level(now)
        if level >= 1.0 - TOKEN_SLACK:
            return now
        at = now + (1.0 - level) / self.rate
        for _ in range(1_000):
            if self.admits(at):
                return at
            at = math.nextafter(at, math.inf)
        return at + 1e-3  # unreachable with finite numbers; never a busy loop

    def retune(self, rate: float, burst: int, now: float) -> None:
        """New knobs from `now` on: the tokens held so far stay (at most the new burst); a
        full bucket stays full (so forgetting an idle key's full bucket, and making a new
        one, is the same thing)."""
        level = self.level(now)
        self.tokens = level if level < min(burst, self.burst) else float(burst)
        self.at = now
        self.rate = rate
        self.burst = burst


def new_bucket(limit: Limit, now: float, origin: float) -> RateBucket | None:
    """The bucket of a limit that starts limiting at `now`: full, or as if it had been
    empty at `origin` when that is later (a rebuilt leader does not know the starts before
    its snapshot, so it assumes the worst: a bucket emptied just then)."""
    if limit.rate is None or limit.burst is None:
        return None
    tokens = float(limit.burst)
    if origin > -math.inf:
        tokens = min(tokens, max(0.0, (now - origin) * limit.rate))
    return RateBucket(limit.rate, limit.burst, tokens, now)


class Gate:
    """One limit as the scheduler applies it: its knobs, how many of its jobs run, its
    bucket, and when it asked to be woken (a rate limit out of tokens)."""

    __slots__ = ("bucket", "inflight", "limit", "max_inflight", "wake_at")

    def __init__(self, limit: Limit | None, now: float, origin: float) -> None:
        self.limit = limit
        self.max_inflight = None if limit is None else limit.max_inflight
        self.bucket = None if limit is None else new_bucket(limit, now, origin)
        self.inflight = 0
        self.wake_at: float | None = None

    def set_limit(self, limit: Limit | None, now: float, origin: float) -> None:
        """New knobs; a running bucket keeps its tokens."""
        self.limit = limit
        self.max_inflight = None if limit is None else limit.max_inflight
        if limit is None or limit.rate is None or limit.burst is None:
            self.bucket = None
        elif self.bucket is None:
            self.bucket = new_bucket(limit, now, origin)
        else:
            self.bucket.retune(limit.rate, limit.burst, now)

    def admits(self, now: float, already_running: bool = False) -> bool:
        """Whether one more start fits now (`already_running`: a reassignment, whose job
        is counted in `inflight` already)."""
        cap = self.max_inflight
        if cap is not None and self.inflight - already_running >= cap:
            return False
        bucket = self.bucket
        return bucket is None or bucket.admits(now)

    def room(self, now: float) -> int:
        """How many starts fit now (at least 0)."""
        room = math.inf
        if self.max_inflight is not None:
            room = self.max_inflight - self.inflight
        if self.bucket is not None:
            room = min(room, math.floor(self.bucket.level(now) + TOKEN_SLACK))
        return 0 if room <= 0 else (1 << 30 if room == math.inf else int(room))

    def started(self, now: float) -> None:
        if self.bucket is not None:
            self.bucket.take(now)

    def idle(self, now: float) -> bool:
        """Nothing runs and its bucket is full: forgetting it changes nothing."""
        bucket = self.bucket
        return self.inflight == 0 and (bucket is None or bucket.level(now) >= bucket.burst)


class ExecGate(Gate):
    """An exec pattern's limit: shared by every exec queue it matches. Queues it stopped
    wait in `held` until it has room again."""

    __slots__ = ("held", "pattern", "target")

    def __init__(self, target: str, limit: Limit, now: float, origin: float) -> None:
        Gate.__init__(self, limit, now, origin)
        self.target = target
        self.pattern = compile_pattern(target)
        self.held: set[str] = set()
        """The exec names of the queues it took out of the rotation."""


class KeyGate(Gate):
    """One concurrency key: its running count, its bucket, and the queued jobs it holds
    (taken out of their lanes when met at a lane's front without room), grouped by exec
    and client, each group in serving order (priority, then seq)."""

    __slots__ = ("held", "held_jobs", "key")

    def __init__(self, key: str, limit: Limit | None, now: float, origin: float) -> None:
        Gate.__init__(self, limit, now, origin)
        self.key = key
        self.held: dict[tuple[str, str], list[tuple[int, int, str, JobRecord]]] = {}
        """(exec, client id) -> heap of (-priority, seq, id, job); entries of jobs no longer
        in `held_jobs` (cancelled or expired while held) are skipped when met."""
        self.held_jobs: dict[str, JobRecord] = {}
        """The jobs it holds, by id."""

    def hold(self, job: JobRecord) -> None:
        group = (job.exec, job.client_id)
        heap = self.held.get(group)
        if heap is None:
            heap = self.held[group] = []
        heapq.heappush(heap, (-job.priority, job.seq, job.id, job))
        self.held_jobs[job.id] = job

    def holds(self, job: JobRecord) -> bool:
        return self.held_jobs.get(job.id) is job

    def drop(self, job: JobRecord) -> None:
        """A held job ended without running (cancelled, expired): its heap entry is void."""
        del self.held_jobs[job.id]
        if not self.held_jobs:
            self.held.clear()

    def release(self, count: int, group: tuple[str, str] | None = None) -> list[JobRecord]:
        """Up to `count` held jobs of each group (or of one), best first: they go back to
        their lanes. Per exec and client, because a key's free slot must not wait for a job
        that something else holds (no worker serves its exec, its exec is paused or limited,
        its client is at its cap or out of tokens) while another group's job could start;
        and it costs one pop per group, not one per job held."""
        out: list[JobRecord] = []
        held_jobs = self.held_jobs
        groups = list(self.held) if group is None else [group]
        for each in groups:
            heap = self.held.get(each)
            if heap is None:
                continue
            taken = 0
            while heap and taken < count:
                job = heapq.heappop(heap)[3]
                if held_jobs.get(job.id) is job:
                    del held_jobs[job.id]
                    out.append(job)
                    taken += 1
            if not heap:
                del self.held[each]
        return out


class KeyLimits:
    """Which limit each key gets: exact keys first, then the longest matching pattern."""

    __slots__ = ("exact", "patterns")

    def __init__(self) -> None:
        self.exact: dict[str, Limit] = {}
        self.patterns: list[tuple[str, Limit]] = []
        """(prefix, limit), longest prefix first."""

    def set(self, target: str, limit: Limit | None) -> None:
        if target.endswith("*"):
            prefix = target[:-1]
            self.patterns = [entry for entry in self.patterns if entry[0] != prefix]
            if limit is not None:
                self.patterns.append((prefix, limit))
                self.patterns.sort(key=lambda entry: (-len(entry[0]), entry[0]))
        elif limit is None:
            self.exact.pop(target, None)
        else:
            self.exact[target] = limit

    def get(self, target: str) -> Limit | None:
        """The limit stored for a key or key pattern (the very object `for_key` gives)."""
        if target.endswith("*"):
            prefix = target[:-1]
            return next((limit for each, limit in self.patterns if each == prefix), None)
        return self.exact.get(target)

    def for_key(self, key: str) -> Limit | None:
        limit = self.exact.get(key)
        if limit is not None:
            return limit
        for prefix, pattern_limit in self.patterns:
            if key.startswith(prefix):
                return pattern_limit
        return None

    def __bool__(self) -> bool:
        return bool(self.exact or self.patterns)


class WakeHeap:
    """Gates and clients out of tokens, by the time their bucket reaches one token."""

    __slots__ = ("count", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, object]] = []
        self.count = 0

    def push(self, at: float, what: object) -> None:
        self.count += 1
        heapq.heappush(self.heap, (at, self.count, what))

    def pop_due(self, now: float) -> list[object]:
        heap = self.heap
        out: list[object] = []
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        return out
