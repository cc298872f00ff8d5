"""The leader's dispatcher loop: the one thread that owns the pure core.

Every request (HTTP, WebSocket) becomes a `Command` in the mailbox. Each loop iteration takes
the waiting commands and the newly consumed submissions, lets the core decide (the core applies
its own events in memory at once), runs a tick (timeouts, delayed jobs, assignment), and then
commits everything decided in **one** Kafka transaction. Only after that commit are replies
answered, assignments handed to workers and results to waiting clients: nothing is visible
outside the leader before it is durable (docs/spec.md §10, "strict assign after commit").

A failed commit means the in-memory state is ahead of the log: the loop stops, every waiting
request fails with `LeaderUnavailable`, and the node builds a fresh leader from the log.

A term exists only while its node holds the group's lease (`dispatch.api.election`): the term is
given the lease's epoch (stamped on every event it writes) and a `serving_until` clock it checks
before each commit, so a leader whose lease could have expired somewhere decides nothing more.
The rebuild starts from the newest Delta snapshot of `jobs` (see `dispatch.delta.snapshot`) and
replays only the log after its offsets; without one, it replays the whole log. When retention
removed records the rebuild needs, the term refuses to lead (`LogGap`): a partial state is
never served.

A request that goes away (its future cancelled) never reaches the core; nothing a request
does can raise on the loop thread except a failure of the term itself. The loop records when
it last completed an iteration and when the broker last answered it (`not_working`): its node
reports not ready past `stall_bound_s`, and gives up the lease when the loop itself stalls.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

from dispatch.api.finished_ids import FinishedIds
from dispatch.api.kafka_log import KAFKA_CALL_DEADLINE_S, SnapshotBehindLog
from dispatch.api.leader_io import (
    DeltaJobArchive,
    JobArchive,
    KafkaLeaderIO,
    LeaderIO,
    LogReader,
    SubmitSource,
    TransactionalLog,
)
from dispatch.api.metrics import Metrics
from dispatch.core.commands import SubmitRequest
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import InvalidTransition, Rejected
from dispatch.core.events import Cancelled, Completed, Event, Expired
from dispatch.event_records import encode_batches
from dispatch.settings import Settings
from dispatch.submit_records import Rejection, SubmissionError, parse_submit_record

log = logging.getLogger(__name__)

IDLE_WAIT_MS = 100
"""The longest an idle loop waits for a submission, a command or its next timer (a deadline,
a delayed job, a worker expiry: `Dispatcher.next_timer_at`), whichever comes first. Only the
loop's once-a-second chores (the broker probe, the group offsets) wait for it to end."""

WORKER_RECONNECT_S = 10.0
"""How long a worker may take to find a new leader and resend what it holds: the SDK's longest
reconnection backoff (2 s) several times over, for a worker that also lost its node. No
running job's deadline falls sooner after a term starts (`Dispatcher.resume`)."""

PRUNE_EVERY_S = 60.0
"""How often, at most, finished jobs past the finished window or beyond its size are forgotten
(a fifth of `dispatcher.finished_window_s` when that is shorter). Not more often: each
`pruned` event costs the fold a step of Spark jobs (moving the rows to `jobs_archive`); so
`finished_max` is overshot by at most a minute of finished jobs."""

_FINISHING = (Completed, Cancelled, Expired)
"""Events that end a job for good (a dead job stays held until it is redriven)."""

BROKER_PROBE_EVERY_S = 1.0
"""How often a loop the broker has not answered for that long (no commit, no fetched record)
asks it something (a bounded ListOffsets), so that `not_working` tells when the broker is gone
even while there is nothing to do."""

GROUP_OFFSETS_EVERY_S = 1.0
"""How often the submit position also goes to the consumer group's offsets (for monitoring
tools; the position of record rides in the events log, see `dispatch.api.kafka_log`)."""


REBUILD_MODULES = ("dispatch.delta.snapshot", "pyarrow.dataset")
"""What a rebuild imports on first use (delta-rs imports `pyarrow.dataset`, which brings
pandas: a noticeable part of a first term's rebuild, BENCHMARKS.md, *Rebuild with 1,000,000
jobs of history and 10,000 active*)."""


def preload_rebuild_modules() -> None:
    """Import what a rebuild needs, so a standby does it while it waits, not in its first
    term, during the failover."""
    for name in REBUILD_MODULES:
        importlib.import_module(name)


@contextlib.contextmanager
def collector_paused(*, freeze: bool = True) -> Iterator[None]:
    """No garbage collection during a rebuild, and what it built frozen afterwards.

    A rebuild allocates a million records, their payload and result dicts, and indexes, all
    of which stay alive: the collector, triggered every 10k allocations in a node
    (`dispatch.api.server.GC_THRESHOLDS`), would scan them again and again for nothing (a sizeable
    share of a 1M-job rebuild). `gc.freeze()` then moves
    everything alive to the permanent generation, so the serving term's full collections do
    not scan the million long-lived objects either (each such collection was a pause every
    waiting request sees; figures: BENCHMARKS.md, *Rebuild with 1,000,000 jobs of history and
    10,000 active*). Frozen objects are still freed by reference counting (a
    pruned job is); `Leader.stop` unfreezes them so that the term's state, which holds
    reference cycles, can be collected once the term ends. Nothing is frozen if the rebuild
    fails, nor with `freeze=False` (the collector is only paused)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
    if freeze:
        gc.freeze()


class LeaderUnavailable(Exception):
    """This leader stopped (fenced, failed commit, shutting down), or this node is not the
    leader; retry on the new one. `leader` names the leader's base URL when it is known (a
    follower then answers 307 to it)."""

    def __init__(self, detail: str, *, leader: str | None = None) -> None:
        super().__init__(detail)
        self.leader = leader


class LeaseExpired(Exception):
    """The term's lease may have expired somewhere: it must not commit anything more."""


def stall_bound_s(settings: Settings) -> float:
    """How long a term's loop may go without completing an iteration (or without a broker
    answer) before its node reports not ready; a loop stalled that long also gives up the
    lease (`dispatch.api.node`). Above every Kafka call's own deadline, so a call that times out
    fails the term first, and at least two lease periods, so a garbage collection or one slow
    commit is no stall."""
    return max(KAFKA_CALL_DEADLINE_S + 1.0, 2 * settings.lease.ttl_s)


def _claim(future: Future[Any]) -> bool:
    """Take a command's future for the loop: False when its request went away (cancelled)
    or it is settled already. A claimed future can no longer be cancelled (`asyncio`'s
    `wrap_future` cancels it when the awaiting request is cancelled), so settling it later
    cannot raise `InvalidStateError` on the loop thread."""
    try:
        return future.set_running_or_notify_cancel()
    except RuntimeError:  # already running or settled: someone else answered it
        return False


def _settle(future: Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    """Resolve a command's future unless it is already settled; never raises."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except InvalidStateError:
        log.debug("a command's future was settled elsewhere", exc_info=True)


ACCEPT_LOG_GAP = "dispatcher.accept_log_gap"
"""The setting by which an operator lets a leader serve although the log lost records after
the newest snapshot (they are then lost for good)."""


def accepts_log_gap(settings: Settings) -> bool:
    """Whether the operator accepted serving over a gap in the log (`ACCEPT_LOG_GAP`)."""
    return settings.dispatcher.accept_log_gap


class LogGap(LeaderUnavailable):
    """This node refuses to lead: the log's retention removed records after the newest
    snapshot, so any state rebuilt now would be partial. Names the gap."""

    def __init__(self, gap: SnapshotBehindLog) -> None:
        super().__init__(
            f"refusing to lead: {gap}; no copy of these records exists (the snapshot is the "
            f"streaming fold's position), so the state would be partial. Restore the log, or "
            f"set {ACCEPT_LOG_GAP} = true (DISPATCH_DISPATCHER__ACCEPT_LOG_GAP=true) to accept "
            f"losing them"
        )
        self.gap = gap


EpochFor = Callable[[int], int]
"""Given the highest epoch in the log, the epoch this term leads with (the lease's, advanced
past the log's when needed)."""


Decide = Callable[[Dispatcher, float], list[Event]]
Answer = Callable[[Dispatcher, list[Event]], Any]


@dataclass
class Command:
    """`decide` runs on the loop thread and may raise Rejected (nothing applied); `answer`
    runs after the commit, on committed state, and its value resolves `future`."""

    decide: Decide
    answer: Answer | None = None
    future: Future[Any] = field(default_factory=Future)


class CommitListener(Protocol):
    """Told, on the loop thread, what each commit made durable (deliveries, notifications)."""

    def committed(self, core: Dispatcher, events: Sequence[Event]) -> None: ...

    def stopped(self, error: BaseException | None) -> None: ...


class Leader:
    """One leadership term: fence, rebuild, then run the loop until stopped or failed."""

    def __init__(
        self,
        settings: Settings,
        node_id: str,
        listener: CommitListener,
        metrics: Metrics,
        *,
        epoch_for: EpochFor,
        serving_until: Callable[[], float],
        io: LeaderIO | None = None,
        archive: JobArchive | None = None,
    ) -> None:
        self.settings = settings
        self.io: LeaderIO = io if io is not None else KafkaLeaderIO(settings)
        self.archive: JobArchive = archive if archive is not None else DeltaJobArchive(settings)
        dispatcher = settings.dispatcher
        self.finished_ids = FinishedIds(dispatcher.dedup_window_s, dispatcher.dedup_filter_mb << 20)
        """The ids that finished within the dedup window, this term's and (once loaded from
        Delta) the ones before (`accept` looks beyond memory through it)."""
        self.epoch_for = epoch_for
        self.serving_until = serving_until
        self.metrics = metrics
        self.node_id = node_id
        self.group = settings.dispatcher.group
        self.listener = listener
        self.core = Dispatcher(settings.dispatcher.core_config())
        self._mailbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._taken: list[Command] = []
        """The commands of the iteration under way (answered by `stop` if the loop is stuck)."""
        self._stopping = threading.Event()
        self._commit_window_s = settings.api.commit_window_ms / 1000
        self._last_commit = 0.0
        """When the last transaction committed (monotonic), for `commit_window_ms`."""
        self._thread: threading.Thread | None = None
        self._log: TransactionalLog | None = None
        self._reader: SubmitSource | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.rebuild_s: float | None = None
        self.rebuilt_from = ""
        """How the rebuild started: "snapshot v<version>" or "full log" (and why)."""
        self._next_prune = 0.0
        self.replayed_batches = 0
        self.skipped_events = 0
        """Logged events the rebuild could not apply (see `_replay`)."""
        self.submit_position: dict[int, int] | None = None
        """Where the log says reading `dispatch.submit` goes on (None: the log never said)."""
        self._group_offsets: dict[int, int] = {}
        self._next_group_offsets = 0.0
        self.stall_bound_s = stall_bound_s(settings)
        self.last_iteration = time.monotonic()
        """When the loop last completed an iteration (monotonic)."""
        self.broker_answered = time.monotonic()
        """When the broker last answered the loop (a commit or a probe; monotonic)."""
        self._next_probe = 0.0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Fence the previous leader, rebuild, open for traffic (blocking)."""
        started = time.monotonic()
        client_id = f"dispatch-{self.node_id}"
        # Opening the log fences the previous leader and aborts its open transaction, so
        # what the replay reads next is everything it ever committed.
        self._log = self.io.open_log(self.group, client_id)
        with collector_paused():
            self._rebuild(client_id)
        self._reader = self.io.open_submit_source(self.group, client_id, self.submit_position)
        now = time.time()
        # How long no leader served: since the log's last decision. A leader with connected
        # workers writes a decision at least every `worker_expiry_s / 3` (their heartbeats),
        # and without workers no job runs, so this is not much more than the outage, which
        # may be far longer than a lease's life (a broker restart: ~20 s with the same
        # holder). Bounded by four worker expiries (a minute by default), for a log whose
        # last decision is old for another reason.
        unserved_s = min(
            max(0.0, now - self.core.clock), self.settings.dispatcher.worker_expiry_s * 4
        )
        epoch = self.epoch_for(self.core.fence.epoch)
        events = self.core.begin_epoch(epoch, now, holder=self.node_id)
        events += self.core.resume(now, outage_s=unserved_s, reconnect_s=WORKER_RECONNECT_S)
        self._commit(events, [], moved=False, now=now)
        self.listener.committed(self.core, events)
        self.rebuild_s = time.monotonic() - started
        log.info(
            "leader %s: epoch %d, rebuilt from %s + %d batches of the log in %.2fs",
            self.node_id, self.core.epoch, self.rebuilt_from, self.replayed_batches,
            self.rebuild_s,
        )  # fmt: skip
        self.last_iteration = self.broker_answered = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="dispatch-leader", daemon=True)
        self._thread.start()
        self.ready.set()
        # After opening: the failover does not wait for the ids of a day of finished jobs
        # (until they are in, every id not in memory is looked up in Delta instead).
        since = now - self.settings.dispatcher.dedup_window_s
        threading.Thread(
            target=self.finished_ids.rebuild,
            args=(lambda: self.archive.finished_since(self.group, since),),
            name="dispatch-finished-ids",
            daemon=True,
        ).start()

    def _rebuild(self, client_id: str) -> None:
        """Load the newest Delta snapshot and replay the log after it; or the whole log."""
        settings = self.settings
        config = settings.dispatcher.core_config()
        start: dict[int, int] | None = None
        try:
            snapshot = self.io.latest_snapshot(self.group)
        except Exception as error:  # noqa: BLE001  (a broken snapshot must not stop a failover)
            log.warning("leader %s: no usable snapshot (%r): full replay", self.node_id, error)
            snapshot = None
        if snapshot is not None and snapshot.events_topic != settings.kafka.events_topic:
            log.warning(
                "leader %s: the snapshot covers topic %r, not %r: full replay",
                self.node_id, snapshot.events_topic, settings.kafka.events_topic,
            )  # fmt: skip
            snapshot = None
        if snapshot is not None:
            # The snapshot's records were just read for this term and are used nowhere else:
            # the core takes them as they are (copying a million records would lengthen the
            # failover: BENCHMARKS.md, *Rebuild with 1,000,000 jobs of history*).
            self.core = Dispatcher.restore(
                snapshot.jobs,
                config=config,
                epoch=snapshot.fence_epoch,
                owned=True,
                pauses=snapshot.pauses,
                limits=snapshot.limits,
            )
            start = snapshot.offsets
            self.rebuilt_from = f"snapshot v{snapshot.version} ({len(snapshot.jobs)} jobs)"
        else:
            self.rebuilt_from = "full log (no snapshot yet)"
        reader = self.io.open_log_reader(f"{client_id}-replay")
        try:
            self._replay_or_full(reader, start)
        finally:
            reader.close()

    def _replay_or_full(self, reader: LogReader, start: dict[int, int] | None) -> None:
        """Replay the log after the snapshot's offsets (or all of it), and find where reading
        submissions goes on.

        When retention removed records right after the snapshot, neither the log nor Delta
        holds them (the snapshot is the fold's position: whatever the fold wrote to `events`
        is folded into it too), so no rebuild can be complete: the term refuses to lead
        (`LogGap`), unless the operator accepted the loss (`accepts_log_gap`); then the
        snapshot's state goes on with what the log still holds after the gap."""
        try:
            self._replay(reader, start)
        except SnapshotBehindLog as gap:
            if not accepts_log_gap(self.settings):
                raise LogGap(gap) from gap
            log.error(
                "leader %s: %s; the records in the gap are lost (%s is set): serving the "
                "snapshot and the log after the gap", self.node_id, gap, ACCEPT_LOG_GAP,
            )  # fmt: skip
            self.rebuilt_from += f" + the log after a gap ({gap})"
            start = self._replay_accepting_gaps(
                reader, {**(start or {}), gap.partition: gap.log_start}
            )
        if start is not None and self.submit_position is None:
            # Nothing committed since the snapshot: the position as it was then is in
            # the log's last record before it.
            self.submit_position = reader.last_submit_position(self.group, before=start)

    def _replay_accepting_gaps(self, reader: LogReader, start: dict[int, int]) -> dict[int, int]:
        """Replay from `start`, moving every partition the log trimmed to the log's start
        (an operator accepted the loss); returns where the replay started."""
        while True:
            try:
                self._replay(reader, start)
                return start
            except SnapshotBehindLog as gap:
                start = {**start, gap.partition: gap.log_start}

    def _replay(self, reader: LogReader, start: dict[int, int] | None) -> None:
        core = self.core
        for batch in reader.replay(start, complete=True):
            if batch.group == self.group:
                for event in batch.events:
                    try:
                        core.apply(event)
                    except InvalidTransition as error:
                        # Only a record no leader wrote (a producer that bypassed the
                        # topic's ACLs) contradicts the state: skipped, as the streaming fold
                        # skips it (the state is unchanged), so leader and Delta agree.
                        self.skipped_events += 1
                        log.error("leader %s: replay skipped %r: %s", self.node_id, event, error)
                self.replayed_batches += 1
                # A batch the epoch fence voided (a deposed leader's) consumed nothing.
                if batch.submit is not None and batch.epoch >= self.core.fence.epoch:
                    self.submit_position = batch.submit

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._wake_loop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                # The loop is stuck in a call (its node gave up the lease for that): what it
                # took and what waits in the mailbox is answered now, not when (if) the call
                # returns; the loop's own answers later are no-ops (`_settle`).
                stuck = LeaderUnavailable("leader stopped: its loop is stuck")
                for command in self._taken:
                    _settle(command.future, error=stuck)
                self._fail_waiting(None)
                self.listener.stopped(None)
        self._close()
        # What the rebuild froze (this term's core among it) can be collected again once the
        # term is dropped; `dispatch.api.node` collects it right after.
        gc.unfreeze()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stalled_s(self) -> float:
        """Seconds since the loop last completed an iteration."""
        return time.monotonic() - self.last_iteration

    def not_working(self) -> str | None:
        """Why this running term does no work (a stalled loop, a silent broker), or None."""
        now = time.monotonic()
        if now - self.last_iteration > self.stall_bound_s:
            return f"the leader loop completed no iteration for {now - self.last_iteration:.1f}s"
        if now - self.broker_answered > self.stall_bound_s:
            return f"the Kafka broker has not answered for {now - self.broker_answered:.1f}s"
        return None

    def _close(self) -> None:
        for closeable in (self._reader, self._log):
            if closeable is not None:
                try:
                    closeable.close()
                except Exception:
                    log.warning("closing %s failed", type(closeable).__name__, exc_info=True)
        self._reader = self._log = None

    # --- requests --------------------------------------------------------------------------

    def submit(self, command: Command) -> Future[Any]:
        """Queue a command for the loop; its future resolves after the commit."""
        if self.error is not None or self._stopping.is_set():
            _settle(command.future, error=LeaderUnavailable("this leader has stopped"))
        else:
            self._mailbox.put(command)
            self._wake_loop()
            if self.error is not None or self._stopping.is_set():
                # The loop ended between the check and the put: its last drain may have
                # missed this command, which nothing would then answer.
                self._fail_waiting(self.error)
        return command.future

    def _wake_loop(self) -> None:
        """End the loop's idle wait: a command is in the mailbox, or the term stops."""
        reader = self._reader
        if reader is not None:
            reader.wake()

    # --- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            while not self._stopping.is_set():
                self._iterate()
        except BaseException as failure:
            error = failure
            self.error = failure
            log.exception("leader %s stopped: its state can no longer be trusted", self.node_id)
        finally:
            self._fail_waiting(error)
            self.listener.stopped(error)

    def _drain(self) -> list[Command]:
        commands = []
        while True:
            try:
                commands.append(self._mailbox.get_nowait())
            except queue.Empty:
                return commands

    def _iterate(self) -> None:
        if self._commit_window_s:
            # Group commit: right after a transaction, let submissions and commands gather
            # (in the broker and the mailbox) until the window has passed, so that a trickle
            # of single jobs shares transactions instead of paying one each.
            wait = self._last_commit + self._commit_window_s - time.monotonic()
            if wait > 0:
                self._stopping.wait(wait)
        # Requests that went away (their futures cancelled) are dropped here, before they
        # cost anything; the others can no longer be cancelled.
        commands = [command for command in self._drain() if _claim(command.future)]
        self._taken = commands
        try:
            self._iterate_with(commands)
        except BaseException as error:
            # The term ends: whatever was taken from the mailbox and not answered yet would
            # otherwise wait forever (`_fail_waiting` sees only the mailbox).
            for command in commands:
                _settle(command.future, error=LeaderUnavailable(f"leader stopped: {error!r}"))
            raise
        self.last_iteration = time.monotonic()

    def _note_finished(self, events: list[Event]) -> None:
        """Add the jobs these committed events finished to the filter of finished ids."""
        finished = [(e.job_id, e.at) for e in events if isinstance(e, _FINISHING)]
        if finished:
            self.finished_ids.add_many(finished)

    def _iterate_with(self, commands: list[Command]) -> None:
        assert self._reader is not None
        records = self._reader.poll(timeout_ms=0 if commands else self._idle_wait_ms())
        if records:
            self.broker_answered = time.monotonic()  # a fetch's answer
        now = time.time()
        core = self.core
        events: list[Event] = []
        decided: list[tuple[Command, list[Event]]] = []
        for command in commands:
            try:
                own = command.decide(core, now)
            except Rejected as rejected:
                _settle(command.future, error=rejected)
                continue
            events += own
            decided.append((command, own))
        rejections: list[bytes] = []
        if records:
            events += self._consume(records, now, rejections)
        events += core.tick(now)
        if now >= self._next_prune:
            dispatcher = self.settings.dispatcher
            self._next_prune = now + min(PRUNE_EVERY_S, dispatcher.finished_window_s / 5)
            events += core.prune(now - dispatcher.finished_window_s, now, dispatcher.finished_max)
        try:
            committed = self._commit(events, rejections, moved=self._reader.take_moved(), now=now)
        except BaseException as error:
            # Decided but not durable: none of these may be answered as done.
            for command, _ in decided:
                _settle(command.future, error=LeaderUnavailable(f"commit failed: {error!r}"))
            raise
        if committed:
            self.broker_answered = time.monotonic()
        elif self._probe_due():
            self._probe_broker()
        for command, own in decided:
            try:
                value = command.answer(core, own) if command.answer else own
            except Exception as error:  # noqa: BLE001  (a bad answer must reach its caller)
                _settle(command.future, error=error)
            else:
                _settle(command.future, value)
        if events:
            self._note_finished(events)
            self.listener.committed(core, events)

    def _idle_wait_ms(self) -> int:
        """How long the loop may wait with nothing to do: until the core's next timer, at
        most `IDLE_WAIT_MS`."""
        timer_at = self.core.next_timer_at()
        if timer_at is None:
            return IDLE_WAIT_MS
        return max(0, min(IDLE_WAIT_MS, math.ceil((timer_at - time.time()) * 1000)))

    def _consume(self, records: list[Any], now: float, rejections: list[bytes]) -> list[Event]:
        """Submit the consumed `dispatch.submit` records to the core; each one that does not
        parse, or that the core refuses, becomes a rejection record (never a silent drop)."""
        assert self._reader is not None
        max_payload = self.settings.api.max_payload_bytes
        topic = self._reader.topic
        submissions = []
        # The record each parsed submission came from, for a refusal by the core.
        origin: dict[int, Any] = {}
        for record in records:
            try:
                submission = parse_submit_record(
                    record.key, record.value, max_payload_bytes=max_payload
                )
            except SubmissionError as error:
                rejection = Rejection(
                    str(error), topic, record.partition, record.offset,
                    record.key, record.value, now,
                )  # fmt: skip
                rejections.append(rejection.to_record_value())
                continue
            submissions.append(submission)
            origin[id(submission)] = record
        refused: list[tuple[SubmitRequest, str]] = []
        events = self.core.submit_many(submissions, now, refused=refused)
        for submission, reason in refused:
            # Valid alone, refused by the state (one exec queue too many for its client).
            record = origin[id(submission)]
            rejection = Rejection(
                reason, topic, record.partition, record.offset, record.key, record.value, now
            )
            rejections.append(rejection.to_record_value())
        return events

    def _probe_due(self) -> bool:
        # Only a loop the broker has not answered for a while asks: a busy loop hears from
        # it at every commit, and a probe is a round trip the loop waits for.
        at = time.monotonic()
        return at >= self._next_probe and at - self.broker_answered >= BROKER_PROBE_EVERY_S

    def _probe_broker(self) -> None:
        """Ask the broker a bounded question, so that an idle loop notices a silent broker
        (`not_working`) without failing its term: when the broker answers again, the term
        goes on serving at once, with no rebuild."""
        assert self._reader is not None
        self._next_probe = time.monotonic() + BROKER_PROBE_EVERY_S
        if self._reader.broker_answers():
            self.broker_answered = time.monotonic()

    def _commit(
        self, events: list[Event], rejections: list[bytes], *, moved: bool, now: float
    ) -> bool:
        """Commit what was decided, the submit position in the events log (when submissions
        were consumed, or with any events), and about once a second the group's offsets;
        nothing when there is none of these (then False)."""
        assert self._log is not None and self._reader is not None
        position = self._reader.position
        group_offsets = None
        if now >= self._next_group_offsets:
            self._next_group_offsets = now + GROUP_OFFSETS_EVERY_S
            if position != self._group_offsets:
                group_offsets = dict(position)
        if not (events or rejections or moved or group_offsets):
            return False
        if time.time() >= self.serving_until():
            # Another node may already see this lease as expired and take over: nothing
            # decided now may become durable (Kafka's fencing would refuse it anyway once
            # the new leader initialised, but it may not have yet).
            raise LeaseExpired(f"leader {self.node_id}: lease not renewed in time")
        records = []
        if events or moved:
            # An iteration that consumed only bad or duplicate submissions writes a record
            # with no events, for the position alone.
            records = encode_batches(self.group, self.core.epoch, events, submit=position)
        started = time.perf_counter()
        self._log.commit(records, rejections, group_offsets)
        self._last_commit = time.monotonic()
        self.metrics.commit_seconds.observe(time.perf_counter() - started)
        if group_offsets is not None:
            self._group_offsets = group_offsets
        return True

    def _fail_waiting(self, error: BaseException | None) -> None:
        reason = LeaderUnavailable(f"leader stopped: {error!r}" if error else "leader stopped")
        for command in self._drain():
            _settle(command.future, error=reason)
