"""The Delta `limits` table: the runtime limits in force (an operator's limits on a client, an
exec pattern or a concurrency key, set through the API), kept by the streaming fold so that
they survive a failover. The settings' limits (`[dispatcher.limits]`) are not in it: a new
leader has them from its settings.

A row per runtime limit in force: `dispatch_group`, `scope` (`client`, `exec` or `key`),
`target` (the client id, exec pattern, or key or key pattern), the knobs `max_inflight`,
`rate` and `burst` (NULL: not given), and the `limit_set` event's `epoch`, `at`, `by` and
`reason`. A `limit_set` event inserts (or replaces) its row, a `limit_removed` deletes it.

Consistency with the snapshot: exactly as the `pauses` table (`dispatch.delta.pauses`, whose
reasoning this follows). A batch with `limit_set`/`limit_removed` events rewrites the table
whole, before its `jobs` commit, as one Delta commit carrying the batch's `Progress` (and its
`txn`); so the runtime limits in force at a `jobs` snapshot's offsets are those of the newest
`limits` version written by a batch at or before them (`limits_at`), and the fold starts from
that same version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dispatch.core.events import Event, LimitRemoved, LimitSet, event_from_dict
from dispatch.delta import tables as t
from dispatch.delta.pauses import pauses_version, rows_in_force_at

if TYPE_CHECKING:
    import pyarrow as pa

    from dispatch.warehouse import Warehouse

KNOBS = ("max_inflight", "rate", "burst")
"""The knobs of a limit (columns of the table, fields of the `limit_set` event)."""

LimitKey = tuple[str, str, str]
"""(dispatch group, scope, target)."""
LimitRows = dict[LimitKey, dict[str, Any]]
"""The runtime limits in force: their `limits` rows by key."""

limits_version = pauses_version
"""The version of `limits` to read for the limits in force at some offsets: the same rule
as for `pauses` (the newest version a batch at or before them wrote; the latest when only
maintenance committed after it)."""


def limit_row(group: str, event: LimitSet) -> dict[str, Any]:
    """The `limits` row of a runtime limit in force."""
    return {
        "dispatch_group": group,
        "scope": event.scope.value,
        "target": event.target,
        "max_inflight": event.max_inflight,
        "rate": event.rate,
        "burst": event.burst,
        "epoch": event.epoch,
        "at": event.at,
        "by": event.by,
        "reason": event.reason,
    }


def limit_set_event(row: Mapping[str, Any]) -> LimitSet:
    """The `limit_set` event a row holds (validated as the log's events are)."""
    data: dict[str, Any] = {
        "type": LimitSet.type,
        "epoch": row["epoch"],
        "at": row["at"],
        "scope": row["scope"],
        "target": row["target"],
    }
    for name in KNOBS:
        if row.get(name) is not None:
            data[name] = row[name]
    if row.get("by") is not None:
        data["by"] = row["by"]
    if row.get("reason"):
        data["reason"] = row["reason"]
    event = event_from_dict(data)
    if not isinstance(event, LimitSet):  # pragma: no cover - the type is set above
        raise ValueError("limits: not a limit_set event")
    return event


def is_limit_event(event: Event) -> bool:
    return isinstance(event, LimitSet | LimitRemoved)


def apply_limits(rows: LimitRows, events: Iterable[tuple[str, Event]]) -> bool:
    """Apply (group, event) pairs in log order to `rows` (other events are ignored): a
    `limit_set` sets its row, a `limit_removed` removes it. Whether any was either."""
    seen = False
    for group, event in events:
        if isinstance(event, LimitSet):
            rows[(group, event.scope.value, event.target)] = limit_row(group, event)
            seen = True
        elif isinstance(event, LimitRemoved):
            rows.pop((group, event.scope.value, event.target), None)
            seen = True
    return seen


def arrow_limits(rows: LimitRows) -> pa.Table:
    """The table's rows, in key order."""
    return t.arrow_rows(t.LIMITS, [rows[key] for key in sorted(rows)])


def limits_at(warehouse: Warehouse, events_topic: str, offsets: Mapping[int, int]) -> LimitRows:
    """The runtime limits in force once the log is read up to `offsets` (`events_topic`
    partition -> next offset), every group's, from the `limits` table (empty: no table, or no
    runtime limit by then). Read with delta-rs."""
    return rows_in_force_at(warehouse, t.LIMITS, events_topic, offsets)


def limits_of(rows: LimitRows, group: str) -> list[LimitSet]:
    """`group`'s runtime limits in force as `limit_set` events, oldest first (as
    `Dispatcher.limits()`)."""
    events = [limit_set_event(row) for key, row in rows.items() if key[0] == group]
    return sorted(events, key=lambda event: event.at)
