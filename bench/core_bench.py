"""Micro-benchmark of the pure dispatcher core (no Kafka, Spark or HTTP).

    .venv/bin/python -m dispatch.bench.core_bench            # everything, about 2-4 minutes
    .venv/bin/python -m dispatch.bench.core_bench --quick    # small sizes, a smoke run
    .venv/bin/python -m dispatch.bench.core_bench --json     # one JSON object instead of text
    .venv/bin/python -m dispatch.bench.core_bench --limits-only   # the baseline and limits rows
    .venv/bin/python -m dispatch.bench.core_bench --limits-only --limits-breakdown  # + one by one

What it measures, on one core:
- baseline: the simplest loop a queue could be (dict insert + deque append/popleft + dict
  delete per job), so the other figures have a reference from the same run;
- cycles: submit + assign + ack per second, one command per call (`submit`, `ack`), then
  batched (`submit_many`, `ack_many`, 100 jobs per call), and a mixed workload (4 exec
  queues, 50 clients, 8 workers); the first two again with the cyclic GC's thresholds
  raised (jobs are long-lived objects; the default thresholds rescan them often);
- limits: the per-call and batched cycles again over many tenants and concurrency keys
  (10,000 clients, 100,000 keys, 4 execs; a virtual clock 0.1 ms a job), with runtime limits
  in force (a rate limit on every tenant, from the settings; `max_inflight` 1 on every key,
  the `*` key pattern; a shared `max_inflight` on the `*.run` execs) and without any (the
  same jobs, keys and clock), run in turn, so the ratio of the two is from one run; every
  limit has room, so each job still starts at its submit: the figure is what checking the
  limits costs, not waiting on them;
- tick: the cost of `tick(now)` holding 1M queued and 100k running jobs, when nothing is due
  and when 1,000 deadlines pass at once (each requeued, or reassigned to a worker with room);
- memory: the RSS of a fresh process holding 1M queued jobs.

Times are CPU time of this (single-threaded) process, `time.process_time()`, so that other
processes on a shared machine inflate them less than wall time would; the core never waits
on anything, so on a dedicated core wall time equals CPU time. Sizes and repeat counts are
fixed so that runs compare; each figure is the best of its repeats.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from dispatch.bench import stats
from dispatch.core import Assigned, CoreConfig, Dispatcher, Limit, SubmitRequest

T0 = 1_700_000_000.0
BIG_CAP = 10**9
GC_TUNED = (100_000, 50, 100)


def machine() -> dict[str, Any]:
    return {**stats.machine(), "implementation": platform.python_implementation()}


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def requests(n: int, prefix: str = "job", execs: int = 1, clients: int = 1) -> list[SubmitRequest]:
    return [
        SubmitRequest(
            id=f"{prefix}-{i:08d}",
            exec=f"exec{i % execs}.run",
            payload={"n": i},
            client_id=f"client{i % clients}",
        )
        for i in range(n)
    ]


# --- baseline --------------------------------------------------------------------------------


def bench_baseline(n: int) -> float:
    """Seconds per job of the simplest possible queue loop."""
    keys = [f"job-{i:08d}" for i in range(n)]

    def run() -> float:
        table: dict[str, int] = {}
        queue: deque[str] = deque()
        started = time.process_time()
        for i, key in enumerate(keys):
            table[key] = i
            queue.append(key)
            del table[queue.popleft()]
        return (time.process_time() - started) / n

    return best_of(3, run)


# --- cycles ----------------------------------------------------------------------------------


def fresh(workers: int = 1, subjects: str = "job.assign.>") -> Dispatcher:
    dispatcher = Dispatcher(CoreConfig(default_cap=BIG_CAP, worker_expiry_s=None))
    for w in range(workers):
        dispatcher.join(f"w{w}", [subjects], T0)
        dispatcher.grant_credit(f"w{w}", 1_000_000, T0)
    return dispatcher


def bench_cycles_per_call(n: int) -> float:
    """Seconds per submit+assign+ack cycle, one command per call."""
    batch = requests(n)

    def run() -> float:
        dispatcher = fresh()
        submit, ack = dispatcher.submit, dispatcher.ack
        now = T0
        started = time.process_time()
        for request in batch:
            assigned = submit(request, now)[-1]
            assert isinstance(assigned, Assigned)
            ack(assigned.job_id, assigned.attempt, assigned.lease, now, result=None)
        return (time.process_time() - started) / n

    return best_of(3, run)


def bench_cycles_batched(
    n: int, size: int = 100, workers: int = 1, execs: int = 1, clients: int = 1
) -> float:
    """Seconds per cycle with submit_many/ack_many of `size` jobs per call."""
    batch = requests(n, execs=execs, clients=clients)
    chunks = [batch[i : i + size] for i in range(0, n, size)]

    def run() -> float:
        dispatcher = fresh(workers)
        now = T0
        started = time.process_time()
        for chunk in chunks:
            events = dispatcher.submit_many(chunk, now)
            acks = [
                (event.job_id, event.attempt, event.lease, None)
                for event in events
                if type(event) is Assigned
            ]
            done, rejected = dispatcher.ack_many(acks, now)
            assert not rejected and len(done) >= len(chunk)
        return (time.process_time() - started) / n

    return best_of(3, run)


def bench_cycles_mixed(n: int) -> float:
    """Per-call cycles with 4 exec queues, 50 clients and 8 workers with 32 jobs in flight."""
    batch = requests(n, execs=4, clients=50)

    def run() -> float:
        dispatcher = fresh(workers=8)
        inflight: deque[Assigned] = deque()
        now = T0
        started = time.process_time()
        for request in batch:
            for event in dispatcher.submit(request, now):
                if type(event) is Assigned:
                    inflight.append(event)
            while len(inflight) > 32:
                done = inflight.popleft()
                for event in dispatcher.ack(done.job_id, done.attempt, done.lease, now):
                    if type(event) is Assigned:
                        inflight.append(event)
        return (time.process_time() - started) / n

    return best_of(3, run)


# --- limits ----------------------------------------------------------------------------------

LIMIT_TENANTS = 10_000
LIMIT_KEYS = 100_000
LIMIT_EXECS = 4
LIMIT_STEP_S = 1e-4
"""Virtual seconds between two jobs' submits: each tenant submits every
`tenants * LIMIT_STEP_S` s (1 s at full size), well within its rate limit."""
TENANT_RATE = 50.0
"""Each tenant's rate limit (starts per second, burst 50) when limits are on."""
EXEC_MAX_INFLIGHT = 1_000
"""The `*.run` exec limit's shared `max_inflight` when limits are on."""


def limit_requests(n: int, tenants: int, keys: int) -> list[SubmitRequest]:
    """`n` jobs over `tenants` clients, `keys` concurrency keys and 4 execs, round-robin."""
    return [
        SubmitRequest(
            id=f"job-{i:08d}",
            exec=f"exec{i % LIMIT_EXECS}.run",
            payload={"n": i},
            client_id=f"tenant{i % tenants:05d}",
            key=f"account:{i % keys}",
        )
        for i in range(n)
    ]


LIMIT_KINDS = ("client", "key", "exec")


def limited(tenants: int, on: bool | str) -> Dispatcher:
    """One worker with ample credit; with `on`, a rate limit on every tenant (settings), one
    running job per key (`*`, runtime) and a shared cap on the `*.run` execs (runtime); `on`
    one of LIMIT_KINDS: that one alone."""
    kinds = set(LIMIT_KINDS) if on is True else set() if on is False else {on}
    client_limits = (
        {f"tenant{t:05d}": Limit.checked(rate=TENANT_RATE) for t in range(tenants)}
        if "client" in kinds
        else {}
    )
    dispatcher = Dispatcher(
        CoreConfig(
            default_cap=BIG_CAP,
            worker_expiry_s=None,
            limits={"client": client_limits} if client_limits else {},
        )
    )
    dispatcher.join("w0", ["job.assign.>"], T0)
    dispatcher.grant_credit("w0", 1_000_000, T0)
    if "key" in kinds:
        dispatcher.set_limit("key", "*", T0, max_inflight=1)
    if "exec" in kinds:
        dispatcher.set_limit("exec", "*.run", T0, max_inflight=EXEC_MAX_INFLIGHT)
    return dispatcher


def check_limits_hold(dispatcher: Dispatcher, on: bool | str, now: float) -> None:
    """After a timed run: the limits that were on hold what exceeds them (AssertionError if
    not), so a core that skipped a check cannot pass for a cheap one."""
    kinds = set(LIMIT_KINDS) if on is True else set() if on is False else {on}

    def started(job_id: str, client: str, key: str) -> bool:
        request = SubmitRequest(
            id=job_id, exec="exec0.run", payload=None, client_id=client, key=key
        )
        return any(type(event) is Assigned for event in dispatcher.submit(request, now))

    if "key" in kinds:
        assert started("probe-key-1", "probe", "probe:1"), "a key's first job did not start"
        assert not started("probe-key-2", "probe", "probe:1"), "key limit not applied"
    if "client" in kinds:
        tenant = "tenant00000"
        count = sum(started(f"probe-rate-{n}", tenant, f"probe:r{n}") for n in range(60))
        assert count <= TENANT_RATE, f"client rate limit not applied: {count} started at once"
    if "exec" in kinds:
        for n in range(EXEC_MAX_INFLIGHT + 1):
            started(f"probe-exec-{n}", f"probe{n}", f"probe:e{n}")
        running = dispatcher.counts()["running"]
        assert running == EXEC_MAX_INFLIGHT, f"exec limit not applied: {running} running"


def limit_cycles_per_call(batch: list[SubmitRequest], tenants: int, on: bool | str) -> float:
    """Seconds per submit+assign+ack cycle, one command per call, the clock moving on."""
    dispatcher = limited(tenants, on)
    submit, ack = dispatcher.submit, dispatcher.ack
    gc.collect()
    started = time.process_time()
    for i, request in enumerate(batch):
        now = T0 + i * LIMIT_STEP_S
        assigned = submit(request, now)[-1]
        assert isinstance(assigned, Assigned), f"job {request.id} did not start: {assigned}"
        ack(assigned.job_id, assigned.attempt, assigned.lease, now, result=None)
    elapsed = (time.process_time() - started) / len(batch)
    assert dispatcher.counts()["running"] == 0
    check_limits_hold(dispatcher, on, now)
    return elapsed


def limit_cycles_batched(
    batch: list[SubmitRequest], tenants: int, on: bool | str, size: int = 100
) -> float:
    """Seconds per cycle with submit_many/ack_many of `size` jobs per call."""
    dispatcher = limited(tenants, on)
    chunks = [batch[i : i + size] for i in range(0, len(batch), size)]
    gc.collect()
    started = time.process_time()
    for number, chunk in enumerate(chunks):
        now = T0 + number * size * LIMIT_STEP_S
        events = dispatcher.submit_many(chunk, now)
        acks = [
            (event.job_id, event.attempt, event.lease, None)
            for event in events
            if type(event) is Assigned
        ]
        done, rejected = dispatcher.ack_many(acks, now)
        assert not rejected and len(done) >= len(chunk), "a limit held a job"
    elapsed = (time.process_time() - started) / len(batch)
    check_limits_hold(dispatcher, on, now)
    return elapsed


def bench_limits(
    n: int,
    tenants: int = LIMIT_TENANTS,
    keys: int = LIMIT_KEYS,
    repeats: int = 3,
    breakdown: bool = False,
) -> dict[str, Any]:
    """The cycles with limits off and on, in turn (off, on, off, on, ...): the best of each,
    their ratio, and the ratio pair by pair (min, max). `breakdown`: the per-call cycle
    again with each kind of limit alone (off, client, key, exec, in turn)."""
    batch = limit_requests(n, tenants, keys)
    out: dict[str, Any] = {
        "jobs": n,
        "tenants": tenants,
        "keys": min(keys, n),
        "tenant_rate": TENANT_RATE,
        "exec_max_inflight": EXEC_MAX_INFLIGHT,
    }
    for name, run in (("per_call", limit_cycles_per_call), ("batched", limit_cycles_batched)):
        off: list[float] = []
        on: list[float] = []
        for _ in range(repeats):
            off.append(run(batch, tenants, False))
            on.append(run(batch, tenants, True))
        ratios = [b / a for a, b in zip(off, on, strict=True)]
        out[name] = {
            "off_s": min(off),
            "on_s": min(on),
            "ratio": min(on) / min(off),
            "pair_ratio_min": min(ratios),
            "pair_ratio_max": max(ratios),
        }
    if breakdown:
        alone: dict[str, list[float]] = {kind: [] for kind in ("off", *LIMIT_KINDS)}
        for _ in range(repeats):
            for kind, times in alone.items():
                on_: bool | str = False if kind == "off" else kind
                times.append(limit_cycles_per_call(batch, tenants, on_))
        out["per_call_alone"] = {kind: min(times) for kind, times in alone.items()}
    return out


# --- tick at scale ---------------------------------------------------------------------------


def bench_tick(queued: int, running: int) -> dict[str, float]:
    """Hold `queued` queued and `running` running jobs; time idle and busy ticks."""
    dispatcher = Dispatcher(
        CoreConfig(default_cap=BIG_CAP, ack_timeout_s=30.0, worker_expiry_s=None)
    )
    started = time.process_time()
    chunk = 10_000
    total = queued + running
    for base in range(0, total, chunk):
        dispatcher.submit_many(
            [
                SubmitRequest(
                    id=f"job-{i:08d}",
                    exec=f"exec{i % 4}.run",
                    payload={"n": i},
                    client_id=f"client{i % 100}",
                )
                for i in range(base, min(base + chunk, total))
            ],
            T0,
        )
    setup_submit_s = time.process_time() - started
    workers = 10
    for w in range(workers):
        dispatcher.join(f"w{w}", ["job.assign.>"], T0)
    # Credit arrives in 100 steps 0.1 s apart, so deadlines are spread over 10 s.
    steps = 100
    per_step = running // steps
    for step in range(steps):
        dispatcher.grant_credit(f"w{step % workers}", per_step, T0 + step * 0.1)
    counts = dispatcher.counts()
    assert counts["running"] == running and counts["queued"] == queued, counts

    now = T0 + 10.0
    ticks = 20_000
    gc.collect()
    t = time.process_time()
    for k in range(ticks):
        dispatcher.tick(now + k * 1e-6)
    idle_s = (time.process_time() - t) / ticks

    # Just past the first step's deadlines: its jobs expire together. No worker has credit
    # left, so each is requeued at the front of its queue (a worker with room would get it
    # as attempt 2: `reassigned`); both count as an expired deadline handled.
    due = T0 + 30.0 + 0.05
    t = time.process_time()
    events = dispatcher.tick(due)
    busy_s = time.process_time() - t
    expired = sum(1 for event in events if event.type in ("reassigned", "requeued"))
    return {
        "queued": counts["queued"],
        "running": counts["running"],
        "setup_submit_per_job_s": setup_submit_s / total,
        "idle_tick_s": idle_s,
        "busy_tick_s": busy_s,
        "busy_tick_expired": expired,
        "busy_tick_per_expired_s": busy_s / max(expired, 1),
        "rss_mb": rss_mb(),
    }


# --- memory ----------------------------------------------------------------------------------


def memory_child(n: int) -> dict[str, float]:
    """Run in a fresh process: RSS before and after queueing `n` jobs (no worker)."""
    dispatcher = Dispatcher(CoreConfig(worker_expiry_s=None))
    gc.collect()
    before = rss_mb()
    chunk = 10_000
    for base in range(0, n, chunk):
        dispatcher.submit_many(
            [
                SubmitRequest(
                    id=f"job-{i:08d}",
                    exec=f"exec{i % 4}.run",
                    payload={"n": i},
                    client_id=f"client{i % 100}",
                )
                for i in range(base, min(base + chunk, n))
            ],
            T0,
        )
    gc.collect()
    after = rss_mb()
    assert dispatcher.counts()["queued"] == n
    return {
        "jobs": n,
        "rss_before_mb": before,
        "rss_after_mb": after,
        "bytes_per_job": (after - before) * 1024 * 1024 / n,
    }


def bench_memory(n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "dispatch.bench.core_bench", "--memory-child", str(n)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


# --- report ----------------------------------------------------------------------------------


def limit_sizes(quick: bool) -> dict[str, int]:
    """Jobs, tenants and keys of the limits rows (quick: a tenth of each)."""
    if quick:
        return {"n": 20_000, "tenants": LIMIT_TENANTS // 10, "keys": LIMIT_KEYS // 10}
    return {"n": 200_000, "tenants": LIMIT_TENANTS, "keys": LIMIT_KEYS}


def run_all(quick: bool, limits_only: bool = False, breakdown: bool = False) -> dict[str, Any]:
    n = 20_000 if quick else 200_000
    big_queued, big_running = (100_000, 10_000) if quick else (1_000_000, 100_000)
    results: dict[str, Any] = {"machine": machine(), "quick": quick}
    per_job = bench_baseline(n)
    results["baseline_per_job_s"] = per_job
    if limits_only:
        results["limits"] = bench_limits(**limit_sizes(quick), breakdown=breakdown)
        return results
    results["cycle_per_call_s"] = bench_cycles_per_call(n)
    results["cycle_batched_s"] = bench_cycles_batched(n)
    results["cycle_mixed_s"] = bench_cycles_mixed(n)
    # The same two runs with the cyclic GC's thresholds raised for throughput: the jobs held
    # are long-lived, and default thresholds rescan them over and over. (The node uses
    # smaller ones, `dispatch.api.server.GC_THRESHOLDS`, for short pauses.)
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_TUNED)
    try:
        results["cycle_per_call_gc_tuned_s"] = bench_cycles_per_call(n)
        results["cycle_batched_gc_tuned_s"] = bench_cycles_batched(n)
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    results["limits"] = bench_limits(**limit_sizes(quick), breakdown=breakdown)
    gc.collect()
    results["memory"] = bench_memory(big_queued)
    results["tick"] = bench_tick(big_queued, big_running)
    return results


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    base = results["baseline_per_job_s"]

    def rate(seconds: float) -> str:
        ratio = seconds / base
        return f"{1 / seconds:>10,.0f}/s  {seconds * 1e6:6.2f} us  ({ratio:5.1f}x baseline)"

    lines = [
        f"machine: {m['nproc']} cores, {m['cpu']}, {m['implementation']} {m['python']}, "
        f"load average at start {m['load_average']}",
        f"baseline (dict insert + deque append/popleft + dict delete): "
        f"{1 / base:,.0f} jobs/s, {base * 1e9:.0f} ns/job",
    ]
    if "cycle_per_call_s" not in results:  # --limits-only
        return "\n".join([*lines, *report_limits(results["limits"], rate)])
    tick = results["tick"]
    mem = results["memory"]
    lines += [
        "submit+assign+ack cycles, one core:",
        f"  one command per call      {rate(results['cycle_per_call_s'])}",
        f"  batched, 100 per call     {rate(results['cycle_batched_s'])}",
        f"  mixed, 4 execs/50 clients {rate(results['cycle_mixed_s'])}",
        f"  with gc.set_threshold{GC_TUNED}:",
        f"  one command per call      {rate(results['cycle_per_call_gc_tuned_s'])}",
        f"  batched, 100 per call     {rate(results['cycle_batched_gc_tuned_s'])}",
        *report_limits(results["limits"], rate),
        f"tick with {tick['queued']:,} queued and {tick['running']:,} running:",
        f"  nothing due               {tick['idle_tick_s'] * 1e6:.2f} us",
        f"  {tick['busy_tick_expired']:,} deadlines due      "
        f"{tick['busy_tick_s'] * 1e3:.1f} ms ({tick['busy_tick_per_expired_s'] * 1e6:.1f} us per "
        "expired job)",
        f"  (setup: SubmitRequest + submit_many {tick['setup_submit_per_job_s'] * 1e6:.2f} us/job; "
        f"process RSS {tick['rss_mb']:,.0f} MB)",
        f"memory, {mem['jobs']:,} queued jobs in a fresh process: "
        f"RSS {mem['rss_after_mb']:,.0f} MB "
        f"({mem['rss_after_mb'] - mem['rss_before_mb']:,.0f} MB for the jobs, "
        f"{mem['bytes_per_job']:.0f} bytes/job)",
    ]
    return "\n".join(lines)


def report_limits(limits: dict[str, Any], rate: Callable[[float], str]) -> list[str]:
    lines = [
        f"limits, {limits['jobs']:,} jobs over {limits['tenants']:,} tenants and "
        f"{limits['keys']:,} keys (off and on in turn):",
    ]
    for name, label in (("per_call", "one command per call"), ("batched", "batched, 100 per call")):
        row = limits[name]
        lines += [
            f"  {label:<25} off {rate(row['off_s'])}",
            f"  {'':<25} on  {rate(row['on_s'])}",
            f"  {'':<25} on/off {row['ratio']:.2f} (pair by pair "
            f"{row['pair_ratio_min']:.2f}-{row['pair_ratio_max']:.2f})",
        ]
    alone = limits.get("per_call_alone")
    if alone:
        lines.append("  one command per call, each kind of limit alone:")
        for kind, seconds in alone.items():
            label = "none" if kind == "off" else f"{kind} limits only"
            lines.append(f"  {label:<25}     {rate(seconds)}  on/off {seconds / alone['off']:.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--limits-only", action="store_true", help="only the baseline and the limits rows"
    )
    parser.add_argument(
        "--limits-breakdown",
        action="store_true",
        help="also the per-call cycle with each kind of limit alone",
    )
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child)))
        return
    results = run_all(args.quick, args.limits_only, args.limits_breakdown)
    print(json.dumps(results, indent=2) if args.json else report(results))


if __name__ == "__main__":
    main()
