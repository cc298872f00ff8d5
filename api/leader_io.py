"""What a leader term and its node read and write, as interfaces: the seams around the loop.

A term (`dispatch.api.leader.Leader`) needs four things from the outside world, each a
protocol here:
- a `TransactionalLog`: one atomic commit per loop iteration of its events records, the
  rejections and (now and then) the submit group's offsets; opening one fences every log
  the group opened before (a deposed leader's next commit fails);
- a `SubmitSource`: the submissions to consume, from a position, and where it stands;
- a `LogReader`: the committed events log after a position (the rebuild's replay), and the
  submit position the log last carried before one;
- the newest snapshot of the group's jobs (`LeaderIO.latest_snapshot`).
A node (`dispatch.api.node.Node`) adds a `SubmitSink`, where its REST and WebSocket submissions go,
and a `LagSource`, how far the streaming fold is behind the log (its `/metrics`). A term also
reads, beside these, a `JobArchive`: the jobs it no longer holds (Delta's `jobs` and
`jobs_archive`), by id and as the ids finished since a time.

`KafkaLeaderIO` is the real thing (Kafka through `dispatch.api.kafka_log` and
`dispatch.api.submit_producer`, the snapshot through delta-rs); `dispatch.api.memory_log.MemoryLog`
is its in-memory twin, for tests of the leader's and the API's logic that need no broker (as
dramatiq's stub broker). Everything only a broker shows (transactions across a kill -9, fencing by
Kafka, retention, reconnection) stays tested against a real one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from dispatch.core.commands import SubmitRequest
from dispatch.event_records import EventBatch
from dispatch.settings import KafkaSettings, Settings

if TYPE_CHECKING:
    from dispatch.api.kafka_log import SubmitRecord
    from dispatch.core.job import JobRecord
    from dispatch.delta.snapshot import Snapshot


class TransactionalLog(Protocol):
    """The term's writer: what one loop iteration decided, in one transaction."""

    def commit(
        self,
        events_records: Sequence[bytes],
        rejections: Sequence[bytes],
        group_offsets: Mapping[int, int] | None = None,
    ) -> None:
        """All of it durable, or an exception (the term's state is then ahead of the log)."""
        ...

    def close(self) -> None: ...


class SubmitSource(Protocol):
    """The term's reader of submissions."""

    topic: str
    position: dict[int, int]
    """Partition -> the offset of the next submission to read: what a commit records."""

    def poll(self, timeout_ms: int) -> list[SubmitRecord]:
        """What arrived since the last poll, waiting up to `timeout_ms` for something (less
        after `wake`)."""
        ...

    def wake(self) -> None:
        """Make a `poll` under way, or the next one, return at once: a command waits for the
        loop (called from any thread)."""
        ...

    def broker_answers(self) -> bool:
        """Whether the log answers a small question now (an idle loop's liveness probe)."""
        ...

    def take_moved(self) -> bool:
        """Whether `poll` consumed anything since the last call."""
        ...

    def close(self) -> None: ...


class LogReader(Protocol):
    """The rebuild's reader of the committed events log."""

    def replay(
        self, start: Mapping[int, int] | None = None, *, complete: bool = False
    ) -> Iterator[EventBatch]:
        """Every committed batch from `start` to the end; `SnapshotBehindLog` when the log no
        longer holds `start` (with `complete`, a missing partition means offset 0)."""
        ...

    def last_submit_position(
        self, group: str, *, before: Mapping[int, int]
    ) -> dict[int, int] | None: ...

    def close(self) -> None: ...


class SubmitSink(Protocol):
    """Where a node writes the submissions it accepts."""

    async def send(self, submissions: Sequence[SubmitRequest]) -> None:
        """Returns once the log holds every one of them (acks=all)."""
        ...

    def close(self, timeout_s: float) -> None: ...


class LagSource(Protocol):
    """How far the streaming fold's last batch is behind the log, per topic (records)."""

    def measure(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class LeaderIO(Protocol):
    """Opens what a term uses; each term opens its own and closes them when it ends."""

    def open_log(self, group: str, client_id: str) -> TransactionalLog:
        """The group's transactional log, fencing every one opened before (blocking)."""
        ...

    def open_submit_source(
        self, group: str, client_id: str, position: Mapping[int, int] | None
    ) -> SubmitSource: ...

    def open_log_reader(self, client_id: str) -> LogReader: ...

    def latest_snapshot(self, group: str) -> Snapshot | None:
        """The newest snapshot of `group`'s jobs, or None (none yet)."""
        ...


class JobArchive(Protocol):
    """The jobs the leader no longer holds in memory: Delta's `jobs` and `jobs_archive`."""

    def find_jobs(self, group: str, ids: Sequence[str]) -> dict[str, JobRecord]:
        """The newest life of each of `ids` that the tables hold (blocking I/O)."""
        ...

    def finished_since(self, group: str, since: float) -> Iterator[list[tuple[str, float]]]:
        """(id, finish time) of every job that finished at or after `since`, in batches."""
        ...


class DeltaJobArchive:
    """`JobArchive` over the warehouse's Delta tables, read by delta-rs (no JVM)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def find_jobs(self, group: str, ids: Sequence[str]) -> dict[str, JobRecord]:
        from dispatch.delta.job_lookup import find_jobs
        from dispatch.warehouse import Warehouse

        return find_jobs(Warehouse.of(self.settings), group, ids)

    def finished_since(self, group: str, since: float) -> Iterator[list[tuple[str, float]]]:
        from dispatch.delta.job_lookup import finished_ids_since
        from dispatch.warehouse import Warehouse

        return finished_ids_since(Warehouse.of(self.settings), group, since)


class NodeIO(LeaderIO, Protocol):
    """A node's whole outside world: its terms' and its submissions'."""

    def open_submit_sink(self, client_id: str) -> SubmitSink: ...

    def open_lag_source(self, client_id: str) -> LagSource | None:
        """The fold's lag behind this log, or None where no fold reads it."""
        ...


def open_event_log(kafka: KafkaSettings, group: str, client_id: str) -> TransactionalLog:
    """The group's transactional event log on `kafka.leader_client`; opening it fences every
    log the group opened before."""
    if kafka.leader_client == "librdkafka":
        from dispatch.api.rdkafka_log import RdkafkaEventLog

        return RdkafkaEventLog(kafka, group, client_id=client_id)
    from dispatch.api.kafka_log import EventLog

    return EventLog(kafka, group, client_id=client_id)


class KafkaLeaderIO:
    """The production seams: Kafka (the term's transactional log and submit reader on
    `kafka.leader_client`, the rebuild's replay on kafka-python, submissions on librdkafka)
    and the Delta `jobs` table for snapshots."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def open_log(self, group: str, client_id: str) -> TransactionalLog:
        return open_event_log(self.settings.kafka, group, client_id)

    def open_submit_source(
        self, group: str, client_id: str, position: Mapping[int, int] | None
    ) -> SubmitSource:
        kafka = self.settings.kafka
        if kafka.leader_client == "librdkafka":
            from dispatch.api.rdkafka_submit_reader import RdkafkaSubmitReader

            return RdkafkaSubmitReader(kafka, group, client_id=client_id, position=position)
        from dispatch.api.kafka_log import SubmitReader

        return SubmitReader(kafka, group, client_id=client_id, position=position)

    def open_log_reader(self, client_id: str) -> LogReader:
        from dispatch.api.kafka_log import EventsReader

        return EventsReader(self.settings.kafka, client_id=client_id)

    def latest_snapshot(self, group: str) -> Snapshot | None:
        from dispatch.delta.snapshot import latest_snapshot  # delta-rs only, no JVM
        from dispatch.warehouse import Warehouse

        return latest_snapshot(Warehouse.of(self.settings), group)

    def open_submit_sink(self, client_id: str) -> SubmitSink:
        from dispatch.api.submit_producer import SubmitProducer

        return SubmitProducer(self.settings.kafka, client_id)

    def open_lag_source(self, client_id: str) -> LagSource | None:
        from dispatch.delta.lag import LagProbe  # kafka-python + delta-rs

        return LagProbe(self.settings, client_id=client_id)
