"""A running job's progress: what its worker reports with a heartbeat (`{done, total,
message}`), bounded, and kept on the job with the time it was decided (`at`).

The log keeps at most one report per job per `PROGRESS_EVERY_S`: a heartbeat that brings one
sooner after the last is applied without it (the worker sends its latest again with its next
heartbeat, so the last word is not lost for long).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatch.core import _validate as v

PROGRESS_EVERY_S = 1.0
"""Least time between two progress reports the log keeps for one job."""
MAX_PROGRESS_MESSAGE = 200
"""Longest progress message (characters)."""
MAX_PROGRESS_NUMBER = 1e15
"""Largest `done` or `total` (far above any count, inside what a float holds exactly)."""

_FIELDS = frozenset({"done", "total", "message"})
_STORED = frozenset({*_FIELDS, "at"})


def check_progress(value: Any, label: str = "progress") -> dict[str, Any]:
    """A worker's report, validated (ValueError naming the field): `done` a number >= 0,
    `total` a number >= 0 or null, `message` a string of at most MAX_PROGRESS_MESSAGE
    characters or null; the fields left out are null. Returns a new plain dict."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{label}: expected a JSON object, got {type(value).__name__}")
    v.check_keys(value, _FIELDS, label)
    done = _number(v.field_value(value, "done", label), f"{label}.done")
    total = value.get("total")
    if total is not None:
        total = _number(total, f"{label}.total")
    message = value.get("message")
    if message is not None:
        message = v.as_str(message, f"{label}.message")
        if len(message) > MAX_PROGRESS_MESSAGE:
            raise ValueError(f"{label}.message: longer than {MAX_PROGRESS_MESSAGE} characters")
    return {"done": done, "total": total, "message": message}


def stored_progress(value: Any, label: str = "job.progress") -> dict[str, Any] | None:
    """A record's progress (a report and its `at`), validated; None stays None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"{label}: expected a JSON object, got {type(value).__name__}")
    v.check_keys(value, _STORED, label)
    report = check_progress({k: value[k] for k in _FIELDS if k in value}, label)
    report["at"] = v.as_number(v.field_value(value, "at", label), f"{label}.at")
    return report


def _number(value: Any, label: str) -> float:
    number = float(v.as_number(value, label, non_negative=True))
    if number > MAX_PROGRESS_NUMBER:
        raise ValueError(f"{label}: expected a number <= {MAX_PROGRESS_NUMBER:g}")
    return number
