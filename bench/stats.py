"""What every benchmark prints beside its figures: percentiles, and the machine they ran on."""

from __future__ import annotations

import os
import platform
from typing import Any


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50/p95/p99/max of durations in seconds, in milliseconds."""
    if not seconds:
        return {}
    ordered = sorted(seconds)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 2)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": round(ordered[-1] * 1000, 2)}


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
    taken at load 4 on 2 cores is not comparable with one at load 0.5)."""
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }
