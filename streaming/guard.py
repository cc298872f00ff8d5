"""What the Delta tables can hold: the checks the fold makes before it builds Arrow rows.

Every record of the three topics is untrusted input: the leader writes `dispatch.events`, but
any producer with access to the broker can write there too, and a leader older than the edge's
bounds (`dispatch.core.bounds`) may have logged values no table column can hold. A value that
does not fit its column would make pyarrow raise while the batch is being written, the batch
would fail, and the replayed batch would fail the same way: the query would stop for good. So
the fold checks, before building any Arrow array, that what it is about to write fits:

- `header_problem` / `event_problem`: a record's group and epoch, and each event's values that
  reach a table, against the column each lands in (an `enqueued` with `max_attempts` 2**31
  is a valid event for the core, but `jobs.max_attempts` is an `int32`), its time against
  what a date column holds, its payload or result against plain JSON. They depend on the
  event alone, not on any job's state, so the fold only ever meets writable values;
- `row_problem`: any row against a table's Arrow schema (used for the rare rows built from
  records of other formats, e.g. a rejection record).

A record or event that fails is skipped and recorded (`rejected` table), never raised.
Standard library, pyarrow's type objects and the core's bounds only; no Spark, no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import fields
from operator import attrgetter
from typing import Any

import pyarrow as pa

from dispatch.core.bounds import check_json_value
from dispatch.core.events import (
    EVENT_TYPES,
    Completed,
    Enqueued,
    Event,
    LimitRemoved,
    LimitSet,
    Paused,
    Resumed,
)
from dispatch.delta import tables as t

MIN_TIME_S = 0.0
"""Earliest event time the tables take (1970-01-01): the leader writes the current time, so an
earlier one can only come from a hostile or broken producer (and old dates are where readers'
calendar rebasing rules differ)."""
MAX_TIME_S = 253_402_214_400.0
"""Latest event time the tables take (9999-12-31T00:00Z): an event's time becomes a `date`
partition, a timestamp column and a statistics minute, none of which go past year 9999."""
MAX_JSON_DEPTH = 100
"""Deepest payload or result the fold writes. Above the edge's bound
(`dispatch.core.bounds.MAX_JSON_DEPTH`, so anything a bounded leader logs passes), far below
CPython's recursion limit, which the fold's own `json.dumps` / `json.loads` of the event and of
the `jobs` row (a few levels deeper) must stay under."""
MAX_KEPT_BYTES = 64 * 1024
"""Most bytes of a refused record kept in `rejected.value` and `events.raw`: enough to see what
it was; the whole record stays in Kafka at the recorded offset for the topic's retention."""
MAX_REASON_CHARS = 4096
"""Longest reason kept (a record of thousands of bad events names the first ones)."""

_INT_RANGES: dict[pa.DataType, tuple[int, int]] = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
}


def utf8(text: str) -> bool:
    """True if `text` can be written as UTF-8 (a lone surrogate, which JSON's `\\ud800`
    escape produces, cannot: pyarrow raises UnicodeEncodeError)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def bounded(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def kept_bytes(raw: bytes | None) -> bytes | None:
    """The first MAX_KEPT_BYTES of a refused record."""
    return None if raw is None else raw[:MAX_KEPT_BYTES]


def kept_text(raw: bytes | None) -> str | None:
    """The kept bytes as text if they are UTF-8 (a cut in the middle of a character at the
    end of the kept bytes is dropped), else None."""
    kept = kept_bytes(raw)
    if kept is None:
        return None
    for cut in range(4 if len(kept) < len(raw or b"") else 1):
        try:
            return kept[: len(kept) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


# --- values of one event ----------------------------------------------------------------------


def json_problem(value: Any, label: str) -> str | None:
    """Why `value` (decoded from a record) is not plain JSON the tables keep as text: NaN or
    Infinity, an integer outside 64 bits, nesting deeper than MAX_JSON_DEPTH, or None.

    A walk without the paths `dispatch.core.bounds.check_json_value` keeps to name where the
    problem is (it runs for every payload and result of a batch); the rare bad value is
    walked again by that function for its message."""
    kind = type(value)
    if value is None or kind is str or kind is bool:
        return None
    low, high = _INT_RANGES[pa.int64()]
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if low <= item <= high:
                continue
        elif kind is float:
            if item - item == 0.0:  # finite: inf - inf and NaN - NaN are NaN
                continue
        elif kind is dict:
            if depth < MAX_JSON_DEPTH and all(type(key) is str for key in item):
                for child in item.values():
                    push((child, depth + 1))
                continue
        elif kind is list and depth < MAX_JSON_DEPTH:
            for child in item:
                push((child, depth + 1))
            continue
        break
    else:
        return None
    try:
        check_json_value(value, label=label, max_depth=MAX_JSON_DEPTH)
    except ValueError as error:
        return str(error)
    return f"{label}: not plain JSON"  # a type json.loads never makes (tuple, subclass...)


def header_problem(group: str, epoch: int) -> str | None:
    """Why an events record's group or epoch cannot be written, or None."""
    if not utf8(group):
        return "events record.group: not valid Unicode (a lone surrogate)"
    low, high = _INT_RANGES[pa.int64()]
    if not low <= epoch <= high:
        return f"events record.epoch: {_short(epoch)} does not fit int64"
    return None


# --- rows --------------------------------------------------------------------------------------

_Check = Callable[[Any], bool]


def _fits_string(value: Any) -> bool:
    return isinstance(value, str) and utf8(value)


def _fits_binary(value: Any) -> bool:
    return isinstance(value, bytes | bytearray)


def _fits_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if type(value) is not int:
        return False
    return abs(value) <= 2**1023


def _fits_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _fits_date(value: Any) -> bool:
    return isinstance(value, dt.date) and not isinstance(value, dt.datetime)


def _fits_time(value: Any) -> bool:
    return isinstance(value, dt.datetime)


def _int_check(kind: pa.DataType) -> _Check:
    low, high = _INT_RANGES[kind]
    return lambda value: type(value) is int and low <= value <= high


def _check_of(kind: pa.DataType) -> _Check:
    if kind in _INT_RANGES:
        return _int_check(kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _fits_string
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _fits_binary
    if pa.types.is_floating(kind):
        return _fits_float
    if pa.types.is_boolean(kind):
        return _fits_bool
    if pa.types.is_date(kind):
        return _fits_date
    if pa.types.is_timestamp(kind):
        return _fits_time
    raise TypeError(f"no check for Arrow type {kind}")  # a new column type: add its check


def _schema_checks(schema: pa.Schema) -> dict[str, tuple[pa.DataType, _Check]]:
    checks = {}
    for field in schema:
        if pa.types.is_map(field.type) or pa.types.is_list(field.type):
            continue  # statistics histograms: computed, never taken from a record
        checks[field.name] = (field.type, _check_of(field.type))
    return checks


_TABLE_CHECKS = {name: _schema_checks(schema) for name, schema in t.SCHEMAS.items()}


def row_problem(table: str, row: Mapping[str, Any]) -> str | None:
    """Why `row` does not fit `table`'s Arrow schema (None, the absent columns' value, always
    fits: every column is nullable), or None."""
    for name, (kind, fits) in _TABLE_CHECKS[table].items():
        value = row.get(name)
        if value is not None and not fits(value):
            return f"{table}.{name}: {_short(value)} does not fit {kind}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- events --------------------------------------------------------------------------------------

_EVENT_COLUMNS: dict[str, tuple[str, str]] = {
    "epoch": (t.EVENTS, "epoch"),
    "job_id": (t.JOBS, "id"),
    "worker_id": (t.JOBS, "worker_id"),
    "client_id": (t.JOBS, "client_id"),
    "exec": (t.JOBS, "exec"),
    "attempt": (t.JOBS, "attempts"),
    "max_attempts": (t.JOBS, "max_attempts"),
    "priority": (t.JOBS, "priority"),
    "seq": (t.JOBS, "seq"),
    "lease": (t.JOBS, "lease"),
    "error": (t.JOBS, "error"),
    "key": (t.JOBS, "key"),
}
"""The event fields the fold writes as they are, and the column each lands in (`events` or
the job's `jobs` row). A job's row holds nothing but these, the event's time, its JSON and the
core's enums, so events that pass `event_problem` always fold into rows that fit. The other
fields need no check: numbers are finite floats (`event_from_dict` checks), which any double
column holds, and the rest reach a table only inside the event's JSON (`events.body`, ASCII)."""

_PAUSE_COLUMNS: dict[str, tuple[str, str]] = {
    "target": (t.PAUSES, "target"),
    "by": (t.PAUSES, "by"),
    "reason": (t.PAUSES, "reason"),
}
"""The fields of `paused` and `resumed` events the `pauses` table holds as they are."""

_LIMIT_COLUMNS: dict[str, tuple[str, str]] = {
    "target": (t.LIMITS, "target"),
    "max_inflight": (t.LIMITS, "max_inflight"),
    "burst": (t.LIMITS, "burst"),
    "by": (t.LIMITS, "by"),
    "reason": (t.LIMITS, "reason"),
}
"""The fields of `limit_set` and `limit_removed` events the `limits` table holds as they are
(`rate` is a finite float, which its double column holds)."""


def _columns_of(cls: type[Event]) -> dict[str, tuple[str, str]]:
    if cls in (Paused, Resumed):
        return {**_EVENT_COLUMNS, **_PAUSE_COLUMNS}
    if cls in (LimitSet, LimitRemoved):
        return {**_EVENT_COLUMNS, **_LIMIT_COLUMNS}
    return _EVENT_COLUMNS


_EventCheck = tuple[str, str, pa.DataType, _Check]
_EVENT_CHECKS: dict[type[Event], tuple[_EventCheck, ...]] = {
    cls: tuple(
        (f.name, f"{table}.{column}", *_TABLE_CHECKS[table][column])
        for f in fields(cls)
        if f.name in columns
        for table, column in [columns[f.name]]
    )
    for cls in EVENT_TYPES.values()
    for columns in [_columns_of(cls)]
}
_JSON_FIELDS: dict[type[Event], str] = {Enqueued: "payload", Completed: "result"}


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]] | None:
    """One C call for the fields' values, always as a tuple (attrgetter of one name gives
    the bare value, so a single name is asked for twice)."""
    if not names:
        return None
    return attrgetter(*names) if len(names) > 1 else attrgetter(names[0], names[0])


def _fast_checks(
    checks: tuple[_EventCheck, ...],
) -> tuple[
    Callable[[Any], tuple[Any, ...]] | None,
    Callable[[Any], tuple[Any, ...]] | None,
    Callable[[Any], tuple[Any, ...]] | None,
]:
    by_kind: dict[str, list[str]] = {"int32": [], "int64": [], "string": []}
    for name, _, arrow_type, _ in checks:
        by_kind[str(arrow_type)].append(name)
    return _getter(by_kind["int32"]), _getter(by_kind["int64"]), _getter(by_kind["string"])


_FAST_CHECKS = {cls: _fast_checks(checks) for cls, checks in _EVENT_CHECKS.items()}
_INT32_LOW, _INT32_HIGH = _INT_RANGES[pa.int32()]
_INT64_LOW, _INT64_HIGH = _INT_RANGES[pa.int64()]


def event_problem(event: Event) -> str | None:
    """Why `event`'s values cannot be written (its `events` row, its job's `jobs` row), or
    None. Runs for every event of a batch, so the common case is a handful of C calls: the
    fields of each column type fetched at once, integers checked by their min and max,
    strings by whether their concatenation is ASCII; anything else takes the field-by-field
    check, which also names the field."""
    at = event.at
    if not MIN_TIME_S <= at <= MAX_TIME_S:
        return f"{event.type}.at: {at!r} is not a time the tables hold (1970 to 9999)"
    kind = type(event)
    fast = _FAST_CHECKS.get(kind)
    if fast is None:
        return _field_problem(event)
    int32s, int64s, strings = fast
    try:
        if int32s is not None:
            values = int32s(event)
            if min(values) < _INT32_LOW or max(values) > _INT32_HIGH:
                return _field_problem(event)
        if int64s is not None:
            values = int64s(event)
            if min(values) < _INT64_LOW or max(values) > _INT64_HIGH:
                return _field_problem(event)
        if strings is not None and not "".join(filter(None, strings(event))).isascii():
            problem = _field_problem(event)
            if problem is not None:
                return problem
    except TypeError:  # not an int, or not a str: an event not made by event_from_dict
        return _field_problem(event)
    json_field = _JSON_FIELDS.get(kind)
    if json_field is None:
        return None
    return json_problem(getattr(event, json_field), f"{event.type}.{json_field}")


def _field_problem(event: Event) -> str | None:
    for name, column, arrow_type, fits in _EVENT_CHECKS.get(type(event), ()):
        value = getattr(event, name)
        if value is not None and not fits(value):
            return f"{event.type}.{name}: {_short(value)} does not fit {column} ({arrow_type})"
    json_field = _JSON_FIELDS.get(type(event))
    if json_field is None:
        return None
    return json_problem(getattr(event, json_field), f"{event.type}.{json_field}")
