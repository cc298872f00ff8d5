"""The batch's Delta commits through delta-rs, keyed on the batch like Spark's idempotent writes.

Why not Spark: a micro-batch of a few thousand rows is collected to the driver anyway (the fold
runs the dispatcher core in Python), so a Spark write means `createDataFrame` from Arrow, a plan,
a job with its tasks and a commit — seconds per table, three tables per batch. delta-rs writes
the same Arrow table in tens of milliseconds, in-process, with no JVM (BENCHMARKS.md,
*Streaming: freshness and MERGE cost*).
Spark keeps what it is good at: the Kafka source, its offsets and the checkpoint (and the
rare prune step and VACUUM). The stats roll-up and compaction use delta-rs too.

Exactly once: a commit carries a Delta `txn` action (app id, version = the batch id), the same
action Spark's `txnAppId` / `txnVersion` write. Spark skips a write whose version is not above
the table's recorded one; delta-rs records the action but does not check it, so `append` and
`merge` make that check here before every write. And a `merge` always commits (delta-rs skips
the commit of a MERGE that writes nothing): a batch's progress is never lost with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable
    from deltalake.table import TableMerger

    from dispatch.warehouse import Warehouse


class DeltaCommits:
    """delta-rs handles on the application's tables, kept open and brought up to date before
    each use (the application is the tables' only writer, so the latest version is its own)."""

    def __init__(self, warehouse: Warehouse) -> None:
        self.warehouse = warehouse
        self._tables: dict[str, DeltaTable] = {}

    def table(self, name: str) -> DeltaTable:
        """`name` at its latest version."""
        handle = self._tables.get(name)
        if handle is None:
            handle = self._tables[name] = self.warehouse.open(name)
            return handle
        handle.update_incremental()
        return handle

    def append(
        self, name: str, rows: pa.Table, *, app_id: str, version: int, metadata: str
    ) -> bool:
        """Append `rows` as the app's commit `version` with `metadata` as the commit's
        `userMetadata`; False (nothing written) when that commit is already in the table."""
        from deltalake import write_deltalake

        table = self.table(name)  # brought up to date once: the check and the write share it
        if _holds(table, app_id, version):
            return False
        write_deltalake(
            table,
            rows,
            mode="append",
            commit_properties=_properties(app_id, version, metadata),
        )
        return True

    def overwrite(
        self, name: str, rows: pa.Table, *, app_id: str, version: int, metadata: str
    ) -> bool:
        """Replace the whole table by `rows` (for the small `pauses` and `limits` tables), as
        `append` does otherwise: False (nothing written) when that commit is already in the
        table."""
        from deltalake import write_deltalake

        table = self.table(name)
        if _holds(table, app_id, version):
            return False
        write_deltalake(
            table,
            rows,
            mode="overwrite",
            commit_properties=_properties(app_id, version, metadata),
        )
        return True

    def merge(
        self,
        name: str,
        source: pa.Table,
        predicate: str,
        clauses: Callable[[TableMerger], TableMerger],
        *,
        app_id: str,
        version: int,
        metadata: str,
    ) -> int | None:
        """MERGE `source` (alias `s`) into `name` (alias `t`) with the `clauses` the caller adds,
        as the app's commit `version` with `metadata`: the table version committed, or None
        (nothing written) when that commit is already in the table.

        The commit is always made: delta-rs writes no commit at all for a MERGE with nothing to
        write (an empty source, or source rows that match nothing and insert nothing), so such
        a MERGE is followed by a commit with no data carrying the same `txn` and metadata."""
        table = self.table(name)
        if _holds(table, app_id, version):
            return None
        properties = _properties(app_id, version, metadata)
        if source.num_rows:
            merger = table.merge(
                source,
                predicate,
                source_alias="s",
                target_alias="t",
                # The source is a small in-memory table: let delta-rs read its statistics to
                # prune target files (the streamed mode gives that up to save memory on huge
                # sources).
                streamed_exec=False,
                commit_properties=properties,
            )
            clauses(merger).execute()
            # The handle is at the MERGE's commit now, if it made one (no later version: a
            # commit racing this one would have failed it).
            committed = table.version()
            if _holds(table, app_id, version):
                return committed
        _commit_no_data(table, properties)
        # That commit does not move the handle; the next version is its own unless another
        # writer's came first (then the caller sees commits it did not make, and reloads).
        table.update_incremental()
        return table.version()

    def commit_progress(self, name: str, *, app_id: str, version: int, metadata: str) -> bool:
        """The app's commit `version` with `metadata` and no data, unless the table holds that
        commit already (another writer, Spark, may have made it); True when it was made here."""
        table = self.table(name)
        if _holds(table, app_id, version):
            return False
        _commit_no_data(table, _properties(app_id, version, metadata))
        return True


def _commit_no_data(table: DeltaTable, properties: CommitProperties) -> None:
    """A commit with no file action: only `commitInfo` (with the user metadata) and the `txn`.
    The table's data at this version is the previous version's."""
    table.create_write_transaction(
        [],
        mode="append",
        schema=table.schema(),
        partition_by=table.metadata().partition_columns,
        commit_properties=properties,
    )


def _holds(table: DeltaTable, app_id: str, version: int) -> bool:
    recorded = table.transaction_version(app_id)
    return recorded is not None and recorded >= version


def _properties(app_id: str, version: int, metadata: str) -> CommitProperties:
    from deltalake import CommitProperties, Transaction

    # `userMetadata` lands at the top of commitInfo, where Spark puts its own
    # `commitInfo.userMetadata`: the progress readers cannot tell the two writers apart.
    return CommitProperties(
        custom_metadata={"userMetadata": metadata},
        app_transactions=[Transaction(app_id, version)],
    )
