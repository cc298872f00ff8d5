"""Fairness evidence: one tenant floods at 100x the others' rate; what the others wait.

    .venv/bin/python -m dispatch.bench.fairness_bench                       # the defaults below
    .venv/bin/python -m dispatch.bench.fairness_bench --light 4 --rate 1 --flood-factor 100 --json
    .venv/bin/python -m dispatch.bench.fairness_bench --scenario limit --limit-rate 50

A discrete-event simulation on a virtual clock (no Kafka, no HTTP, no wall time): Poisson
arrivals per tenant, a fleet of `--workers` workers with `--slots` slots each, every job
running an exponentially distributed time (mean `--run-s`), all drawn from `--seed`. The same
arrivals and run times go through three runs:

- **solo**: the light tenants alone, scheduled by the dispatcher: the waits they get when
  nobody floods;
- **round-robin**: the flood added, scheduled by the pure core (`dispatch.core.Dispatcher`:
  priorities, then round-robin across clients, then FIFO; the per-client in-flight cap), the
  code the leader runs;
- **FIFO**: the flood added, through one first-in-first-out queue: what a queue without
  per-tenant fairness does with the same work (Celery's, Dramatiq's and Sidekiq's queues
  serve a queue in arrival order);
- **limited**: the flood added, scheduled by the pure core with a runtime rate limit on the
  flooding tenant (`Dispatcher.set_limit("client", "flood", 0.0, rate=--limit-rate)`, burst
  its default) and none on the others: the flood's start rate over the run against its
  limit, and the light tenants' waits against the solo run's.

`--scenario flood` runs the first three, `--scenario limit` solo and limited, `all` (the
default) the four. The core's timers (a rate limit's next token) are served by a `tick` at
`Dispatcher.next_timer_at()`, as the leader's loop does.

With the flood above the fleet's capacity, the backlog grows all run long; each run reports,
per tenant class, the queue waits of the jobs that started (p50/p95/p99) and how many jobs
were still waiting at the end (their waits so far count in the percentiles too, as lower
bounds: leaving them out would flatter a queue that starves them).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from dispatch.core import CoreConfig, Dispatcher, SubmitRequest
from dispatch.core.events import Assigned, Event
from dispatch.core.leases import seeded_lease_tokens

FLOOD = "flood"
EXEC = "work.run"


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    job_id: str
    tenant: str
    run_s: float


@dataclass(frozen=True, slots=True)
class Workload:
    light: int = 4
    rate: float = 1.0
    """Jobs per second of each light tenant."""
    flood_factor: float = 100.0
    """The flooding tenant's rate, in light tenants' rates."""
    workers: int = 8
    slots: int = 4
    run_s: float = 0.5
    duration_s: float = 300.0
    seed: int = 1
    limit_rate: float = 50.0
    """The flooding tenant's rate limit (starts per second) in the limited run."""

    @property
    def capacity(self) -> float:
        """Jobs per second the fleet completes when busy."""
        return self.workers * self.slots / self.run_s

    def arrivals(self, *, flood: bool) -> list[Arrival]:
        """Every tenant's Poisson arrivals, in time order; the light tenants' are the same
        with and without the flood (each tenant draws from a generator of its own)."""
        tenants = [(f"light-{n}", self.rate) for n in range(self.light)]
        if flood:
            tenants.append((FLOOD, self.rate * self.flood_factor))
        out: list[Arrival] = []
        for tenant, rate in tenants:
            draw = random.Random(f"{self.seed}/{tenant}")
            at, number = 0.0, 0
            while True:
                at += draw.expovariate(rate)
                if at >= self.duration_s:
                    break
                out.append(
                    Arrival(at, f"{tenant}-{number}", tenant, draw.expovariate(1 / self.run_s))
                )
                number += 1
        out.sort(key=lambda arrival: (arrival.at, arrival.job_id))
        return out


@dataclass(frozen=True, slots=True)
class Waits:
    """Queue waits of one tenant class in one run (seconds)."""

    started: int
    waiting_at_end: int
    p50: float
    p95: float
    p99: float


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (0.0 of nothing)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def summarize(started: Iterable[float], waiting: Iterable[float]) -> Waits:
    started, waiting = list(started), list(waiting)
    every = started + waiting
    return Waits(
        len(started), len(waiting),
        round(percentile(every, 0.50), 3), round(percentile(every, 0.95), 3),
        round(percentile(every, 0.99), 3),
    )  # fmt: skip


Run = dict[str, list[float]]
"""Tenant -> the waits of its started jobs; tenant + "/waiting" -> the waits so far of the
jobs still queued at the end."""


def run_dispatcher(
    workload: Workload, arrivals: Sequence[Arrival], flood_rate_limit: float | None = None
) -> Run:
    """The arrivals through the pure core, a worker's slot freed (acked, one credit given
    back) when its job's run time is over; with `flood_rate_limit`, a runtime rate limit on
    the flooding tenant from the start, its next tokens served by ticks at the core's
    `next_timer_at`."""
    core = Dispatcher(
        CoreConfig(worker_expiry_s=None, ack_timeout_s=3600.0, max_ack_timeout_s=3600.0),
        lease_token=seeded_lease_tokens(workload.seed),
    )
    if flood_rate_limit is not None:
        core.set_limit("client", FLOOD, 0.0, rate=flood_rate_limit, by="bench")
    by_id = {arrival.job_id: arrival for arrival in arrivals}
    waits: Run = {}
    finishing: list[tuple[float, str, str, int, str]] = []  # (at, job, worker, attempt, lease)

    def started(events: list[Event], now: float) -> None:
        for event in events:
            if isinstance(event, Assigned):
                arrival = by_id[event.job_id]
                waits.setdefault(arrival.tenant, []).append(now - arrival.at)
                heapq.heappush(
                    finishing,
                    (
                        now + arrival.run_s,
                        event.job_id,
                        event.worker_id,
                        event.attempt,
                        event.lease,
                    ),
                )

    for number in range(workload.workers):
        worker_id = f"w{number}"
        core.join(worker_id, ["job.assign.>"], 0.0)
        started(core.grant_credit(worker_id, workload.slots, 0.0), 0.0)
    pending = deque(arrivals)
    ticked_at = -1.0
    while pending or finishing:
        timer = core.next_timer_at()
        if (
            timer is not None
            and timer < workload.duration_s
            and (not pending or timer < pending[0].at)
            and (not finishing or timer < finishing[0][0])
        ):
            if timer <= ticked_at:
                raise RuntimeError(f"the core's next timer stays at {timer!r} after a tick there")
            ticked_at = timer
            started(core.tick(timer), timer)
        elif finishing and (not pending or finishing[0][0] <= pending[0].at):
            at, job_id, worker_id, attempt, lease = heapq.heappop(finishing)
            if at >= workload.duration_s:
                break
            core.ack(job_id, attempt, lease, at, worker_id=worker_id)
            started(core.grant_credit(worker_id, 1, at), at)
        else:
            arrival = pending.popleft()
            request = SubmitRequest(
                id=arrival.job_id, exec=EXEC, payload=None, client_id=arrival.tenant
            )
            started(core.submit(request, arrival.at), arrival.at)
    end = workload.duration_s
    for job in core.jobs():
        if job.status.value == "queued":
            arrival = by_id[job.id]
            waits.setdefault(f"{arrival.tenant}/waiting", []).append(end - arrival.at)
    return waits


def run_fifo(workload: Workload, arrivals: Sequence[Arrival]) -> Run:
    """The same arrivals through one first-in-first-out queue and the same slots."""
    free = workload.workers * workload.slots
    queue: deque[Arrival] = deque()
    finishing: list[float] = []
    waits: Run = {}

    def start(arrival: Arrival, now: float) -> None:
        waits.setdefault(arrival.tenant, []).append(now - arrival.at)
        heapq.heappush(finishing, now + arrival.run_s)

    for arrival in arrivals:
        while finishing and finishing[0] <= arrival.at:
            done_at = heapq.heappop(finishing)
            if queue:
                start(queue.popleft(), done_at)
            else:
                free += 1
        if free:
            free -= 1
            start(arrival, arrival.at)
        else:
            queue.append(arrival)
    while finishing and queue:
        done_at = heapq.heappop(finishing)
        if done_at >= workload.duration_s:
            break
        start(queue.popleft(), done_at)
    for arrival in queue:
        waits.setdefault(f"{arrival.tenant}/waiting", []).append(workload.duration_s - arrival.at)
    return waits


def classes(run: Run) -> dict[str, Waits]:
    """The light tenants together, and the flood."""

    def of(match: str) -> Waits:
        started = [w for tenant, ws in run.items() if not tenant.endswith("/waiting")
                   and tenant.startswith(match) for w in ws]  # fmt: skip
        waiting = [w for tenant, ws in run.items() if tenant.endswith("/waiting")
                   and tenant.startswith(match) for w in ws]  # fmt: skip
        return summarize(started, waiting)

    found = {"light": of("light-")}
    if any(tenant.startswith(FLOOD) for tenant in run):
        found[FLOOD] = of(FLOOD)
    return found


SCENARIOS = ("all", "flood", "limit")


def measure(workload: Workload, scenario: str = "all") -> dict[str, dict[str, Waits]]:
    """The runs of a scenario: `flood` solo, round-robin and FIFO; `limit` solo and limited;
    `all` the four."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario: one of {', '.join(SCENARIOS)}, got {scenario!r}")
    flooded = workload.arrivals(flood=True)
    out = {"solo": classes(run_dispatcher(workload, workload.arrivals(flood=False)))}
    if scenario in ("all", "flood"):
        out["round_robin"] = classes(run_dispatcher(workload, flooded))
        out["fifo"] = classes(run_fifo(workload, flooded))
    if scenario in ("all", "limit"):
        out["limited"] = classes(run_dispatcher(workload, flooded, workload.limit_rate))
    return out


RATE_TOLERANCE = 0.05
"""How far the limited flood's start rate may be from its limit (a fraction of it)."""


def limit_summary(
    workload: Workload, results: dict[str, dict[str, Waits]]
) -> dict[str, float | int | bool]:
    """The limited run against its limit and the solo run: the flood's starts per second
    over the run, its ratio to the limit, and the light tenants' waits minus solo's."""
    limited, solo = results["limited"], results["solo"]["light"]
    achieved = limited[FLOOD].started / workload.duration_s
    light = limited["light"]
    return {
        "limit_rate": workload.limit_rate,
        "achieved_rate": round(achieved, 3),
        "achieved_over_limit": round(achieved / workload.limit_rate, 4),
        "within_tolerance": abs(achieved / workload.limit_rate - 1) <= RATE_TOLERANCE,
        "light_p50_over_solo_s": round(light.p50 - solo.p50, 3),
        "light_p95_over_solo_s": round(light.p95 - solo.p95, 3),
        "light_p99_over_solo_s": round(light.p99 - solo.p99, 3),
        "light_started_over_solo": light.started - solo.started,
    }


def render(workload: Workload, results: dict[str, dict[str, Waits]]) -> str:
    offered = workload.light * workload.rate * (1 + workload.flood_factor / workload.light)
    lines = [
        f"{workload.light} light tenants at {workload.rate}/s, one flooding at "
        f"{workload.rate * workload.flood_factor:g}/s; fleet {workload.workers}x"
        f"{workload.slots} slots, run time mean {workload.run_s} s (capacity "
        f"{workload.capacity:g}/s, offered {offered:g}/s); {workload.duration_s:g} s virtual",
        f"{'run':<12} {'tenants':<7} {'started':>8} {'waiting':>8} {'p50 s':>9} {'p95 s':>9} "
        f"{'p99 s':>9}",
    ]
    for run, by_class in results.items():
        for name, waits in by_class.items():
            lines.append(
                f"{run:<12} {name:<7} {waits.started:>8} {waits.waiting_at_end:>8} "
                f"{waits.p50:>9.3f} {waits.p95:>9.3f} {waits.p99:>9.3f}"
            )
    solo = results["solo"]["light"].p99
    if "round_robin" in results:
        fair, fifo = results["round_robin"]["light"].p99, results["fifo"]["light"].p99
        lines.append(
            f"light tenants' p99 queue wait: solo {solo:.3f} s; with the flood, round-robin "
            f"{fair:.3f} s (+{fair - solo:.3f} s), FIFO {fifo:.3f} s (+{fifo - solo:.3f} s)"
        )
    if "limited" in results:
        summary = limit_summary(workload, results)
        verdict = "within" if summary["within_tolerance"] else "OUTSIDE"
        over = {k: summary[f"light_{k}_over_solo_s"] for k in ("p50", "p95", "p99")}
        lines += [
            f"limited: the flood rate-limited to {workload.limit_rate:g}/s started "
            f"{summary['achieved_rate']:.3f}/s over the run ({summary['achieved_over_limit']:.4f}"
            f" x its limit, {verdict} +-{RATE_TOLERANCE:.0%})",
            f"light tenants' queue wait, limited flood against solo: p50 {over['p50']:+.3f} s, "
            f"p95 {over['p95']:+.3f} s, p99 {over['p99']:+.3f} s; started "
            f"{summary['light_started_over_solo']:+d}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.fairness_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    defaults = Workload()
    parser.add_argument("--light", type=int, default=defaults.light, help="light tenants")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="jobs/s per light one")
    parser.add_argument("--flood-factor", type=float, default=defaults.flood_factor)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--slots", type=int, default=defaults.slots)
    parser.add_argument("--run-s", type=float, default=defaults.run_s, help="mean run time")
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="virtual s")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--limit-rate", type=float, default=defaults.limit_rate,
        help="the flood's rate limit in the limited run (starts/s)",
    )  # fmt: skip
    parser.add_argument(
        "--scenario", choices=SCENARIOS, default="all",
        help="flood: solo, round-robin, FIFO; limit: solo, limited; all: the four",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON document instead")
    args = parser.parse_args(argv)
    workload = Workload(
        args.light, args.rate, args.flood_factor, args.workers, args.slots, args.run_s,
        args.duration, args.seed, args.limit_rate,
    )  # fmt: skip
    results = measure(workload, args.scenario)
    if args.json:
        document: dict[str, object] = {
            "workload": asdict(workload),
            "results": {run: {k: asdict(v) for k, v in by.items()} for run, by in results.items()},
        }
        if "limited" in results:
            document["limit"] = limit_summary(workload, results)
        print(json.dumps(document, indent=1))
    else:
        print(render(workload, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
