"""The leader term without Kafka: the rebuild from a snapshot, the collector around it."""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import api.leader
import streaming.snapshot
from api.kafka_log import SnapshotBehindLog
from api.leader import Leader, collector_paused, preload_rebuild_modules
from api.metrics import Metrics
from dispatch.core.commands import SubmitRequest
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Event
from dispatch.core.job import JobRecord
from dispatch.event_records import EventBatch
from dispatch.settings import Settings, load_settings
from streaming.snapshot import Snapshot

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


def new_leader(settings: Settings) -> Leader:
    return Leader(
        settings, "n1", Silent(), Metrics(),
        epoch_for=lambda epoch: epoch + 1, serving_until=lambda: math.inf,
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
    assert {"streaming.snapshot", "pyarrow.dataset"} <= set(sys.modules)


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

    def reader(self, trimmed: bool = False) -> Any:
        """An `EventsReader` over these batches (raising SnapshotBehindLog from a snapshot's
        offsets if `trimmed`)."""
        log = self
        group = self.settings.dispatcher.group

        class Reader:
            def __init__(self, kafka: Any, *, client_id: str) -> None:
                pass

            def __enter__(self) -> Reader:
                return self

            def __exit__(self, *_exc: object) -> None:
                return None

            def replay(self, start: dict[int, int] | None = None) -> Iterator[EventBatch]:
                if start is not None and trimmed:
                    raise SnapshotBehindLog("retention removed offset 0")
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

        return Reader


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
    monkeypatch: pytest.MonkeyPatch,
    *,
    trimmed: bool,
    snapshot_at_end: bool = False,
    deposed_tail: bool = False,
) -> tuple[Leader, Log, Snapshot]:
    """A leader rebuilt from `busy_log`'s snapshot (or one of the whole log, leaving no tail,
    if `snapshot_at_end`) and log (its head removed by retention if `trimmed`, a deposed
    leader's batch at its end if `deposed_tail`); returns it with the log and the snapshot."""
    settings = load_settings()
    log, snapshot = busy_log(settings)
    log.deposed_tail = deposed_tail
    if snapshot_at_end:
        snapshot = log.snapshot()
    monkeypatch.setattr(streaming.snapshot, "latest_snapshot", lambda warehouse, group: snapshot)
    monkeypatch.setattr(api.leader, "EventsReader", log.reader(trimmed=trimmed))
    leader = new_leader(settings)
    leader._rebuild("c1")
    return leader, log, snapshot


def test_a_rebuild_takes_the_snapshots_records_and_replays_the_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leader, log, snapshot = rebuilt(monkeypatch, trimmed=False)
    assert jobs_of(leader.core) == jobs_of(log.core)
    assert leader.core.epoch == 1 and leader.replayed_batches == 2
    assert leader.rebuilt_from == "snapshot v4 (3 jobs)"
    assert leader.submit_position == {0: 4}  # the tail's last position, not another group's
    # No copy: the records read for this term are the core's own (j4 came with the tail).
    assert [leader.core.job_view(job.id) for job in snapshot.jobs] == snapshot.jobs
    assert all(leader.core.job_view(job.id) is job for job in snapshot.jobs)


def test_a_snapshot_behind_the_logs_retention_means_a_full_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leader, log, snapshot = rebuilt(monkeypatch, trimmed=True)
    assert jobs_of(leader.core) == jobs_of(log.core)
    assert leader.replayed_batches == len(log.batches)
    assert leader.rebuilt_from == "full log (the snapshot is behind the log's retention)"
    assert leader.submit_position == {0: 4}
    assert all(leader.core.job_view(job.id) is not job for job in snapshot.jobs)


def test_with_no_tail_after_the_snapshot_the_position_is_the_last_one_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leader, log, _ = rebuilt(monkeypatch, trimmed=False, snapshot_at_end=True)
    assert leader.replayed_batches == 0
    assert jobs_of(leader.core) == jobs_of(log.core)
    assert leader.submit_position == {0: 4}


def test_a_deposed_leaders_batch_moves_no_position(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, log, _ = rebuilt(monkeypatch, trimmed=False, deposed_tail=True)
    assert leader.replayed_batches == 3  # read, and voided by the epoch fence
    assert jobs_of(leader.core) == jobs_of(log.core)
    assert leader.submit_position == {0: 4}
