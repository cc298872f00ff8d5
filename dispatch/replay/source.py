"""The recorded window, read from the Delta `events` table with delta-rs (no Spark, no JVM).

The admitted events of one dispatcher group (`kind = 'event'`, `admitted`: what passed the
epoch fence, so exactly what the leader's state was made of), in log order (partition,
offset, index in the record), between two times, at the table's latest version or at a
given one (Delta time travel: the history as the fold had written it then).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING

from dispatch.core.events import Event, event_from_dict
from dispatch.delta_sql import query, sql_text

if TYPE_CHECKING:
    from dispatch.warehouse import Warehouse

EVENTS_TABLE = "events"

DEFAULT_TAIL_S = 3600.0
"""How long after the window its jobs' events are still read: a job submitted just before
`until` runs (and so shows how long it runs) after it."""


DEFAULT_WARMUP_S = 600.0
"""How long before `since` jobs are replayed (not reported) so the window starts with the
backlog and busy workers it had."""


class WindowError(ValueError):
    """The window asked for cannot be read (no such table or version, a bad range)."""


def _day(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).date().isoformat()


def window_sql(group: str, since: float | None, until: float | None) -> str:
    """The query of the window's events; the `date` bounds let delta-rs skip partitions."""
    conditions = ["kind = 'event'", "admitted", f"dispatch_group = {sql_text(group)}"]
    if since is not None:
        conditions += [f"at >= {since!r}", f"date >= DATE '{_day(since)}'"]
    if until is not None:
        conditions += [f"at < {until!r}", f"date <= DATE '{_day(until)}'"]
    return (
        'SELECT "partition", "offset", idx, body FROM events WHERE '
        + " AND ".join(conditions)
        + ' ORDER BY "partition", "offset", idx'
    )


def read_events(
    warehouse: Warehouse,
    *,
    group: str,
    since: float | None = None,
    until: float | None = None,
    tail_s: float = DEFAULT_TAIL_S,
    version: int | None = None,
) -> list[Event]:
    """The group's admitted events from `since` to `until + tail_s`, in log order."""
    from deltalake.exceptions import DeltaError, TableNotFoundError

    if since is not None and until is not None and until <= since:
        raise WindowError(f"--until must be after --since ({until!r} <= {since!r})")
    if tail_s < 0:
        raise WindowError(f"--tail-s: expected a number >= 0, got {tail_s!r}")
    try:
        table = warehouse.open(EVENTS_TABLE, version=version)
    except TableNotFoundError:
        raise WindowError(f"no Delta table {warehouse.table(EVENTS_TABLE)}") from None
    except DeltaError as error:
        raise WindowError(f"events table at version {version}: {error}") from None
    end = None if until is None else until + tail_s
    rows = query(table, EVENTS_TABLE, window_sql(group, since, end))
    return [event_from_dict(json.loads(body)) for body in rows.column("body").to_pylist()]
