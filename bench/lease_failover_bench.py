"""Lease failover benchmark: SIGKILL the process holding the Delta-table lease, again and again,
and time how long a standby takes to hold it, on object storage and on local disk.

    .venv/bin/python -m dispatch.bench.lease_failover_bench                  # 12 kills per backend
    .venv/bin/python -m dispatch.bench.lease_failover_bench --kills 20 --ttl 3 --renew 0.5 --seed 2
    .venv/bin/python -m dispatch.bench.lease_failover_bench --backends s3 --out out.json

The object store is a real S3-compatible server on loopback (S3Proxy, tests/s3_server.py, in a
temporary folder; credentials and endpoint go through `dispatch.storage.storage_options` as in
service). The same run repeats everything on a local-disk warehouse, the baseline.

Each round: a holder process (this module, `holder` role: `LeaseTable.try_acquire` and then
`renew` every `renew_every_s`, as api/election.py does) takes the lease and keeps it for
`--hold` seconds plus a random part of one renewal interval (`--seed`), so the kills sample
every phase of the renewal cycle; then it gets SIGKILL by the pid this benchmark started.
The standby, a thread here with its own `LeaseTable` (its own delta-rs instance), calls
`try_acquire` every `renew_every_s` all along, as a standby node does. Failover = from the
kill to the standby's `try_acquire` that returned the lease (a new epoch). It is bounded
below by what was left of the dead holder's term (ttl_s minus the time since its last
renewal: ttl_s - renew_every_s at best) and above by ttl_s + renew_every_s + one takeover's
commit. The standby then releases the lease, so the next round's holder takes it at once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dispatch.lease import Lease, LeaseTable
from dispatch.settings import LeaseSettings, load_settings
from dispatch.storage import storage_options

GROUP = "bench"
_OPTIONS_ENV = "LEASE_BENCH_STORAGE_OPTIONS"
"""The holder's storage options travel in its environment, not on its command line (ps)."""
_ANNOUNCE = "HOLDING"


@dataclass(frozen=True)
class Round:
    failover_s: float
    left_of_term_s: float
    """What was left of the dead holder's lease at the kill (expires_at - kill time)."""
    epoch: int


def _settings(args: argparse.Namespace) -> LeaseSettings:
    base = load_settings().lease
    return LeaseSettings(
        ttl_s=args.ttl if args.ttl is not None else base.ttl_s,
        renew_every_s=args.renew if args.renew is not None else base.renew_every_s,
        clock_skew_margin_s=args.margin if args.margin is not None else base.clock_skew_margin_s,
    )


def run_holder(location: str, name: str, settings: LeaseSettings) -> None:
    """The holder role: take the lease, renew it forever, print each new term."""
    options: dict[str, str] = json.loads(os.environ.get(_OPTIONS_ENV, "{}"))
    table = LeaseTable(location, settings, options)
    lease: Lease | None = None
    while True:
        started = time.monotonic()
        now = time.time()
        held = lease
        lease = table.renew(lease, now) if lease else None
        if lease is None:
            lease = table.try_acquire(GROUP, name, f"http://{name}", now)
        if lease is not None and (held is None or held.epoch != lease.epoch):
            print(f"{_ANNOUNCE} {lease.epoch}", flush=True)
        time.sleep(max(0.0, settings.renew_every_s - (time.monotonic() - started)))


class Standby:
    """A standby node's lease loop in a thread: try_acquire every renew_every_s."""

    def __init__(self, table: LeaseTable, settings: LeaseSettings) -> None:
        self.table = table
        self.settings = settings
        self.taken: tuple[float, Lease] | None = None
        self.polls_s: list[float] = []
        """How long each refused try_acquire took (a load, a read, no commit)."""
        self._armed = threading.Event()
        self._won = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def arm(self) -> None:
        self.taken = None
        self._won.clear()
        self._armed.set()

    def wait(self, timeout_s: float) -> tuple[float, Lease]:
        if not self._won.wait(timeout_s) or self.taken is None:
            raise RuntimeError(f"the standby did not take the lease within {timeout_s:g} s")
        return self.taken

    def stop(self) -> None:
        self._stop.set()
        self._armed.set()
        self._thread.join(30)

    def _run(self) -> None:
        every = self.settings.renew_every_s
        while not self._stop.is_set():
            self._armed.wait()
            if self._stop.is_set():
                return
            started = time.monotonic()
            lease = self.table.try_acquire(GROUP, "standby", "http://standby", time.time())
            if lease is None:
                self.polls_s.append(time.monotonic() - started)
            else:
                self.taken = (time.monotonic(), lease)
                self._armed.clear()
                self._won.set()
                continue
            self._stop.wait(max(0.0, every - (time.monotonic() - started)))


def _start_holder(
    location: str, name: str, args: argparse.Namespace, options: dict[str, str]
) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "dispatch.bench.lease_failover_bench", "holder",
        "--location", location, "--name", name,
        "--ttl", str(args.ttl_s), "--renew", str(args.renew_s), "--margin", str(args.margin_s),
    ]  # fmt: skip
    environment = {**os.environ, _OPTIONS_ENV: json.dumps(options)}
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=environment,
        cwd=Path(__file__).resolve().parent.parent,
    )


def _wait_announce(holder: subprocess.Popen[str], timeout_s: float) -> int:
    assert holder.stdout is not None
    deadline = time.monotonic() + timeout_s
    result: list[int] = []

    def read() -> None:
        assert holder.stdout is not None
        for line in holder.stdout:
            if line.startswith(_ANNOUNCE):
                result.append(int(line.split()[1]))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    if not result:
        raise RuntimeError(
            f"the holder (pid {holder.pid}) did not take the lease in {timeout_s:g} s"
        )
    return result[0]


def measure(
    label: str, location: str, options: dict[str, str], args: argparse.Namespace
) -> tuple[list[Round], list[float]]:
    settings = LeaseSettings(
        ttl_s=args.ttl_s, renew_every_s=args.renew_s, clock_skew_margin_s=args.margin_s
    )
    table = LeaseTable(location, settings, options)
    standby = Standby(table, settings)
    rounds: list[Round] = []
    jitter = random.Random(args.seed)
    try:
        for number in range(args.kills):
            holder = _start_holder(location, f"holder-{number}", args, options)
            try:
                epoch = _wait_announce(holder, 60)
                # Polling from now on, as a standby does all along: its polls and the kill are
                # out of phase (armed at the kill, it would always poll at kill + k * interval).
                standby.arm()
                # A few renewals (a lease in steady state), then a kill at a random phase of
                # the renewal cycle: otherwise every kill lands just as long after a renewal.
                time.sleep(args.hold + jitter.uniform(0, settings.renew_every_s))
                killed_wall = time.time()
                killed = time.monotonic()
                os.kill(holder.pid, signal.SIGKILL)
            finally:
                if holder.poll() is None:
                    holder.kill()
                holder.wait(30)
                if holder.stdout is not None:
                    holder.stdout.close()
            # The dead holder's last renewal: read after its death, before the lease expires.
            row = table.read(GROUP)
            taken_at, lease = standby.wait(4 * settings.ttl_s + 30)
            if lease.epoch <= epoch:
                raise RuntimeError(f"takeover at epoch {lease.epoch} after holder's {epoch}")
            left = (row.expires_at - killed_wall) if row is not None else float("nan")
            rounds.append(Round(taken_at - killed, left, lease.epoch))
            print(
                f"  {label} kill {number + 1:2d}: failover {taken_at - killed:6.3f} s"
                f" (term left at kill {left:5.3f} s, epoch {epoch} -> {lease.epoch})",
                flush=True,
            )
            table.release(lease, time.time())  # the next holder takes it at once
    finally:
        standby.stop()
    return rounds, standby.polls_s


def _summary(label: str, measured: tuple[list[Round], list[float]]) -> dict[str, float | int | str]:
    rounds, polls = measured
    failovers = sorted(r.failover_s for r in rounds)
    return {
        "standby_poll_p50_s": statistics.median(polls) if polls else float("nan"),
        "backend": label,
        "kills": len(rounds),
        "p50_s": statistics.median(failovers),
        "max_s": failovers[-1],
        "min_s": failovers[0],
        "mean_term_left_s": statistics.fmean(r.left_of_term_s for r in rounds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatch.bench.lease_failover_bench")
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "holder"])
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--hold", type=float, default=1.2, help="seconds held before the kill")
    parser.add_argument("--ttl", type=float, default=None, help="lease ttl_s (default: settings)")
    parser.add_argument("--renew", type=float, default=None, help="renew_every_s")
    parser.add_argument("--margin", type=float, default=None, help="clock_skew_margin_s")
    parser.add_argument("--backends", default="s3,local")
    parser.add_argument("--location", default="")
    parser.add_argument("--name", default="holder")
    parser.add_argument("--out", type=Path, help="also write the results as JSON to this file")
    parser.add_argument("--seed", type=int, default=1, help="of the kill phases")
    args = parser.parse_args(argv)
    settings = _settings(args)
    args.ttl_s, args.renew_s, args.margin_s = (
        settings.ttl_s, settings.renew_every_s, settings.clock_skew_margin_s
    )  # fmt: skip
    if args.role == "holder":
        run_holder(args.location, args.name, settings)
        return 0
    if args.kills < 1:
        parser.error("--kills must be at least 1")

    from tests.s3_server import running  # the benchmark's own server; tests/ is on the path

    print(
        f"lease settings: ttl_s={settings.ttl_s:g} renew_every_s={settings.renew_every_s:g}"
        f" clock_skew_margin_s={settings.clock_skew_margin_s:g}; {args.kills} kills per"
        f" backend, holder killed {args.hold:g} s + U(0, renew_every_s) after taking the lease",
        flush=True,
    )
    summaries: list[dict[str, float | int | str]] = []
    with tempfile.TemporaryDirectory(prefix="lease-failover-") as scratch:
        folder = Path(scratch)
        backends = [name.strip() for name in args.backends.split(",") if name.strip()]
        for backend in backends:
            if backend == "s3":
                (folder / "s3").mkdir()
                with running(folder / "s3") as server:
                    location = server.uri("bench", "warehouse")
                    options = storage_options(server.settings(), location)
                    print(f"S3Proxy {server.endpoint} (pid {server.pid}), warehouse {location}")
                    summaries.append(_summary("s3", measure("s3", location, options, args)))
            elif backend == "local":
                location = str(folder / "local-warehouse")
                print(f"local disk, warehouse {location}")
                summaries.append(_summary("local", measure("local", location, {}, args)))
            else:
                parser.error(f"unknown backend {backend!r} (s3, local)")
    print("\nbackend  kills   p50 s   max s   min s   term left at kill (mean)   standby poll p50")
    for row in summaries:
        print(
            f"{row['backend']:<8} {row['kills']:>5} {row['p50_s']:>7.3f} {row['max_s']:>7.3f}"
            f" {row['min_s']:>7.3f}   {row['mean_term_left_s']:>6.3f} s"
            f"                  {1000 * float(row['standby_poll_p50_s']):.0f} ms"
        )
    if args.out is not None:
        args.out.write_text(
            json.dumps({"lease": settings.model_dump(), "results": summaries}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
