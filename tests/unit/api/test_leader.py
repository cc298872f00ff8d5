"""The leader term without Kafka: the rebuild from a snapshot, the collector around it."""

from __future__ import annotations

import gc
import math
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from dispatch.api.kafka_log import SnapshotBehindLog
from dispatch.api.leader import (
    ACCEPT_LOG_GAP,
    BROKER_PROBE_EVERY_S,
    IDLE_WAIT_MS,
    Command,
    Leader,
    LeaderUnavailable,
    LogGap,
    collector_paused,
    preload_rebuild_modules,
)
from dispatch.api.metrics import Metrics
from dispatch.core.commands import SubmitRequest
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Event
from dispatch.core.job import JobRecord
from dispatch.delta.snapshot import Snapshot
from dispatch.event_records import EventBatch
from dispatch.settings import Settings, load_settings

T0 = 1_000.0


@pytest.fixture(autouse=True)
def collector_as_it_was() -> Iterator[None]:
    """Whatever a test does, the test process goes on with its collector on and unfrozen."""
    enabled = gc.isenabled()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


class Silent:
    def committed(self, core: Dispatcher, events: Sequence[Event]) -> None:
        pass

    def stopped(self, error: BaseException | None) -> None:
        pass


def new_leader(settings: Settings, io: Any = None) -> Leader:
    return Leader(
        settings, "n1", Silent(), Metrics(),
        epoch_for=lambda epoch: epoch + 1, serving_until=lambda: math.inf, io=io,
    )  # fmt: skip


def is_tracked_by_a_generation(target: object) -> bool:
    """Whether a collection would scan `target` (frozen objects are in no generation)."""
    return any(obj is target for obj in gc.get_objects())


# --- the collector around a rebuild ------------------------------------------------------------


def test_the_collector_is_off_during_a_rebuild_and_what_it_built_is_frozen_after() -> None:
    gc.unfreeze()
    with collector_paused():
        assert not gc.isenabled()
        built = [[n] for n in range(100)]
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert not is_tracked_by_a_generation(built[0]), "a full collection would scan it again"


def test_a_failed_rebuild_freezes_nothing_and_turns_the_collector_back_on() -> None:
    gc.unfreeze()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the snapshot is unreadable")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_turned_off_by_someone_else_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_stopping_a_term_unfreezes_what_its_rebuild_froze() -> None:
    leader = new_leader(load_settings())
    with collector_paused():
        held = [[n] for n in range(100)]
    leader.stop()
    assert gc.get_freeze_count() == 0 and is_tracked_by_a_generation(held[0])


def test_the_modules_a_rebuild_imports_are_preloaded() -> None:
    preload_rebuild_modules()
    assert {"dispatch.delta.snapshot", "pyarrow.dataset"} <= set(sys.modules)


# --- the rebuild ------------------------------------------------------------------------------


class Log:
    """A live core's events, each batch carrying the submit position as the leader's commits
    do (one partition, one offset per submitted job)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.core = Dispatcher(settings.dispatcher.core_config())
        self.batches: list[tuple[list[Event], dict[int, int]]] = []
        self.consumed = 0
        self.deposed_tail = False
        self.log_start = 0
        """Where the log starts once retention trimmed it (`reader(trimmed=True)`)."""

    def add(self, events: list[Event]) -> None:
        self.batches.append((events, {0: self.consumed}))

    def snapshot(self, version: int = 4) -> Snapshot:
        return Snapshot(
            version=version,
            group=self.settings.dispatcher.group,
            jobs=[JobRecord.from_dict(job.to_dict()) for job in self.core.jobs()],
            events_topic=self.settings.kafka.events_topic,
            offsets={0: len(self.batches)},
            fence_epoch=self.core.epoch,
            batch_id=1,
            app_id="app",
            committed_at=T0,
        )

    def io(self, snapshot: Snapshot | None, trimmed: bool = False) -> Any:
        """The term's seams (`dispatch.api.leader_io.LeaderIO`): `snapshot`, and a reader over these
        batches (raising SnapshotBehindLog from a snapshot's offsets if `trimmed`)."""
        log = self
        group = self.settings.dispatcher.group

        class Reader:
            def close(self) -> None:
                return None

            def replay(
                self, start: dict[int, int] | None = None, *, complete: bool = False
            ) -> Iterator[EventBatch]:
                if trimmed and (start is None or start.get(0, 0) < log.log_start):
                    raise SnapshotBehindLog("events", 0, (start or {}).get(0, 0), log.log_start)
                first = 0 if start is None else start.get(0, 0)
                for events, position in log.batches[first:]:
                    yield EventBatch(group, log.core.epoch, events, position)
                yield EventBatch("another-group", 9, [], {0: 999})
                if log.deposed_tail:
                    # A deposed leader's late batch: the fence voids it, its position with it.
                    yield EventBatch(group, log.core.epoch - 1, [], {0: 998})

            def last_submit_position(
                self, wanted: str, *, before: dict[int, int]
            ) -> dict[int, int] | None:
                carried = [position for _, position in log.batches[: before[0]]]
                return carried[-1] if carried and wanted == group else None

        class IO:
            def open_log_reader(self, client_id: str) -> Reader:
                return Reader()

            def latest_snapshot(self, wanted: str) -> Snapshot | None:
                return snapshot if wanted == group else None

        return IO()


def submitted(log: Log, *ids: str, now: float) -> None:
    log.consumed += len(ids)
    log.add(
        log.core.submit_many([SubmitRequest(id=i, exec="a.b", payload={"id": i}) for i in ids], now)
    )


def busy_log(settings: Settings) -> tuple[Log, Snapshot]:
    log = Log(settings)
    log.add(log.core.begin_epoch(1, T0, holder="old"))
    log.add(log.core.join("w1", ["job.assign.>"], T0) + log.core.grant_credit("w1", 2, T0))
    submitted(log, "j1", "j2", "j3", now=T0 + 1)
    snapshot = log.snapshot()
    running = next(job for job in log.core.jobs() if job.worker_id == "w1")
    log.add(log.core.ack(running.id, running.attempts, running.lease or "", T0 + 2))
    submitted(log, "j4", now=T0 + 3)
    return log, snapshot


def jobs_of(core: Dispatcher) -> dict[str, dict[str, Any]]:
    return {job.id: job.to_dict() for job in core.jobs()}


def rebuilt(
    *,
    trimmed: bool,
    accept_gap: bool = False,
    snapshot_at_end: bool = False,
    deposed_tail: bool = False,
    log_start: int = 0,
) -> tuple[Leader, Log, Snapshot]:
    """A leader rebuilt from `busy_log`'s snapshot (or one of the whole log, leaving no tail,
    if `snapshot_at_end`) and log (its head removed by retention if `trimmed`, a deposed
    leader's batch at its end if `deposed_tail`); returns it with the log and the snapshot."""
    settings = load_settings(dispatcher={"accept_log_gap": accept_gap})
    log, snapshot = busy_log(settings)
    log.deposed_tail = deposed_tail
    log.log_start = log_start
    if snapshot_at_end:
        snapshot = log.snapshot()
    leader = new_leader(settings, log.io(snapshot, trimmed=trimmed))
    leader._rebuild("c1")
    return leader, log, snapshot


def test_a_rebuild_takes_the_snapshots_records_and_replays_the_tail() -> None:
    leader, log, snapshot = rebuilt(trimmed=False)
    assert jobs_of(leader.core) == jobs_of(log.core)
    assert leader.core.epoch == 1 and leader.replayed_batches == 2
    assert leader.rebuilt_from == "snapshot v4 (3 jobs)"
    assert leader.submit_position == {0: 4}  # the tail's last position, not another group's
    # No copy: the records read for this term are the core's own (j4 came with the tail).
    assert [leader.core.job_view(job.id) for job in snapshot.jobs] == snapshot.jobs
    assert all(leader.core.job_view(job.id) is job for job in snapshot.jobs)


def test_a_snapshot_behind_the_logs_retention_is_refused_naming_the_gap() -> None:
    # The snapshot covers offsets < 3; retention removed everything before offset 4.
    with pytest.raises(LogGap) as refused:
        rebuilt(trimmed=True, log_start=4)
    gap = refused.value.gap
    assert (gap.topic, gap.partition, gap.snapshot_offset, gap.log_start) == ("events", 0, 3, 4)
    assert "events[0] starts at 4, after the snapshot's offset 3" in str(refused.value)
    assert ACCEPT_LOG_GAP in str(refused.value)


def test_a_trimmed_log_with_no_snapshot_is_refused_too() -> None:
    settings = load_settings()
    log, _ = busy_log(settings)
    log.log_start = 2
    with pytest.raises(LogGap, match="starts at 2, after the snapshot's offset 0"):
        new_leader(settings, log.io(None, trimmed=True))._rebuild("c1")


def test_an_operator_may_accept_the_gap_and_the_log_after_it_is_replayed() -> None:
    leader, _, _ = rebuilt(trimmed=True, accept_gap=True, log_start=4)
    # The snapshot's jobs and j4 (offset 4, after the gap); the ack at offset 3 is lost.
    assert sorted(jobs_of(leader.core)) == ["j1", "j2", "j3", "j4"]
    assert leader.replayed_batches == 1
    assert "a gap" in leader.rebuilt_from
    assert leader.submit_position == {0: 4}


def test_with_no_tail_after_the_snapshot_the_position_is_the_last_one_before_it() -> None:
    leader, log, _ = rebuilt(trimmed=False, snapshot_at_end=True)
    assert leader.replayed_batches == 0
    assert jobs_of(leader.core) == jobs_of(log.core)
    assert leader.submit_position == {0: 4}


def test_a_deposed_leaders_batch_moves_no_position() -> None:
    leader, log, _ = rebuilt(trimmed=False, deposed_tail=True)
    assert leader.replayed_batches == 3  # read, and voided by the epoch fence
    assert jobs_of(leader.core) == jobs_of(log.core)
    assert leader.submit_position == {0: 4}


# --- the loop: requests that went away, and how long it may stall ------------------------------


class Reader:
    """A `SubmitReader` with nothing to read; `answers` is what a broker probe finds."""

    topic = "submit"

    def __init__(self) -> None:
        self.position: dict[int, int] = {0: 0}
        self.answers = True
        self.probes = 0
        self.waits: list[int] = []
        self.wakes = 0

    def poll(self, timeout_ms: int) -> list[Any]:
        self.waits.append(timeout_ms)
        return []

    def wake(self) -> None:
        self.wakes += 1

    def take_moved(self) -> bool:
        return False

    def broker_answers(self) -> bool:
        self.probes += 1
        return self.answers

    def close(self) -> None:
        pass


class EventLogStandIn:
    def __init__(self) -> None:
        self.commits: list[list[bytes]] = []

    def commit(
        self,
        events_records: Sequence[bytes],
        rejections: Sequence[bytes],
        group_offsets: Any = None,
    ) -> None:
        self.commits.append(list(events_records))

    def close(self) -> None:
        pass


def serving_leader(settings: Settings | None = None) -> tuple[Leader, Reader]:
    """A leader whose loop can be stepped by hand (`_iterate`), in epoch 1."""
    leader = new_leader(settings or load_settings())
    reader = Reader()
    leader._reader = reader
    leader._log = EventLogStandIn()
    leader.core.begin_epoch(1, T0, holder="n1")
    return leader, reader


def joining(worker_id: str) -> Command:
    return Command(
        lambda core, now: core.join(worker_id, ["job.assign.>"], now),
        lambda core, events: len(events),
    )


def test_a_request_that_went_away_before_the_loop_took_it_is_dropped() -> None:
    leader, _ = serving_leader()
    gone = joining("w-gone")
    gone.future.cancel()
    leader.submit(gone)
    leader._iterate()
    assert gone.future.cancelled()
    assert "w-gone" not in {worker.worker_id for worker in leader.core.workers()}


def test_a_request_that_goes_away_during_its_iteration_does_not_end_the_term() -> None:
    leader, _ = serving_leader()
    cancelled: list[bool] = []

    def decide_then_go_away(core: Dispatcher, now: float) -> list[Event]:
        # What asyncio's wrap_future does when the awaiting request is cancelled (a worker's
        # socket closed): it cancels the concurrent future, here mid-iteration.
        cancelled.append(going.future.cancel())
        return core.join("w1", ["job.assign.>"], now)

    going = Command(decide_then_go_away, lambda core, events: "answered")
    leader.submit(going)
    leader._iterate()  # InvalidStateError here ended the term
    assert cancelled == [False], "a future the loop took can no longer be cancelled"
    later = joining("w2")
    leader.submit(later)
    leader._iterate()
    assert later.future.result(timeout=0) == 1
    assert going.future.result(timeout=0) == "answered"


def test_commands_taken_by_an_iteration_that_fails_are_answered() -> None:
    leader, reader = serving_leader()

    def broken_poll(timeout_ms: int) -> list[Any]:
        raise RuntimeError("the broker went away")

    reader.poll = broken_poll  # type: ignore[method-assign]
    waiting = joining("w1")
    leader.submit(waiting)
    with pytest.raises(RuntimeError):
        leader._iterate()
    with pytest.raises(LeaderUnavailable, match="the broker went away"):
        waiting.future.result(timeout=0)


def test_a_loop_that_stalls_or_whose_broker_is_silent_is_not_working() -> None:
    leader, reader = serving_leader()
    bound = leader.stall_bound_s
    assert bound >= 2 * leader.settings.lease.ttl_s
    leader._iterate()
    assert leader.not_working() is None
    leader.last_iteration -= bound + 1
    assert "completed no iteration" in (leader.not_working() or "")
    leader._iterate()
    assert leader.not_working() is None
    # An idle loop probes the broker about once a second.
    reader.answers = False
    leader.broker_answered -= bound + 1
    leader._next_probe = 0.0
    leader._iterate()
    assert "has not answered" in (leader.not_working() or "")
    reader.answers = True
    leader._next_probe = 0.0
    leader._iterate()
    assert leader.not_working() is None


def test_a_loop_the_broker_answered_lately_does_not_wait_for_a_probe() -> None:
    # A probe is a round trip the loop waits for: a loop that heard from the broker within
    # the probe interval (a commit, a fetch) goes on without one.
    leader, reader = serving_leader()
    leader._next_probe = 0.0
    leader.broker_answered = time.monotonic()
    for _ in range(3):
        leader._iterate()
    assert reader.probes == 0
    leader.broker_answered -= BROKER_PROBE_EVERY_S
    leader._iterate()
    leader._iterate()
    assert reader.probes == 1  # then at most once per interval


def test_stopping_a_leader_whose_loop_is_stuck_answers_every_waiting_request() -> None:
    leader, reader = serving_leader()
    entered, release = threading.Event(), threading.Event()

    def stuck_poll(timeout_ms: int) -> list[Any]:
        entered.set()
        release.wait(10)  # a Kafka call that does not return
        return []

    reader.poll = stuck_poll  # type: ignore[method-assign]
    taken = joining("w1")
    leader.submit(taken)
    leader._thread = threading.Thread(target=leader._run, daemon=True)
    leader._thread.start()
    try:
        assert entered.wait(5)
        waiting = joining("w2")
        leader.submit(waiting)
        leader.stop(timeout_s=0.2)
        # Answered at once, not when (if) the stuck call returns.
        for command in (taken, waiting):
            with pytest.raises(LeaderUnavailable):
                command.future.result(timeout=0)
    finally:
        release.set()
        leader._thread.join(5)


# --- the loop's idle wait -------------------------------------------------------------------------


def test_an_idle_loop_waits_until_its_next_timer_at_most_the_idle_wait() -> None:
    leader, reader = serving_leader()
    leader._iterate()
    assert reader.waits[-1] == IDLE_WAIT_MS, "nothing due: the whole idle wait"
    # A job delayed by 60 ms is due sooner than the idle wait ends: the loop wakes for it.
    soon = SubmitRequest(id="j-soon", exec="img.resize", payload={}, delay_s=0.06)
    leader.core.submit(soon, time.time())
    leader._iterate()
    assert reader.waits[-1] <= 60 < IDLE_WAIT_MS
    # Once it is overdue, no wait at all: the iteration's tick releases it.
    time.sleep(0.07)
    leader._iterate()
    assert reader.waits[-1] == 0
    released = leader.core.job("j-soon")
    assert released is not None and released.not_before is not None
    assert released.not_before <= time.time()
    leader._iterate()
    assert reader.waits[-1] == IDLE_WAIT_MS


def test_a_command_wakes_the_idle_loop_and_is_taken_without_waiting() -> None:
    leader, reader = serving_leader()
    command = joining("w1")
    leader.submit(command)
    assert reader.wakes == 1, "the loop's wait must end when a command arrives"
    leader._iterate()
    assert reader.waits[-1] == 0, "a loop with commands does not wait for submissions"
    assert command.future.result(timeout=0) == 1
    leader.stop()
    assert reader.wakes == 2, "stopping ends the wait too"


# --- group commit ---------------------------------------------------------------------------------


def test_a_commit_window_lets_what_arrives_soon_after_a_commit_share_the_next_one() -> None:
    settings = load_settings()
    settings = settings.model_copy(
        update={"api": settings.api.model_copy(update={"commit_window_ms": 80.0})}
    )
    leader, _ = serving_leader(settings)
    log = leader._log
    assert isinstance(log, EventLogStandIn)
    first = joining("w1")
    leader.submit(first)
    leader._iterate()  # nothing committed before: at once
    assert len(log.commits) == 1 and first.future.result(timeout=0) == 1
    committed_at = time.monotonic()
    second, third = joining("w2"), joining("w3")
    leader.submit(second)
    # The third arrives while the window holds the loop: it joins the same transaction.
    threading.Timer(0.02, leader.submit, args=(third,)).start()
    leader._iterate()
    assert time.monotonic() - committed_at >= 0.08
    assert len(log.commits) == 2, "one transaction for both"
    assert second.future.result(timeout=0) == third.future.result(timeout=0) == 1


def test_without_a_commit_window_each_iteration_commits_at_once() -> None:
    leader, _ = serving_leader()
    log = leader._log
    assert isinstance(log, EventLogStandIn)
    waited: list[float | None] = []

    def wait(timeout: float | None = None) -> bool:
        waited.append(timeout)
        return False

    leader._stopping.wait = wait  # type: ignore[method-assign]
    for n in range(3):
        leader.submit(joining(f"w{n}"))
        leader._iterate()
    assert len(log.commits) == 3 and waited == []
