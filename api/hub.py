"""What a commit made durable, handed to the requests waiting for it.

The leader loop calls `committed` on its own thread; everything that wakes a request happens
on the asyncio loop (`call_soon_threadsafe`), so request handlers never share state with the
dispatcher thread except through this hub's lock-guarded counters.

Terms: when a leadership term ends (`stopped`), everything of that term ends with it: the
outboxes and undelivered counts are emptied (the next term rebuilt its own view from the log),
long-polls wake up, and `term_ended()` fires, which closes every WebSocket session opened under
that term (`dispatch.api.routes.stream`). Worker sessions: one open socket at most serves a worker
id (`claim_worker`); only that session takes the worker's assignments and may lose the worker
when it closes.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from dispatch.api.metrics import Metrics
from dispatch.api.served_execs import ServedExecs
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import (
    Assigned,
    Cancelled,
    CancelRequested,
    DeadLettered,
    Event,
    JobEvent,
    JobHeartbeat,
    LeaderElected,
    Reassigned,
    Requeued,
    WorkerJoined,
    WorkerLost,
)
from dispatch.core.job import TERMINAL_STATUSES, DeadReason, JobRecord, JobStatus, RequeueReason
from dispatch.wire import CANCEL_REQUESTED, ENDED, TIME_LIMIT, assignment_of, job_view_of

_WORKERS_CHANGED = frozenset({WorkerJoined, WorkerLost, LeaderElected})
"""Events after which the execs served may differ (a term starts with the workers it rebuilt)."""
_STOPPING = frozenset({CancelRequested, Cancelled, Requeued, DeadLettered})
"""Events that may tell a worker to stop an attempt (`stop_order` decides)."""
MAX_STOPS_WAITING = 10_000
"""Most stop orders one worker's outbox holds (a REST worker that stopped polling must not
grow it without bound; its next poll's `held` names what it still runs anyway)."""


def current_assignment(core: Dispatcher, job_id: str) -> dict[str, Any] | None:
    """What a worker receives for a running job (REST poll and WebSocket `assign`): the
    wire `Assignment`, or None when the job is not running (any more: an event later in the
    same commit may have taken it back)."""
    job = core.job_view(job_id)
    if job is None or job.status is not JobStatus.RUNNING:
        return None
    return assignment_of(job)


def stop_order(event: Event) -> tuple[str, dict[str, Any]] | None:
    """(worker id, wire `StopAttempt`) when `event` means a worker must stop an attempt it
    runs: a cancel was requested, the attempt reached its time limit, or the job was
    cancelled while running (its grace passed). None for every other event."""
    reason: str
    if isinstance(event, CancelRequested):
        reason = CANCEL_REQUESTED
    elif isinstance(event, Requeued | DeadLettered):
        if (
            event.reason is not RequeueReason.TIME_LIMIT
            and event.reason is not DeadReason.TIME_LIMIT
        ):
            return None
        reason = TIME_LIMIT
    elif isinstance(event, Cancelled) and event.worker_id is not None:
        reason = ENDED
    else:
        return None
    worker_id = event.worker_id
    assert worker_id is not None
    return worker_id, {"id": event.job_id, "attempt": event.attempt, "reason": reason}


def stop_orders_for(core: Dispatcher, held: Sequence[tuple[str, int, str]]) -> list[dict[str, Any]]:
    """The wire `StopAttempt`s of the attempts a worker says it holds that it must stop: a
    cancelled job's (`cancel_requested`), and any the leader no longer has it run (`ended`,
    or `time_limit`). Harmless for an attempt the worker has already finished."""
    orders: list[dict[str, Any]] = []
    for job_id, attempt, lease in held:
        job = core.job_view(job_id)
        if (
            job is not None
            and job.status is JobStatus.RUNNING
            and job.attempts == attempt
            and job.lease == lease
        ):
            if job.cancel_requested_at is not None:
                orders.append({"id": job_id, "attempt": attempt, "reason": CANCEL_REQUESTED})
            continue
        if job is not None and job.status is JobStatus.SUCCEEDED and job.attempts == attempt:
            continue  # acked: nothing runs any more
        reason = ENDED
        if job is not None and job.dead_reason is DeadReason.TIME_LIMIT and job.attempts == attempt:
            reason = TIME_LIMIT
        orders.append({"id": job_id, "attempt": attempt, "reason": reason})
    return orders


def public_job(job: JobRecord | None) -> dict[str, Any]:
    """A job as clients see it (REST answers and WebSocket `result`): the wire `JobView`.
    Answers pass the job their command just changed, so None is a bug: it fails the request
    instead of answering a job that is not there."""
    if job is None:
        raise LookupError("no such job to show")
    return job_view_of(job)


class Outbox:
    """Assignments committed for one worker and not yet taken by it, and the attempts it
    must stop (`stops`, wire `StopAttempt`s), sent before any new assignment."""

    def __init__(self) -> None:
        self.items: deque[dict[str, Any]] = deque()
        self.stops: deque[dict[str, Any]] = deque()
        self.changed = asyncio.Event()

    def take_stops(self) -> list[dict[str, Any]]:
        stops = list(self.stops)
        self.stops.clear()
        if not self.items:
            self.changed.clear()
        return stops

    def take(self, limit: int | None = None) -> list[dict[str, Any]]:
        count = len(self.items) if limit is None else min(limit, len(self.items))
        taken = [self.items.popleft() for _ in range(count)]
        if not self.items:
            self.changed.clear()
        return taken


class WorkerSession:
    """One open WebSocket serving a worker id (see `Hub.claim_worker`)."""

    def __init__(self, worker_id: str, owner: str | None, *, batch: bool = False) -> None:
        self.worker_id = worker_id
        self.owner = owner
        self.batch = batch
        """The worker reads `assign_many` (its hello said so)."""
        self.replaced = asyncio.Event()
        """Set when a newer socket of the same worker took over: this one must close."""


class Hub:
    def __init__(self, loop: asyncio.AbstractEventLoop, metrics: Metrics) -> None:
        self._loop = loop
        self._metrics = metrics
        self._lock = threading.Lock()
        self._undelivered: defaultdict[str, int] = defaultdict(int)
        self.outboxes: dict[str, Outbox] = {}
        self._job_waiters: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)
        self._client_streams: defaultdict[str, set[asyncio.Queue[dict[str, Any]]]] = defaultdict(
            set
        )
        self._term_ended = asyncio.Event()
        self.terms_ended = 0
        self._worker_sessions: dict[str, WorkerSession] = {}
        self.served = ServedExecs()
        """The execs this node's term knows a worker for (the submit answer's warning)."""

    # --- loop thread ------------------------------------------------------------------------

    def undelivered(self, worker_id: str) -> int:
        """Assignments committed to `worker_id` that it has not taken yet."""
        with self._lock:
            return self._undelivered[worker_id]

    def committed(self, core: Dispatcher, events: Sequence[Event]) -> None:
        assignments: list[tuple[str, dict[str, Any]]] = []
        finished: dict[str, dict[str, Any]] = {}
        lost: list[str] = []
        stops: list[tuple[str, dict[str, Any]]] = []
        progress: dict[str, tuple[str, dict[str, Any]]] = {}
        workers_changed = False
        for event in events:
            if type(event) in _WORKERS_CHANGED:
                workers_changed = True
            if isinstance(event, Assigned | Reassigned):
                assignment = current_assignment(core, event.job_id)
                if assignment is not None and assignment["lease"] == event.lease:
                    assignments.append((event.worker_id, assignment))
            elif isinstance(event, WorkerLost):
                lost.append(event.worker_id)
            elif type(event) in _STOPPING:
                order = stop_order(event)
                if order is not None:
                    stops.append(order)
            elif type(event) is JobHeartbeat and event.progress is not None:
                job = core.job_view(event.job_id)
                if job is not None and job.progress is not None:
                    progress[event.job_id] = (job.client_id, job.progress)
            if isinstance(event, JobEvent):
                job = core.job_view(event.job_id)
                if job is not None and job.status in TERMINAL_STATUSES:
                    finished[job.id] = public_job(job)
        self._metrics.observe_committed(core, events)
        if workers_changed:
            self.served.refresh(core.subject_patterns())
        if progress:
            self._loop.call_soon_threadsafe(self._tell_progress, progress)
        if not (assignments or finished or lost or stops):
            return
        with self._lock:
            for worker_id in lost:
                self._undelivered.pop(worker_id, None)
            for worker_id, _ in assignments:
                self._undelivered[worker_id] += 1
        self._loop.call_soon_threadsafe(self._deliver, assignments, finished, lost, stops)

    def stopped(self, error: BaseException | None) -> None:
        # What was committed but not delivered belongs to the ended term: the next term
        # (here or elsewhere) sees those jobs as held and settles them with the worker.
        with self._lock:
            self._undelivered.clear()
        self.served.forget()
        self._loop.call_soon_threadsafe(self._end_term)

    def restart_outbox(self, worker_id: str) -> None:
        """Called in the answer of a worker's (re)join, right after its commit: what was
        committed to the worker before is void (the join requeued what the worker does not
        hold), and is dropped before this commit's own assignments arrive (both go through
        `call_soon_threadsafe`, in order)."""
        with self._lock:
            self._undelivered[worker_id] = 0
        self._loop.call_soon_threadsafe(self._clear_outbox, worker_id)

    # --- asyncio loop -----------------------------------------------------------------------

    def _deliver(
        self,
        assignments: list[tuple[str, dict[str, Any]]],
        finished: dict[str, dict[str, Any]],
        lost: list[str],
        stops: list[tuple[str, dict[str, Any]]],
    ) -> None:
        for worker_id, order in stops:
            # Only to a worker this node serves (an open socket, or a REST poller that
            # polled here): another node's worker learns it from its next poll or hello.
            outbox = self.outboxes.get(worker_id)
            if outbox is not None:
                if len(outbox.stops) < MAX_STOPS_WAITING:
                    outbox.stops.append(order)
                outbox.changed.set()
        for worker_id in lost:
            outbox = self.outboxes.get(worker_id)
            if outbox is not None:
                outbox.items.clear()
                outbox.stops.clear()
                outbox.changed.set()
        for worker_id, assignment in assignments:
            outbox = self.outbox(worker_id)
            outbox.items.append(assignment)
            outbox.changed.set()
        for job_id, job in finished.items():
            for waiter in self._job_waiters.pop(job_id, []):
                if not waiter.done():
                    waiter.set_result(None)
            for stream in self._client_streams.get(job["client_id"], ()):
                stream.put_nowait({"type": "result", **job})

    def _tell_progress(self, progress: dict[str, tuple[str, dict[str, Any]]]) -> None:
        """Each job's latest progress to its client's result streams."""
        for job_id, (client_id, report) in progress.items():
            for stream in self._client_streams.get(client_id, ()):
                stream.put_nowait({"type": "progress", "id": job_id, "progress": report})

    def _clear_outbox(self, worker_id: str) -> None:
        outbox = self.outboxes.get(worker_id)
        if outbox is not None:
            outbox.items.clear()

    def _end_term(self) -> None:
        # Waiters re-read on wake-up: a stopped leader makes them answer 503 or redirect.
        self.terms_ended += 1
        ended, self._term_ended = self._term_ended, asyncio.Event()
        ended.set()
        for outbox in self.outboxes.values():
            outbox.items.clear()
            outbox.stops.clear()
            outbox.changed.set()
        for waiters in self._job_waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._job_waiters.clear()

    def term_ended(self) -> asyncio.Event:
        """Set when the current term ends (take it when the session opens)."""
        return self._term_ended

    def claim_worker(self, session: WorkerSession) -> WorkerSession | None:
        """Make `session` the one serving its worker id; the one it replaced, if any."""
        previous = self._worker_sessions.get(session.worker_id)
        self._worker_sessions[session.worker_id] = session
        return previous

    def unclaim_worker(self, session: WorkerSession, previous: WorkerSession | None) -> None:
        """Undo `claim_worker` (the leader refused the join): `previous` serves again."""
        if self._worker_sessions.get(session.worker_id) is session:
            if previous is None:
                del self._worker_sessions[session.worker_id]
            else:
                self._worker_sessions[session.worker_id] = previous

    def release_worker(self, session: WorkerSession) -> bool:
        """The session closed: True if it still served its worker (then it may lose it)."""
        if self._worker_sessions.get(session.worker_id) is session:
            del self._worker_sessions[session.worker_id]
            return True
        return False

    def worker_session(self, worker_id: str) -> WorkerSession | None:
        """The open socket serving `worker_id`, if any."""
        return self._worker_sessions.get(worker_id)

    def outbox(self, worker_id: str) -> Outbox:
        outbox = self.outboxes.get(worker_id)
        if outbox is None:
            outbox = self.outboxes[worker_id] = Outbox()
        return outbox

    def take(
        self, worker_id: str, limit: int | None = None, *, session: WorkerSession | None = None
    ) -> list[dict[str, Any]]:
        """Take committed assignments; with `session`, only while it serves the worker (a
        replaced socket must not carry off what is meant for its successor)."""
        if session is not None and self._worker_sessions.get(worker_id) is not session:
            return []
        taken = self.outbox(worker_id).take(limit)
        if taken:
            with self._lock:
                self._undelivered[worker_id] = max(0, self._undelivered[worker_id] - len(taken))
        return taken

    def wait_for_job(self, job_id: str) -> asyncio.Future[None]:
        """A future set when `job_id` is next seen terminal (register before reading)."""
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._job_waiters[job_id].append(waiter)
        return waiter

    def forget_waiter(self, job_id: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._job_waiters.get(job_id)
        if waiters and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._job_waiters[job_id]

    def subscribe(self, client_id: str) -> asyncio.Queue[dict[str, Any]]:
        stream: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._client_streams[client_id].add(stream)
        return stream

    def unsubscribe(self, client_id: str, stream: asyncio.Queue[dict[str, Any]]) -> None:
        self._client_streams[client_id].discard(stream)
