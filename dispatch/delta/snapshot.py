"""The snapshot a new leader rebuilds from: `jobs` at a version + the log after its offsets.

Every batch's last `jobs` commit records (see `dispatch.delta.progress`) the next offset of every
`dispatch.events` partition it covers and each group's fence epoch. `latest_snapshot` reads the
newest such commit and the `jobs` table *at that version* with delta-rs (no JVM), so:

    core = Dispatcher.restore(
        snapshot.jobs, config=..., epoch=snapshot.fence_epoch, owned=True,
        pauses=snapshot.pauses, limits=snapshot.limits,
    )
    for partition, offset in snapshot.offsets.items():
        # replay dispatch.events from `offset` (read_committed) to the end, this group's
        # batches only, with core.apply(...)
    core.resume(now)

gives exactly the state of a leader that replayed the whole log (docs/spec.md §11: the
snapshot never already contains the replayed tail, and the tail is never missed). `jobs` holds
exactly the jobs the leader holds: lives the leader pruned are in `jobs_archive`, not here.
The pauses in force at those offsets come from the `pauses` table, at the newest version
written by a batch at or before them (`dispatch.delta.pauses`), and the runtime limits in
force from the `limits` table likewise (`dispatch.delta.limits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatch.core.events import LimitSet, Paused
from dispatch.core.job import JobRecord
from dispatch.delta import tables as t
from dispatch.delta.job_rows import JOB_RECORD_COLUMNS, records_from_arrow
from dispatch.delta.limits import limits_at, limits_of
from dispatch.delta.pauses import pauses_at, pauses_of
from dispatch.delta.progress import BATCH, latest_progress_of
from dispatch.warehouse import Warehouse


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    """The `jobs` table version the records were read at."""
    group: str
    jobs: list[JobRecord]
    """Every job of the group the leader holds at that point of the log, as records read for
    this snapshot alone (so `Dispatcher.restore(..., owned=True)` may take them)."""
    events_topic: str
    offsets: dict[int, int]
    """`dispatch.events` partition -> next offset to replay from (everything before it is in
    `jobs`). A partition absent here was never read: replay it from the beginning."""
    fence_epoch: int
    """The group's fence epoch after the covered log (pass it to `Dispatcher.restore`)."""
    batch_id: int
    app_id: str
    committed_at: float
    """When the version was committed (unix seconds)."""
    pauses: list[Paused] = field(default_factory=list)
    """The group's pauses in force at `offsets`, oldest first (pass them to
    `Dispatcher.restore(..., pauses=...)`)."""
    limits: list[LimitSet] = field(default_factory=list)
    """The group's runtime limits in force at `offsets`, as `limit_set` events, oldest first
    (pass them to `Dispatcher.restore(..., limits=...)`)."""


def latest_snapshot(warehouse: Warehouse, group: str = "default") -> Snapshot | None:
    """The newest snapshot of `group`'s jobs, or None when no batch has been committed yet."""
    from deltalake.exceptions import DeltaError

    latest = warehouse.open_if_exists(t.JOBS)
    if latest is None:
        return None
    committed = latest_progress_of(latest, BATCH)
    if committed is None:
        return None
    progress = committed.progress
    table = latest
    if committed.version != latest.version():
        try:
            table = warehouse.open(t.JOBS, version=committed.version)
        except DeltaError:
            # Only if VACUUM removed files of that version (the stream stopped for longer
            # than the retention): the data of later versions is the same up to maintenance
            # commits.
            table = latest
    dataset = table.to_pyarrow_dataset()
    import pyarrow.compute as pc

    # Only the record's columns (`queued_at`, `started_at`, `part` would be decoded for
    # nothing, a million values each) and the group. The group is filtered after the read,
    # not pushed down: files delta-rs's MERGE wrote hold `string_view` columns, on which
    # pyarrow's pushed-down comparisons fail (see dispatch/delta_sql.py).
    # A table the fold has not yet given its newer columns (`retry`, `expires_at`,
    # `max_run_s`, ...) is read without them: `records_from_arrow` takes them as unset.
    present = set(dataset.schema.names)
    columns = [name for name in JOB_RECORD_COLUMNS if name in present]
    read = dataset.to_table(columns=[*columns, "dispatch_group"])
    rows = read.filter(pc.equal(read["dispatch_group"], group)).drop_columns(["dispatch_group"])
    events_topic = progress.topics.get("events", "")
    offsets = dict(progress.offsets.get(events_topic, {}))
    return Snapshot(
        version=committed.version,
        group=group,
        jobs=records_from_arrow(rows),
        events_topic=events_topic,
        offsets=offsets,
        fence_epoch=progress.fence.get(group, 0),
        batch_id=progress.batch_id,
        app_id=progress.app_id,
        committed_at=committed.timestamp_ms / 1000.0,
        pauses=pauses_of(pauses_at(warehouse, events_topic, offsets), group),
        limits=limits_of(limits_at(warehouse, events_topic, offsets), group),
    )
