"""What an idle stack costs: the CPU each of its processes uses while nothing happens.

    .venv/bin/python -m dispatch.bench.idle_bench [--seconds 30] [--streaming] [--workers N]

Starts a local stack on a temporary folder and free ports (`LocalStack.up`, what
`dispatch up --detach` runs: a broker, a leader and a standby node, with `--streaming` the
fold, with `--workers` demo workers), lets it settle, then reads each process's CPU time
(user + system, from /proc, its child processes included) at the start and at the end of
`--seconds` with nothing submitted, and prints it as a share of one core. The stack is
stopped by its pids whatever happens. A job queue mostly waits: what it burns then is taken
from the jobs beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from dispatch.bench.signals import sigterm_unwinds
from dispatch.settings import Settings, load_settings
from dispatch.stack.local import LocalStack
from dispatch.stack.plan import StackPlan
from dispatch.stack.ports import free_port
from dispatch.stack.process import proc_stat

SETTLE_S = 10.0
"""Left to the stack after `up` returns: the standby's first lease reads, the broker's
start-up compilations."""
SETTLE_WITH_FOLD_S = 60.0
"""The fold's JVM takes longer: 1.6 cores over its first 20 s, 0.3 over the next 20, then
about 4% of a core (measured 2026-11-27)."""


def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """User + system CPU time of each running process and its living descendants (threads
    included): `dispatch streaming` is a Python process whose Spark JVM is its child. One
    walk of /proc for them all."""
    stats = {int(entry.name): proc_stat(int(entry.name)) for entry in Path("/proc").iterdir()
             if entry.name.isdigit()}  # fmt: skip
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    ticks = os.sysconf("SC_CLK_TCK")
    totals = {}
    for root in pids:
        total, todo = 0.0, [root]
        while todo:
            current = todo.pop()
            todo += children.get(current, [])
            if (fields := stats.get(current)) is not None:
                total += (int(fields[11]) + int(fields[12])) / ticks
        totals[root] = total
    return totals


def _role(stack: LocalStack, name: str) -> str:
    """A node's name says which it is now: the leader or a standby."""
    for node in stack.nodes:
        if node.process.name == name:
            answer = httpx.get(f"{node.url}/readyz", timeout=5).json()
            return f"{name} ({answer['role']})"
    return name


def measure(
    settings: Settings, plan: StackPlan, seconds: float, settle_s: float
) -> dict[str, float]:
    """Percent of one core per process of an idle stack."""
    stack = LocalStack(settings, plan)
    try:
        stack.up()
        time.sleep(settle_s)
        pids = {status.name: status.pid for status in stack.status() if status.pid is not None}
        roles = {name: _role(stack, name) for name in pids}
        before = cpu_seconds(pids.values())
        started = time.monotonic()
        time.sleep(seconds)
        after = cpu_seconds(pids.values())
        elapsed = time.monotonic() - started
    finally:
        stack.down()
    return {roles[name]: 100 * (after[pid] - before[pid]) / elapsed for name, pid in pids.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--streaming", action="store_true", help="run the fold too")
    parser.add_argument("--workers", type=int, default=0, help="demo workers to run")
    args = parser.parse_args(argv)
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="idle-bench-") as scratch:
        var = Path(scratch) / "var"
        settings = load_settings(
            paths={"var": str(var), "warehouse": str(var / "delta")},
            kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
            api={"ports": [free_port(), free_port()]},
        )
        plan = StackPlan(streaming=args.streaming, workers=args.workers)
        settle_s = SETTLE_WITH_FOLD_S if args.streaming else SETTLE_S
        shares = measure(settings, plan, args.seconds, settle_s)
    for name, share in sorted(shares.items()):
        print(f"{name:32} {share:5.1f}% of a core")
    print(json.dumps({"seconds": args.seconds, "percent_of_a_core": shares}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
