"""The worker SDK: register handlers by exec pattern, run them with bounded concurrency.

```python
from dispatch.worker.sdk import PermanentError, Retry, WorkerApp

app = WorkerApp("images", concurrency=4)

@app.handler("image.*")            # jobs of exec image.resize, image.crop, ...
async def resize(job):
    if job.payload.get("url") is None:
        raise PermanentError("payload.url is missing")   # dead-lettered at once
    ...
    return {"ok": True}            # the job's result (JSON)

app.run()                          # until SIGTERM / Ctrl-C
```

What the SDK does for you: credit (one per free slot, granted again as each job ends: an ack
does not return credit, docs/spec.md §5), heartbeats while a handler runs (a third of the time
left before the deadline, so a slow job is not taken away; early for a progress report,
`job.progress(done, total, message)`, at most about one a second), settling each attempt
(the return value acks it; `Retry` or any other exception fails it as retryable;
`PermanentError` fails it for good), reconnecting with backoff when the node goes away, and
a graceful stop: on SIGTERM it takes no more jobs, lets running ones finish for `grace_s`,
and releases the rest (a retryable failure, so they are requeued at once rather than at
their deadline).

Stopping one attempt (its job was cancelled, it reached the job's `max_run_s`, or the leader
took it back): the handler's `job.cancelled` turns true (a sync handler checks it), an async
handler's task is cancelled, and a handler that ends so settles the attempt as
`fail(retryable=False, error="cancelled: <reason>")` (see `_Runtime.stop_attempt`).

Sync handlers run in threads of their own (daemon threads: one that ignores the grace period
cannot keep the process alive); async handlers run on the worker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from dispatch.client import (
    AsyncClient,
    Backoff,
    Conflict,
    DispatchError,
    NotFound,
    default_api_key,
)
from dispatch.worker.jobs import (
    Assignment,
    JobCancelled,
    Outcome,
    PermanentError,
    Retry,
    outcome_of_error,
    outcome_of_result,
    released,
    stopped,
)
from dispatch.worker.subjects import HandlerTable, exec_pattern_of
from dispatch.worker.tasks import Task, is_async, task_of
from dispatch.worker.transports import RestTransport, Transport, WebSocketTransport

log = logging.getLogger("dispatch.worker")

TransportName = Literal["ws", "rest"]
TRANSPORTS: tuple[TransportName, ...] = ("ws", "rest")
MIN_HEARTBEAT_PAUSE_S = 0.05
MIN_WINDOW_S = 0.3
"""Shortest deadline window assumed for a job (guards against clock skew with the leader)."""
PROGRESS_EVERY_S = 1.05
"""Least time between two progress reports sent for one attempt: a little over the leader's
`dispatch.core.progress.PROGRESS_EVERY_S` (1 s), which drops a report that comes sooner."""
SETTLE_AT_EXIT_S = 10.0
"""How long a stopping worker waits for its last settlements to be sent."""
NOT_OURS = frozenset({"stale_lease", "already_settled", "not_found"})
"""Refusals saying an attempt is no longer this worker's: its handler is told to stop."""
ENDED = "ended"
"""The stop reason of an attempt the leader no longer has on this worker."""


class WorkerError(Exception):
    """The worker cannot run as configured (no handlers, a subject no handler covers...)."""


Handler = Callable[[Assignment], Any]
"""`def handler(job: Assignment) -> result` or `async def handler(job) -> result`."""
R = TypeVar("R")
"""What a handler returns (its `Task[R]` keeps the type)."""


@dataclass(frozen=True)
class HandlerSpec:
    function: Handler
    is_async: bool
    heartbeat: bool


def heartbeat_pause(deadline: float, now: float) -> float:
    """The pause before the next heartbeat: a third of the time left before `deadline`, so
    two more can still be tried if one is lost."""
    return max(MIN_HEARTBEAT_PAUSE_S, (deadline - now) / 3)


def default_worker_id(name: str) -> str:
    """Unique per process (a worker id is the leader's handle on the jobs it holds)."""
    return f"{name}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class RunOptions(TypedDict, total=False):
    """What one run may override (see `WorkerApp.options`)."""

    urls: str | Sequence[str] | None
    api_key: str | None
    worker_id: str | None
    subjects: Sequence[str] | None
    concurrency: int | None
    transport: TransportName | None
    grace_s: float | None
    keepalive_s: float | None
    request_timeout_s: float
    retry_timeout_s: float
    backoff: Backoff | None


@dataclass(frozen=True)
class WorkerOptions:
    """How one `serve` runs (the app's defaults, overridden per run)."""

    urls: str | Sequence[str] | None
    api_key: str | None
    worker_id: str
    subjects: list[str]
    concurrency: int
    transport: TransportName
    grace_s: float
    keepalive_s: float
    request_timeout_s: float
    retry_timeout_s: float
    backoff: Backoff


class WorkerApp:
    """Handlers by exec pattern, run by `run()` (blocking) or `await serve()`.

    `concurrency`: jobs at once; `grace_s`: how long a stopping worker lets running jobs
    finish; `transport`: "ws" (WebSocket, the default) or "rest" (long-poll);
    `keepalive_s`: the longest silence towards the leader, which must stay below its
    `dispatcher.worker_expiry_s` (REST long-polls also wait this long)."""

    def __init__(
        self,
        name: str = "worker",
        *,
        concurrency: int = 1,
        grace_s: float = 30.0,
        transport: TransportName = "ws",
        keepalive_s: float = 5.0,
    ) -> None:
        self.name = name
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.transport = transport
        self.keepalive_s = keepalive_s
        self.handlers: HandlerTable[HandlerSpec] = HandlerTable()
        self._lock = threading.Lock()
        self._runtime: _Runtime | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_early: float | None = None

    def handler(
        self, pattern: str, *, heartbeat: bool = True
    ) -> Callable[[Callable[[Assignment], R]], Task[R]]:
        """Register the decorated function for jobs whose exec matches `pattern` (`image.*`
        is the subject `job.assign.image.*`). `heartbeat=False` lets the deadline stand, so
        the job is taken away when it runs longer than its timeout (its progress reports,
        if it makes any, are then its only heartbeats: see `_Pacer`). Returns the function's
        `Task` handle: still callable as the function, and `submit(payload)` sends a job of
        its exec (`dispatch.worker.tasks`)."""

        def register(function: Callable[[Assignment], R]) -> Task[R]:
            task = task_of(pattern, function)
            self.add_handler(pattern, task.function, heartbeat=heartbeat)
            return task

        return register

    def add_handler(self, pattern: str, function: Handler, *, heartbeat: bool = True) -> None:
        self.handlers.add(pattern, HandlerSpec(function, is_async(function), heartbeat))

    @property
    def subjects(self) -> list[str]:
        """The subject patterns this app registers when none are given."""
        return self.handlers.subjects

    def options(
        self,
        *,
        urls: str | Sequence[str] | None = None,
        api_key: str | None = None,
        worker_id: str | None = None,
        subjects: Sequence[str] | None = None,
        concurrency: int | None = None,
        transport: TransportName | None = None,
        grace_s: float | None = None,
        keepalive_s: float | None = None,
        request_timeout_s: float = 30.0,
        retry_timeout_s: float = 30.0,
        backoff: Backoff | None = None,
    ) -> WorkerOptions:
        """The checked options of one run: the app's defaults, overridden by arguments."""
        if not len(self.handlers):
            raise WorkerError(f"worker app {self.name!r} has no handlers")
        chosen = list(dict.fromkeys(subjects)) if subjects else self.subjects
        try:
            for subject in chosen:
                exec_pattern_of(subject)
            missing = self.handlers.uncovered(chosen)
        except ValueError as error:
            raise WorkerError(f"subjects: {error}") from None
        if missing:
            raise WorkerError(
                f"subjects {', '.join(missing)} are not covered by a handler "
                f"(handlers: {', '.join(self.handlers.patterns)})"
            )
        options = WorkerOptions(
            urls=urls,
            api_key=api_key,
            worker_id=worker_id or default_worker_id(self.name),
            subjects=chosen,
            concurrency=concurrency if concurrency is not None else self.concurrency,
            transport=transport or self.transport,
            grace_s=grace_s if grace_s is not None else self.grace_s,
            keepalive_s=keepalive_s if keepalive_s is not None else self.keepalive_s,
            request_timeout_s=request_timeout_s,
            retry_timeout_s=retry_timeout_s,
            backoff=backoff or Backoff(initial_s=0.2),
        )
        if options.concurrency < 1:
            raise WorkerError(f"concurrency must be at least 1, got {options.concurrency}")
        if options.transport not in TRANSPORTS:
            raise WorkerError(f"transport must be one of {TRANSPORTS}, got {options.transport!r}")
        if options.grace_s < 0 or options.keepalive_s <= 0:
            raise WorkerError("grace_s must be >= 0 and keepalive_s > 0")
        return options

    async def serve(self, **overrides: Unpack[RunOptions]) -> None:
        """Run until `stop()` (or a fatal error: bad key, bad subjects). Arguments as
        `options()`."""
        options = self.options(**overrides)
        # A worker needs the worker role, no more: without a key, the local stack's worker key.
        api_key = options.api_key if options.api_key is not None else default_api_key("worker")
        async with AsyncClient(
            options.urls, api_key, request_timeout_s=options.request_timeout_s,
            retry_timeout_s=options.retry_timeout_s, backoff=options.backoff,
        ) as client:  # fmt: skip
            runtime = _Runtime(self.handlers, options, client)
            with self._lock:
                if self._runtime is not None:
                    raise WorkerError(f"worker app {self.name!r} is already running")
                self._runtime, self._loop = runtime, asyncio.get_running_loop()
                early, self._stop_early = self._stop_early, None
            if early is not None:
                runtime.request_stop(early)
            try:
                await runtime.serve()
            finally:
                with self._lock:
                    self._runtime = self._loop = None

    def run(self, *, handle_signals: bool = True, **overrides: Unpack[RunOptions]) -> None:
        """Run until SIGTERM or SIGINT (graceful: see `stop`); a second signal releases the
        running jobs at once. Arguments as `options()`."""
        asyncio.run(self._run(handle_signals, overrides))

    async def _run(self, handle_signals: bool, overrides: RunOptions) -> None:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        installed = handle_signals and threading.current_thread() is threading.main_thread()
        if installed:
            for number in signals:
                loop.add_signal_handler(number, self._on_signal, number)
        try:
            await self.serve(**overrides)
        finally:
            if installed:
                for number in signals:
                    loop.remove_signal_handler(number)

    def _on_signal(self, number: int) -> None:
        runtime = self._runtime
        if runtime is not None and runtime.stopping:
            log.warning("second %s: releasing running jobs now", signal.Signals(number).name)
            self.stop(grace_s=0)
        else:
            log.info("%s: finishing running jobs, taking no more", signal.Signals(number).name)
            self.stop()

    def stop(self, *, grace_s: float | None = None) -> None:
        """Stop gracefully: take no more jobs, let running ones finish for `grace_s` (the
        run's default when None), release the others. Safe from any thread."""
        with self._lock:
            runtime, loop = self._runtime, self._loop
            if runtime is None or loop is None:
                self._stop_early = grace_s if grace_s is not None else self.grace_s
                return
        with contextlib.suppress(RuntimeError):  # the loop already ended: nothing to stop
            loop.call_soon_threadsafe(runtime.request_stop, grace_s)


class _RunningJob:
    def __init__(self, assignment: Assignment, spec: HandlerSpec) -> None:
        self.assignment = assignment
        self.spec = spec
        self.handler: asyncio.Future[Any] | None = None
        self.heartbeats: asyncio.Task[None] | None = None
        self.done = asyncio.Event()
        self.stop_reason: str | None = None
        """Set when the worker was told to stop this attempt (cancel, time limit, ended)."""

    def stop(self, reason: str) -> bool:
        """Tell the handler to stop: its `cancelled` flag is set, an async handler's task is
        cancelled, heartbeats end (they cannot keep it any more). A sync handler runs on
        until it notices (or returns); the slot is freed when it ends. False when it was
        told already."""
        if self.stop_reason is not None:
            return False
        self.stop_reason = reason
        self.assignment.request_cancel(reason)
        if self.heartbeats is not None and self.heartbeats is not _current_task():
            self.heartbeats.cancel()
        if self.spec.is_async and self.handler is not None:
            self.handler.cancel()
        return True

    def abort(self) -> None:
        """Give up on the handler (its thread, if any, runs on but is no longer awaited)."""
        if self.handler is not None:
            self.handler.cancel()


class _Pacer:
    """Which progress report of an attempt rides its next heartbeat, and when a report
    waiting to be sent makes a heartbeat due: at most one report each `PROGRESS_EVERY_S`,
    the first at once, and the last one sent once more with a later heartbeat (the leader
    drops a report that comes too soon after the last one it kept). Runs on the worker's
    loop; the handler reports from its thread (`Assignment.progress`) and wakes it."""

    def __init__(self, assignment: Assignment) -> None:
        self.reports = assignment._progress
        self.sent_at: float | None = None
        """When a report was last sent (monotonic)."""
        self.repeat = False
        self.wake = asyncio.Event()
        loop = asyncio.get_running_loop()

        def notify() -> None:  # from the handler's thread, or the loop's
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
                loop.call_soon_threadsafe(self.wake.set)

        self.reports.listen(notify)

    def ready_at(self) -> float:
        """When the next report may be sent (monotonic)."""
        return time.monotonic() if self.sent_at is None else self.sent_at + PROGRESS_EVERY_S

    async def wait_until(self, beat_at: float | None) -> bool:
        """Wait for the next heartbeat: at `beat_at` (monotonic; None: none due), or sooner
        when a waiting report may be sent. False when a new report cut the wait short."""
        self.wake.clear()
        due = beat_at
        if self.reports.waiting:
            due = self.ready_at() if due is None else min(due, self.ready_at())
        pause = None if due is None else due - time.monotonic()
        if pause is not None and pause <= 0:
            return True
        try:
            await asyncio.wait_for(self.wake.wait(), pause)
        except TimeoutError:
            return True
        return False

    def take(self) -> dict[str, Any] | None:
        """The report for the heartbeat sent now (None: none, or too soon for one)."""
        if self.sent_at is not None and time.monotonic() < self.sent_at + PROGRESS_EVERY_S:
            return None
        new = self.reports.waiting
        report = self.reports.take(again=self.repeat)
        if report is not None:
            self.sent_at, self.repeat = time.monotonic(), new
        return report

    def lost(self, report: dict[str, Any] | None) -> None:
        """The heartbeat that carried `report` failed: send it again with the next one."""
        if report is not None:
            self.repeat = True

    def close(self) -> None:
        self.reports.listen(None)


class _Runtime:
    """One run of a worker app: its slots, running jobs, transport and stop sequence."""

    def __init__(
        self, handlers: HandlerTable[HandlerSpec], options: WorkerOptions, client: AsyncClient
    ) -> None:
        self.handlers = handlers
        self.options = options
        self.worker_id = options.worker_id
        self.subjects = options.subjects
        self.keepalive_s = options.keepalive_s
        self._jobs: dict[tuple[str, int], _RunningJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._abort = asyncio.Event()
        self._stopping = False
        self._grace_s = options.grace_s
        kind = WebSocketTransport if options.transport == "ws" else RestTransport
        self.transport: Transport = kind(client, self, options.backoff)

    # --- what the transport asks ---------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        return 0 if self._stopping else max(0, self.options.concurrency - len(self._jobs))

    @property
    def stopping(self) -> bool:
        return self._stopping

    def accept(self, message: Mapping[str, Any]) -> None:
        try:
            assignment = Assignment.from_message(message, self.worker_id)
        except (KeyError, TypeError, ValueError) as error:
            log.error("worker %s: malformed assignment %r: %s", self.worker_id, message, error)
            return
        if self._stopping:
            self._spawn(self._settle(assignment, released(self.worker_id)))
            return
        route = self.handlers.route(assignment.exec)
        if route is None:
            # The subjects were checked against the handlers at start: a bug, or a changed
            # subscription. Retryable, so another worker may take it.
            missing = f"worker {self.worker_id} has no handler for exec {assignment.exec!r}"
            self._spawn(self._settle(assignment, Outcome("fail", error=missing)))
            return
        key = (assignment.id, assignment.attempt)
        if key in self._jobs:
            log.warning("worker %s: job %s attempt %d delivered twice; running it once",
                        self.worker_id, assignment.id, assignment.attempt)  # fmt: skip
            return
        if len(self._jobs) >= self.options.concurrency:
            log.warning("worker %s: more jobs than slots (%d); running %s anyway",
                        self.worker_id, self.options.concurrency, assignment.id)  # fmt: skip
        job = self._jobs[key] = _RunningJob(assignment, route.handler)
        self._spawn(self._execute(job))

    def held(self) -> list[Assignment]:
        return [job.assignment for job in self._jobs.values()]

    def refused(self, job_id: str, code: str, attempt: int | None = None) -> None:
        for (running_id, running_attempt), job in list(self._jobs.items()):
            if running_id != job_id or attempt not in (None, running_attempt):
                continue
            if code in NOT_OURS:
                # The leader no longer has it on this worker: stop working on it.
                self.stop_attempt(job_id, running_attempt, ENDED)
            elif job.heartbeats is not None:
                job.heartbeats.cancel()

    def stop_attempt(self, job_id: str, attempt: int | None, reason: str) -> None:
        """The leader says stop `attempt` of `job_id` (None: whichever this worker runs):
        the job was cancelled (`cancel_requested`), the attempt reached its `max_run_s`
        (`time_limit`) or is no longer this worker's (`ended`). Unknown attempts (ended
        here already) are ignored."""
        for (running_id, running_attempt), job in list(self._jobs.items()):
            if running_id != job_id or attempt not in (None, running_attempt):
                continue
            if job.stop(reason):
                log.info("worker %s: stopping job %s attempt %d (%s)",
                         self.worker_id, job_id, running_attempt, reason)  # fmt: skip

    def request_stop(self, grace_s: float | None = None) -> None:
        if grace_s is not None:
            self._grace_s = grace_s
            if grace_s <= 0:
                self._abort.set()
        self._stop.set()

    # --- running jobs ---------------------------------------------------------------------------

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_handler(self, job: _RunningJob) -> asyncio.Future[Any]:
        function = job.spec.function
        assignment = job.assignment
        if job.spec.is_async:

            async def call() -> Any:
                return await function(assignment)

            return asyncio.ensure_future(call())
        return _in_daemon_thread(function, assignment, f"job-{assignment.id}")

    async def _execute(self, job: _RunningJob) -> None:
        assignment = job.assignment
        key = (assignment.id, assignment.attempt)
        try:
            if job.stop_reason is not None:
                # Told to stop between its arrival and now: it never starts.
                outcome = stopped(job.stop_reason)
            else:
                outcome = await self._run_handler(job)
            await self._settle(assignment, outcome)
        finally:
            del self._jobs[key]
            job.done.set()
            # Right after freeing the slot, in the same step (see Transport.slot_freed).
            await self.transport.slot_freed()

    async def _run_handler(self, job: _RunningJob) -> Outcome:
        assignment = job.assignment
        # Always: a handler without regular heartbeats still sends its progress reports.
        job.heartbeats = asyncio.create_task(self._heartbeats(job))
        handler = job.handler = self._start_handler(job)
        try:
            await asyncio.wait({handler})
        finally:
            if job.heartbeats is not None:
                job.heartbeats.cancel()
                await asyncio.gather(job.heartbeats, return_exceptions=True)
        if job.stop_reason is not None and (handler.cancelled() or handler.exception()):
            # Told to stop, and it did (a sync handler that returns anyway acks: the leader
            # decides what a late result is worth).
            return stopped(job.stop_reason)
        if handler.cancelled():
            return released(self.worker_id)
        if (error := handler.exception()) is not None:
            if not isinstance(error, Retry | PermanentError | JobCancelled):
                log.warning("worker %s: job %s attempt %d raised", self.worker_id,
                            assignment.id, assignment.attempt, exc_info=error)  # fmt: skip
            return outcome_of_error(error)
        return outcome_of_result(handler.result())

    async def _settle(self, assignment: Assignment, outcome: Outcome) -> None:
        try:
            await self.transport.settle(assignment, outcome)
        except DispatchError as error:
            # The leader will requeue the job at its deadline (or when the worker is lost).
            log.error("worker %s: could not settle job %s: %s",
                      self.worker_id, assignment.id, error)  # fmt: skip

    async def _heartbeats(self, job: _RunningJob) -> None:
        """Heartbeats of a running attempt: after a third of the time left before its
        deadline (a handler registered with `heartbeat=True`), and early for a progress
        report waiting to be sent (`_Pacer`). A handler registered with `heartbeat=False`
        sends only the latter."""
        assignment = job.assignment
        regular = job.spec.heartbeat
        # The window is the attempt's timeout as seen here; after a heartbeat the leader
        # moves the deadline to (about) now + that window.
        window = max(assignment.deadline - time.time(), MIN_WINDOW_S)
        deadline = assignment.deadline
        pacer = _Pacer(assignment)
        beat_at = time.monotonic() + heartbeat_pause(deadline, time.time()) if regular else None
        try:
            while True:
                if not await pacer.wait_until(beat_at):
                    continue  # a report came: when is the next heartbeat now?
                report = pacer.take()
                if report is None and not regular:
                    continue  # only a report makes a heartbeat of such a handler
                sent_at = time.time()
                try:
                    extended = await self.transport.heartbeat(assignment, report)
                except (Conflict, NotFound) as refused:
                    log.warning("worker %s: job %s is no longer ours: %s",
                                self.worker_id, assignment.id, refused)  # fmt: skip
                    self.stop_attempt(assignment.id, assignment.attempt, ENDED)
                    return
                except DispatchError as error:
                    log.warning("worker %s: heartbeat of job %s failed: %s",
                                self.worker_id, assignment.id, error)  # fmt: skip
                    extended = None
                    pacer.lost(report)
                deadline = extended if extended is not None else sent_at + window
                if regular:
                    beat_at = time.monotonic() + heartbeat_pause(deadline, time.time())
        finally:
            pacer.close()

    # --- the run --------------------------------------------------------------------------------

    async def serve(self) -> None:
        log.info("worker %s: %s transport, concurrency %d, subjects %s", self.worker_id,
                 self.options.transport, self.options.concurrency, self.subjects)  # fmt: skip
        transport = asyncio.create_task(self.transport.run())
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({transport, stop}, return_when=asyncio.FIRST_COMPLETED)
        failure: BaseException | None = None
        if transport.done():
            failure = transport.exception() or WorkerError("the transport ended unexpectedly")
        self._stopping = True
        try:
            if failure is None:
                await self.transport.stop_taking()
                await self._finish_running()
            await self._abort_running()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=SETTLE_AT_EXIT_S)
            await self.transport.close(drain_s=5.0)
            # A long-poll still out may bring assignments: let it end, so they are released
            # now (accept() while stopping) rather than lost until the leader gives up on them.
            await asyncio.wait({transport}, timeout=self.keepalive_s + 5.0)
        finally:
            for task in (transport, stop, *self._tasks):
                task.cancel()
            await asyncio.gather(transport, stop, *self._tasks, return_exceptions=True)
        if failure is not None:
            raise failure
        log.info("worker %s: stopped", self.worker_id)

    async def _finish_running(self) -> None:
        """Wait for running jobs for the grace period (or until a second stop)."""
        running = [job.done.wait() for job in self._jobs.values()]
        if not running:
            return
        everything: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*running))
        abort: asyncio.Future[Any] = asyncio.ensure_future(self._abort.wait())
        try:
            await asyncio.wait(
                {everything, abort}, timeout=self._grace_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            everything.cancel()
            abort.cancel()
            await asyncio.gather(everything, abort, return_exceptions=True)

    async def _abort_running(self) -> None:
        if self._jobs:
            log.warning("worker %s: releasing %d unfinished job(s)",
                        self.worker_id, len(self._jobs))  # fmt: skip
        for job in list(self._jobs.values()):
            job.abort()


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


def _in_daemon_thread(
    function: Callable[[Assignment], Any], assignment: Assignment, name: str
) -> asyncio.Future[Any]:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def resolve(value: Any, error: BaseException | None) -> None:
        if future.done():  # aborted: nobody waits for this result any more
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value = function(assignment)
        except Exception as error:  # noqa: BLE001  (handed to the awaiting job, not lost)
            outcome: tuple[Any, BaseException | None] = (None, error)
        else:
            outcome = (value, None)
        # The loop is closed when the worker stopped before this handler ended: the job was
        # released then, so there is nobody left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(resolve, *outcome)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


__all__ = [
    "Assignment",
    "Handler",
    "JobCancelled",
    "Outcome",
    "PermanentError",
    "Retry",
    "RunOptions",
    "WorkerApp",
    "WorkerError",
    "WorkerOptions",
    "heartbeat_pause",
]
