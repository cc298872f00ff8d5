"""The freshness run's windows: jobs submitted, assigned and completed per second, counted
from the events read back from the log, and the verdict on who could not keep up.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dispatch.bench import stats
from dispatch.core.events import Assigned, Completed, Enqueued

WINDOW_S = 10.0

KEEP_UP = 0.95
"""A measured rate more than 5% below the one it should equal is a shortfall."""

EMULATOR_LATE_S = 1.0
"""An emulator lag (or a wait for the broker's acknowledgement) beyond this is reported."""

FOLD_CATCH_UP_S = 10.0
"""A fold that keeps up reads the rest within a few batches after the load stops."""
CATCH_UP_WAIT_S = 120.0
"""How long the bench waits for the fold to read the rest after the load stops."""


def percentiles(values: list[float]) -> dict[str, float]:
    """`dispatch.bench.stats.percentiles` in seconds, with the sample count."""
    if not values:
        return {}
    return {**stats.percentiles(values, scale=1.0, digits=3), "n": len(values)}


COUNTED = {Enqueued.type: "submitted", Assigned.type: "assigned", Completed.type: "completed"}
"""The event types counted, and what they count."""

SeenEvent = tuple[str, float, float | None]
"""(type, at, when it became visible in `jobs`, None if never) of one job event."""


@dataclass
class Window:
    """One window of the measured run."""

    start_s: float
    """From the start of the measured run."""
    length_s: float
    jobs: dict[str, int]
    """Jobs submitted, assigned and completed in the window."""
    submitted_per_s: float
    assigned_per_s: float
    completed_per_s: float
    freshness_s: dict[str, float]
    """Of the job events of the window (by their `at`)."""
    not_visible: int
    """Job events of the window no `jobs` commit covered."""
    emulator_lag_max_s: float = 0.0
    """The longest a job of the window waited past its due time to be submitted."""
    write_p95_s: float = 0.0
    """How long the emulator's events records of the window took to be acknowledged."""


def windows_of(
    events: Iterable[SeenEvent], start: float, end: float, window_s: float = WINDOW_S
) -> list[Window]:
    """The job events with `start <= at < end`, counted and measured per `window_s` (the last
    window may be shorter)."""
    count = max(1, math.ceil((end - start) / window_s))
    counts: Counter[tuple[int, str]] = Counter()
    samples: list[list[float]] = [[] for _ in range(count)]
    hidden = [0] * count
    for kind, at, visible in events:
        if not start <= at < end:
            continue
        index = min(count - 1, int((at - start) // window_s))
        name = COUNTED.get(kind)
        if name is not None:
            counts[index, name] += 1
        if visible is None:
            hidden[index] += 1
        else:
            samples[index].append(visible - at)
    out = []
    for index in range(count):
        length = min(window_s, end - start - index * window_s)
        jobs = {name: counts[index, name] for name in COUNTED.values()}
        per_s = {name: round(n / length, 1) for name, n in jobs.items()}
        out.append(
            Window(
                start_s=index * window_s,
                length_s=round(length, 3),
                jobs=jobs,
                submitted_per_s=per_s["submitted"],
                assigned_per_s=per_s["assigned"],
                completed_per_s=per_s["completed"],
                freshness_s=percentiles(samples[index]),
                not_visible=hidden[index],
            )
        )
    return out


def add_emulator_lag(
    windows: list[Window],
    ticks: Sequence[Sequence[float]],
    written: Sequence[Sequence[float]],
    start: float,
) -> None:
    """Each window's worst emulator lag and p95 write time, from the emulator's stats."""
    for window in windows:
        begin, end = start + window.start_s, start + window.start_s + window.length_s
        lags = [tick[1] for tick in ticks if begin <= tick[0] < end]
        writes = [item[1] for item in written if begin <= item[0] < end]
        window.emulator_lag_max_s = round(max(lags, default=0.0), 3)
        window.write_p95_s = percentiles(writes).get("p95", 0.0)


def shortfalls(
    rate_asked: float,
    submitted_per_s: float,
    assigned_per_s: float,
    completed_per_s: float,
    windows: Sequence[Window],
    emulator_lag_max_s: float,
    emulator_write_p95_s: float,
    fold_catch_up_s: float | None,
) -> list[str]:
    """Every way the run fell short of the rate asked for, each saying who could not keep
    up; [] when none did."""
    out = []
    emulator = "the emulator could not keep up"
    late = emulator_lag_max_s > EMULATOR_LATE_S
    if submitted_per_s < KEEP_UP * rate_asked:
        out.append(f"submitted {submitted_per_s:.0f}/s < {rate_asked:.0f}/s asked: {emulator}")
    if late:
        out.append(
            f"{emulator}: jobs were submitted up to {emulator_lag_max_s:.2f} s after their "
            "due time (the load came in bursts, the acks late)"
        )
    if emulator_write_p95_s > EMULATOR_LATE_S:
        out.append(
            f"{emulator}: its records took {emulator_write_p95_s:.2f} s (p95) to reach the "
            "broker, and freshness includes that wait"
        )
    for name, value in (("assigned", assigned_per_s), ("completed", completed_per_s)):
        if value < KEEP_UP * submitted_per_s:
            why = "its ticks fell behind" if late else "its core's cap or credit limited it"
            out.append(
                f"{name} {value:.0f}/s < {submitted_per_s:.0f}/s submitted: {emulator} ({why})"
            )
    short = [
        f"{w.start_s:g} s"
        for w in windows
        if min(w.assigned_per_s, w.completed_per_s) < KEEP_UP * w.submitted_per_s
    ]
    if short:
        out.append(
            f"windows where assigned or completed/s < 95% of submitted/s: {', '.join(short)}"
        )
    if fold_catch_up_s is None or fold_catch_up_s > FOLD_CATCH_UP_S:
        needed = f"over {CATCH_UP_WAIT_S:g}" if fold_catch_up_s is None else f"{fold_catch_up_s:g}"
        out.append(
            f"the fold could not keep up: it needed {needed} s after the emulator stopped to "
            "read the rest"
        )
    measured = [w.freshness_s["p50"] for w in windows if w.freshness_s]
    if len(measured) >= 2 and measured[-1] > 2 * measured[0] + 1.0:
        out.append(
            f"the fold fell behind: freshness p50 grew from {measured[0]:.2f} s (first "
            f"window) to {measured[-1]:.2f} s (last)"
        )
    return out
