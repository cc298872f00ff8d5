"""Ready-job queues of one exec name: priorities, then round-robin across clients, then FIFO.

    ExecQueue (one per exec name)
      └─ Level (one per priority present; served highest first)
           ├─ rotation: deque of Lanes, served round-robin (one job, then the back)
           └─ Lane (one per client with ready jobs at this level): jobs in `seq` order

So a client with 100k queued jobs gets one turn per round like a client with 10. A client at
its in-flight cap is *parked*: its lanes leave the rotations (lazily, when met at the front)
and come back when one of its jobs settles, so a capped client costs nothing per assignment.

Removal is lazy: a cancelled job stays in its lane as a stale entry (status no longer queued)
and is dropped when it reaches the front or when stale entries outnumber live ones.
Everything here is internal; the Dispatcher owns these objects.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from typing import TYPE_CHECKING, Protocol

from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.limits import TOKEN_SLACK
from dispatch.core.subjects import assign_subject
from dispatch.core.workers import WorkerState

if TYPE_CHECKING:
    from dispatch.core.limits import ExecGate, RateBucket

_QUEUED = JobStatus.QUEUED
_ONE_TOKEN = 1.0 - TOKEN_SLACK
_COMPACT_MIN_STALE = 64
_KEEP_LEVELS = 8
_KEEP_LANES = 1024
MAX_EXEC_QUEUES_PER_CLIENT = 1000
"""Exec queues one client may create (by submitting the first job of an exec name nobody
used). Queues are never dropped while the leader runs, and every join, scrape of /metrics
and `GET /v1/queues` walks them all: 10,000 exec names made a job's round trip 10x slower.
Submitting to an existing queue (one another client created, too) is always allowed. Counted
from what the leader folded since its snapshot; queues restored from a snapshot count for no
one."""


class Gatekeeper(Protocol):
    """What `ExecQueue.next_job` asks of the limits (`DispatcherState` answers)."""

    def client_blocked(self, client: ClientState, now: float) -> bool:
        """The client's rate limit has no token now (it asks to be woken when it has)."""
        ...

    def key_admits(self, queue: ExecQueue, lane: Lane, job: JobRecord, now: float) -> bool:
        """The job's key has room now; if not, the job is taken out of its lane and held
        by its key until it has."""
        ...


class ClientState:
    """A client's in-flight count against its cap, the lanes parked while it is full (or
    paused, or out of rate tokens), and how many exec queues it created."""

    __slots__ = (
        "bucket",
        "cap",
        "client_id",
        "exec_queues",
        "inflight",
        "parked",
        "paused",
        "room",
        "wake_at",
    )

    def __init__(self, client_id: str, cap: int) -> None:
        self.client_id = client_id
        self.cap = cap
        self.room = cap
        """How many jobs it may have running for a new one to start: its cap, or 0 while it
        is paused (one number, so the assignment loop checks nothing more than before)."""
        self.paused = False
        self.inflight = 0
        self.parked: list[Lane] = []
        self.exec_queues = 0
        """Exec queues its submissions created (see MAX_EXEC_QUEUES_PER_CLIENT)."""
        self.bucket: RateBucket | None = None
        """Its rate limit's token bucket (None: no rate limit)."""
        self.wake_at: float | None = None
        """When it asked to be woken for its next token (None: it did not)."""

    def pause(self, paused: bool) -> None:
        self.paused = paused
        self.room = 0 if paused else self.cap

    def set_cap(self, cap: int) -> None:
        self.cap = cap
        self.room = 0 if self.paused else cap

    @property
    def full(self) -> bool:
        return self.inflight >= self.room


class Lane:
    """One client's ready jobs at one priority of one exec queue, in `seq` order.

    `jobs` is a deque kept sorted by seq; a job that arrives out of order (a delayed job
    becoming ready behind later submissions) goes to the small `late` heap instead, and the
    head is the smaller of the two fronts. Appends (submissions) and appendlefts (requeues,
    which get ever smaller negative seqs) keep the deque sorted in O(1).
    """

    __slots__ = (
        "client",
        "dead",
        "in_rotation",
        "jobs",
        "late",
        "level",
        "live",
        "parked",
        "stale",
    )

    def __init__(self, client: ClientState, level: Level) -> None:
        self.client = client
        self.level = level
        self.jobs: deque[JobRecord] = deque()
        self.late: list[tuple[int, JobRecord]] = []
        self.live = 0
        self.stale = 0
        self.in_rotation = False
        self.parked = False
        self.dead = False

    def push(self, job: JobRecord) -> None:
        jobs = self.jobs
        seq = job.seq
        if not jobs or seq > jobs[-1].seq:
            jobs.append(job)
        elif seq < jobs[0].seq:
            jobs.appendleft(job)
        else:
            heapq.heappush(self.late, (seq, job))
        self.live += 1

    def head(self) -> JobRecord | None:
        """The next live job (dropping stale entries on the way), or None."""
        jobs = self.jobs
        late = self.late
        while True:
            if late and (not jobs or late[0][0] < jobs[0].seq):
                job = late[0][1]
                if job.status is _QUEUED:
                    return job
                heapq.heappop(late)
            elif jobs:
                job = jobs[0]
                if job.status is _QUEUED:
                    return job
                jobs.popleft()
            else:
                return None
            self.stale -= 1

    def take(self, job: JobRecord) -> None:
        """Remove `job`, normally the head (the job just assigned, whose status may already
        say running: so this matches by identity, not by status)."""
        jobs = self.jobs
        late = self.late
        while True:
            if late and (not jobs or late[0][0] < jobs[0].seq):
                front = late[0][1]
                if front is job:
                    heapq.heappop(late)
                    break
                if front.status is _QUEUED:
                    self._take_slowly(job)
                    break
                heapq.heappop(late)
            elif jobs:
                front = jobs[0]
                if front is job:
                    jobs.popleft()
                    break
                if front.status is _QUEUED:
                    self._take_slowly(job)
                    break
                jobs.popleft()
            else:
                raise KeyError(job.id)
            self.stale -= 1
        self.live -= 1

    def _take_slowly(self, job: JobRecord) -> None:
        # Only reached when a replayed log assigns jobs in another order than this state
        # would (e.g. a snapshot that disagrees with it): correct, just O(n).
        for index, entry in enumerate(self.jobs):
            if entry is job:
                del self.jobs[index]
                return
        for index, (_, entry) in enumerate(self.late):
            if entry is job:
                self.late.pop(index)
                heapq.heapify(self.late)
                return
        raise KeyError(job.id)

    def forget(self) -> None:
        """A job of this lane was cancelled: its entry became stale."""
        self.live -= 1
        self.stale += 1
        if self.stale > _COMPACT_MIN_STALE and self.stale > self.live:
            self.jobs = deque(job for job in self.jobs if job.status is _QUEUED)
            self.late = [entry for entry in self.late if entry[1].status is _QUEUED]
            heapq.heapify(self.late)
            self.stale = 0

    def ordered(self) -> list[JobRecord]:
        """Live jobs in serving order (for checks and views; O(n log n))."""
        live = [job for job in self.jobs if job.status is _QUEUED]
        live.extend(job for _, job in self.late if job.status is _QUEUED)
        live.sort(key=lambda job: job.seq)
        return live


class Level:
    """The lanes of one priority within one exec queue."""

    __slots__ = ("lanes", "live", "priority", "queue", "rotation")

    def __init__(self, priority: int, queue: ExecQueue) -> None:
        self.priority = priority
        self.queue = queue
        self.lanes: dict[str, Lane] = {}
        self.rotation: deque[Lane] = deque()
        self.live = 0


class ExecQueue:
    """All queued jobs of one exec name, plus counters and a cache of matching workers.

    Empty lanes and levels are kept for reuse (a queue that is drained as fast as it fills
    would otherwise create and drop them for every job), up to a bound: beyond _KEEP_LEVELS
    priorities or _KEEP_LANES clients per level, empty ones are dropped.
    """

    __slots__ = (
        "delayed",
        "exec",
        "gates",
        "in_rotation",
        "levels",
        "limited",
        "paused",
        "priorities",
        "ready",
        "running",
        "subject",
        "tokens",
        "workers",
    )

    def __init__(self, exec_name: str) -> None:
        self.exec = exec_name
        self.subject: tuple[str, ...] = tuple(assign_subject(exec_name).split("."))
        self.tokens: tuple[str, ...] = tuple(exec_name.split("."))
        """The exec name's tokens (what an exec pause's pattern is matched against)."""
        self.levels: dict[int, Level] = {}
        self.priorities: list[int] = []
        """Priorities that have a level, highest first (stored negated for insort)."""
        self.ready = 0
        self.delayed = 0
        self.running = 0
        self.in_rotation = False
        self.paused = False
        """A pause of an exec pattern matching it holds its ready jobs (running ones go on)."""
        self.gates: tuple[ExecGate, ...] = ()
        """The exec limits whose patterns match it (a job starts only if all have room)."""
        self.limited = 0
        """Its queued jobs held by their concurrency key (out of their lanes)."""
        self.workers: list[WorkerState] | None = None
        """Matching workers, computed on demand; None after any worker joins or leaves."""

    def push(self, job: JobRecord, client: ClientState) -> bool:
        """Queue a ready job. True when this may make the queue servable again: its lane had
        no live job or was out of its rotation (a queue leaves the exec rotation when it has
        nothing to serve, and only such a change can bring it back)."""
        level = self.levels.get(job.priority)
        if level is None:
            level = self.levels[job.priority] = Level(job.priority, self)
            insort(self.priorities, -job.priority)
        lane = level.lanes.get(client.client_id)
        if lane is None:
            lane = level.lanes[client.client_id] = Lane(client, level)
        was_empty = not lane.live
        lane.push(job)
        level.live += 1
        self.ready += 1
        if lane.parked:
            return False
        if not lane.in_rotation:
            level.rotation.append(lane)
            lane.in_rotation = True
            return True
        return was_empty

    def lane_of(self, job: JobRecord) -> Lane:
        level = self.levels.get(job.priority)
        lane = None if level is None else level.lanes.get(job.client_id)
        if lane is None:
            raise KeyError(f"job {job.id!r} is not in a lane of {self.exec!r}")
        return lane

    def take(self, job: JobRecord) -> None:
        """Remove a ready job that is being assigned, and move its lane to the back of the
        rotation (round-robin across clients)."""
        level = self.levels.get(job.priority)
        lane = None if level is None else level.lanes.get(job.client_id)
        if lane is None:
            lane = self.lane_of(job)  # raises KeyError
        lane.take(job)
        self._left(lane)
        rotation = lane.level.rotation
        if lane.in_rotation and rotation and rotation[0] is lane:
            if lane.live:
                rotation.rotate(-1)
            else:
                rotation.popleft()
                lane.in_rotation = False

    def forget(self, job: JobRecord) -> None:
        """A ready job was cancelled."""
        lane = self.lane_of(job)
        lane.forget()
        self._left(lane)

    def _left(self, lane: Lane) -> None:
        level = lane.level
        level.live -= 1
        self.ready -= 1
        if lane.live == 0 and len(level.lanes) > _KEEP_LANES:
            lane.dead = True
            del level.lanes[lane.client.client_id]
        if level.live == 0 and len(self.priorities) > _KEEP_LEVELS:
            for other in level.lanes.values():
                other.dead = True
            del self.levels[level.priority]
            self.priorities.remove(-level.priority)

    def hold(self, lane: Lane, job: JobRecord) -> None:
        """Take the lane's head out: its concurrency key holds it. The lane and its level
        stay even if empty (`next_job` is walking them)."""
        lane.take(job)
        lane.level.live -= 1
        self.ready -= 1
        self.limited += 1

    def next_job(self, now: float = 0.0, gatekeeper: Gatekeeper | None = None) -> JobRecord | None:
        """The job to serve next: highest priority, then the lane at the front of that level's
        rotation whose client is under its cap (and rate). Parks full clients' lanes on the
        way; with a `gatekeeper`, a head whose key has no room is held by the key and the
        lane's next job is looked at."""
        levels = self.levels
        for negated in self.priorities:
            level = levels[-negated]
            if not level.live:
                continue
            rotation = level.rotation
            while rotation:
                lane = rotation[0]
                if not lane.live or lane.dead:
                    rotation.popleft()
                    lane.in_rotation = False
                    continue
                client = lane.client
                bucket = client.bucket
                if client.inflight >= client.room or (
                    bucket is not None
                    # The bucket's level, inline (uncapped: a burst is at least 1 token):
                    # the common case, a token there, costs no call.
                    and bucket.tokens + (now - bucket.at) * bucket.rate < _ONE_TOKEN
                    and gatekeeper is not None
                    and gatekeeper.client_blocked(client, now)
                ):
                    rotation.popleft()
                    lane.in_rotation = False
                    lane.parked = True
                    client.parked.append(lane)
                    continue
                job = lane.head()
                if job is not None:
                    if (
                        job.key is None
                        or gatekeeper is None
                        or gatekeeper.key_admits(self, lane, job, now)
                    ):
                        return job
                    continue
                # Unreachable while `live` is exact; kept so a bug cannot loop forever.
                rotation.popleft()
                lane.in_rotation = False
        return None

    def lanes(self) -> list[Lane]:
        """Lanes holding live jobs."""
        return [
            lane for level in self.levels.values() for lane in level.lanes.values() if lane.live
        ]


def unpark(client: ClientState) -> list[Lane]:
    """The client went under its cap (or was resumed): put its parked lanes back at the end
    of their rotations. Returns the lanes that re-entered a rotation (their exec queues need
    serving)."""
    back: list[Lane] = []
    for lane in client.parked:
        lane.parked = False
        if lane.dead or lane.in_rotation or not lane.live:
            continue
        lane.level.rotation.append(lane)
        lane.in_rotation = True
        back.append(lane)
    client.parked.clear()
    return back
