"""What every benchmark prints beside its figures: percentiles, and the machine they ran on."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from typing import Any


def percentiles(
    seconds: list[float], *, scale: float = 1000.0, digits: int = 2
) -> dict[str, float]:
    """p50/p95/p99/max of durations in seconds, in milliseconds (or times `scale`)."""
    if not seconds:
        return {}
    ordered = sorted(seconds)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * scale, digits)

    return {
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(ordered[-1] * scale, digits),
    }


def p50_max(values: Sequence[float]) -> dict[str, float]:
    """Median and maximum (and count) of a few rounds' seconds, rounded to the millisecond;
    {} when empty (the fault benchmarks: too few rounds for a p95)."""
    if not values:
        return {}
    return {
        "p50": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Where a figure was measured: cores, CPU, Python, and the load average now (a figure
    taken at load 4 on 2 cores is not comparable with one at load 0.5), with the CPU time
    counters that `steal_percent` compares."""
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "cpu_ticks": cpu_ticks(),
    }


def cpu_ticks() -> dict[str, int]:
    """All CPUs' time counters since boot (`/proc/stat`, in clock ticks); empty elsewhere."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return {}
    if not fields or fields[0] != "cpu":
        return {}
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return dict(zip(names, (int(value) for value in fields[1:9]), strict=False))


def steal_percent(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """The share of CPU time the hypervisor gave to other guests between two `machine()`
    readings, in percent (None when not known). This virtual machine's speed varies with
    its neighbours: the same bench measured 3x apart on one day, with steal up to 66%."""
    start: dict[str, int] = before.get("cpu_ticks") or {}
    end: dict[str, int] = after.get("cpu_ticks") or {}
    if "steal" not in start or "steal" not in end:
        return None
    total = sum(end.values()) - sum(start.values())
    if total <= 0:
        return None
    return round(100 * (end["steal"] - start["steal"]) / total, 1)
