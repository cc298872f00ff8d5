"""The limits of what may enter the dispatcher from outside, and the check of a JSON value.

Everything that enters (a REST body, a `dispatch.submit` record, a WebSocket message) is
checked against these bounds at the edge, so that nothing downstream — the events log, the
Delta fold, a read, a worker's poll — ever meets a value it cannot encode, store or read back.
Pure and standard library only: the core and the edges share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeAlias, cast

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects in a payload or a result (`[]` is 1 deep).

Why 32: real payloads are a few levels deep, so 32 never refuses honest data; and a value
this deep stays far below every recursive consumer it will meet later, with the envelope of
the event or record around it: CPython's json (C) encoder/decoder and pydantic recurse per
level (the interpreter limit is 1,000), orjson and Spark's JSON functions stop near 255, and
a job's payload sits a few levels inside an `enqueued` event, a snapshot and a Delta row."""

MAX_ID_LENGTH = 128
"""Longest job, client or worker id (the submit format in the README says 128)."""

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# Where a value sits, built only when there is an error to name: (parent, key) links.
_Path: TypeAlias = tuple["_Path | None", str | int] | None


def check_json_value(value: object, *, label: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError, naming where (`payload.a[3]: ...`), unless `value` is plain JSON.

    Plain JSON: None, bool, str, an int within signed 64 bits (what every consumer stores),
    a finite float (NaN and Infinity are not JSON: they would be written as `null` or break a
    strict reader), lists (or tuples) and dicts with str keys, nested at most `max_depth`
    deep. Iterative on purpose: a 50,000-deep value is refused, never a RecursionError.
    """
    if type(value) is not dict and not isinstance(value, _CONTAINERS):
        _check_scalar(value, label, None)
        return
    # Containers still to walk: (container, its depth, where it is); `[]` at the top is 1.
    stack: list[tuple[object, int, _Path]] = [(value, 1, None)]
    while stack:
        container, depth, path = stack.pop()
        if depth > max_depth:
            # Named by the label alone: the path down would be `max_depth` steps of noise.
            raise ValueError(f"{label}: nested deeper than {max_depth} levels")
        children: Iterable[tuple[str | int, object]]
        if type(container) is dict or isinstance(container, Mapping):
            for key in container:
                if not isinstance(key, str):
                    raise ValueError(f"{_where(label, path)}: object key {key!r} is not a string")
            children = container.items()
        else:
            children = enumerate(cast("list[object] | tuple[object, ...]", container))
        for key, child in children:
            # What json.loads makes, by exact type and inline: this runs once per value
            # submitted, and an isinstance against the Mapping ABC is slow.
            if type(child) is str or child is None or type(child) is bool:
                continue
            if type(child) is int:
                if _INT64_MIN <= child <= _INT64_MAX:
                    continue
            elif type(child) is float:
                if math.isfinite(child):
                    continue
            elif type(child) is dict or type(child) is list or isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1, (path, key)))
                continue
            _check_scalar(child, label, (path, key))


_CONTAINERS = (list, tuple, Mapping)


def _check_scalar(item: object, label: str, path: _Path) -> None:
    if item is None or isinstance(item, bool | str):
        return
    if isinstance(item, int):
        if not _INT64_MIN <= item <= _INT64_MAX:
            raise ValueError(
                f"{_where(label, path)}: integer outside signed 64 bits "
                f"({_INT64_MIN}..{_INT64_MAX})"
            )
        return
    if isinstance(item, float):
        if not math.isfinite(item):
            literal = "NaN" if math.isnan(item) else ("Infinity" if item > 0 else "-Infinity")
            raise ValueError(f"{_where(label, path)}: {literal} is not JSON")
        return
    raise ValueError(f"{_where(label, path)}: {type(item).__name__} is not a JSON value")


def _where(label: str, path: _Path) -> str:
    """`label` followed by the keys and indexes from the root down to `path`."""
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else f".{_short(key)}")
    return label + "".join(reversed(parts))


def _short(key: str) -> str:
    # A key may be as long as the payload: an error message names only its start.
    return key if len(key) <= 40 else key[:40] + "..."
