"""The Delta `pauses` table: the pauses in force (operator holds on an exec pattern's queues
or a client's jobs), kept by the streaming fold so that they survive a failover.

A row per pause in force: `dispatch_group`, `scope` (`exec` or `client`), `target` (the exec
pattern or client id), and the `paused` event's `epoch`, `at`, `by` and `reason`. A `paused`
event inserts (or replaces) its row, a `resumed` deletes it.

Consistency with the snapshot. The table is small (an operator's pauses), so a batch with
`paused`/`resumed` events rewrites it whole, before its `jobs` commit, as one Delta commit
carrying the batch's `Progress` (its `txn` too: a batch run again does not write it twice).
Every version of `pauses` so written holds exactly the pauses in force at its offsets, and a
batch without such events leaves the table as it was (its pauses are still those in force).
So the pauses in force at a `jobs` snapshot's offsets are those of the newest `pauses`
version whose offsets are all at or before the snapshot's (`pauses_at`): a version written by
a batch that failed before its `jobs` commit is past them, and skipped. The fold starts from
that same version (`pauses_at` at the offsets `jobs` covers), so after such a failure, even
with a new checkpoint and other batch boundaries, it rewrites the table from the right state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dispatch.core.events import Event, Paused, Resumed, event_from_dict
from dispatch.delta import tables as t
from dispatch.delta.progress import BATCH, Progress, newest_commit

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

    from dispatch.warehouse import Warehouse

PauseKey = tuple[str, str, str]
"""(dispatch group, scope, target)."""
PauseRows = dict[PauseKey, dict[str, Any]]
"""The pauses in force: their `pauses` rows by key."""


def pause_row(group: str, event: Paused) -> dict[str, Any]:
    """The `pauses` row of a pause in force."""
    return {
        "dispatch_group": group,
        "scope": event.scope.value,
        "target": event.target,
        "epoch": event.epoch,
        "at": event.at,
        "by": event.by,
        "reason": event.reason,
    }


def paused_event(row: Mapping[str, Any]) -> Paused:
    """The `paused` event a row holds (validated as the log's events are)."""
    data: dict[str, Any] = {
        "type": Paused.type,
        "epoch": row["epoch"],
        "at": row["at"],
        "scope": row["scope"],
        "target": row["target"],
        "reason": row.get("reason") or "",
    }
    if row.get("by") is not None:
        data["by"] = row["by"]
    event = event_from_dict(data)
    if not isinstance(event, Paused):  # pragma: no cover - the type is set above
        raise ValueError("pauses: not a paused event")
    return event


def apply_pauses(rows: PauseRows, events: Iterable[tuple[str, Event]]) -> bool:
    """Apply (group, event) pairs in log order to `rows` (other events are ignored): a
    `paused` sets its row, a `resumed` removes it. Whether any was a pause or resume."""
    seen = False
    for group, event in events:
        if isinstance(event, Paused):
            rows[(group, event.scope.value, event.target)] = pause_row(group, event)
            seen = True
        elif isinstance(event, Resumed):
            rows.pop((group, event.scope.value, event.target), None)
            seen = True
    return seen


def is_pause_event(event: Event) -> bool:
    return isinstance(event, Paused | Resumed)


def arrow_pauses(rows: PauseRows) -> pa.Table:
    """The table's rows, in key order."""
    return t.arrow_rows(t.PAUSES, [rows[key] for key in sorted(rows)])


def _within(offsets: Mapping[int, int], bound: Mapping[int, int]) -> bool:
    """Every partition's position in `offsets` is at or before the one in `bound` (a
    partition absent from either is at 0)."""
    return all(offset <= bound.get(partition, 0) for partition, offset in offsets.items() if offset)


def pauses_version(table: DeltaTable, events_topic: str, offsets: Mapping[int, int]) -> int | None:
    """The version of `pauses` to read for the pauses in force at `offsets`: the newest one
    written by a batch whose `events_topic` offsets are all at or before `offsets`, or the
    table's latest version when only maintenance (OPTIMIZE, VACUUM) committed after it (the
    same rows, in files VACUUM keeps). None: no such batch, no pause was ever in force."""
    passed: list[Progress] = []

    def accept(text: str | None) -> Progress | None:
        progress = Progress.from_json(text)
        if progress is None or progress.kind != BATCH:
            return None
        if _within(progress.offsets.get(events_topic, {}), offsets):
            return progress
        passed.append(progress)
        return None

    found = newest_commit(table, accept)
    if found is None:
        return None
    return found[0] if passed else table.version()


def pauses_at(warehouse: Warehouse, events_topic: str, offsets: Mapping[int, int]) -> PauseRows:
    """The pauses in force once the log is read up to `offsets` (`events_topic` partition ->
    next offset), every group's, from the `pauses` table (empty: no table, or no pause by
    then). Read with delta-rs."""
    return rows_in_force_at(warehouse, t.PAUSES, events_topic, offsets)


def rows_in_force_at(
    warehouse: Warehouse, table_name: str, events_topic: str, offsets: Mapping[int, int]
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The rows of a table of controls in force (`pauses`, `limits`: rewritten whole by the
    batches that change them) once the log is read up to `offsets`, by (group, scope,
    target), at the version `pauses_version` picks. Empty: no table, or nothing in force."""
    table = warehouse.open_if_exists(table_name)
    if table is None:
        return {}
    version = pauses_version(table, events_topic, offsets)
    if version is None:
        return {}
    if version != table.version():
        table = warehouse.open(table_name, version=version)
    read = table.to_pyarrow_table()
    return {
        (str(row["dispatch_group"]), str(row["scope"]), str(row["target"])): row
        for row in read.to_pylist()
    }


def pauses_of(rows: PauseRows, group: str) -> list[Paused]:
    """`group`'s pauses in force as `paused` events, oldest first (as `Dispatcher.pauses()`)."""
    events = [paused_event(row) for key, row in rows.items() if key[0] == group]
    return sorted(events, key=lambda event: event.at)
