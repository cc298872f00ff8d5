"""CPU per job, by process: what each process of a benchmark spent in its measured window.

A jobs/s figure moves 2 to 3 times between hours on a shared machine; the CPU a job costs each
process is meant to compare across them (time the hypervisor gives other guests is not counted
in a process's CPU time), and says where the time goes. A window reads every process's user + system
time from /proc (`/proc/PID/stat`, clock ticks) at its start and at its end, in one walk of
/proc each time, and the machine's busy time from `/proc/stat`:

- a watched process is counted with its threads, with the children it reaped during the window
  (their `cutime` + `cstime`) and with its living descendants (a wrapper's real work is often
  in a child), as one row, or with each descendant on a row of its own (`split`: a Celery
  worker's pool, Dramatiq's worker processes), or alone (`own`: the bench's own process,
  whose children have rows of their own);
- a process that lived only inside the window (the load generator) is added from what it
  measured itself (`CpuWindow.add`);
- "other processes on the machine" is the machine's busy time less every row: whatever else
  ran (another bench, the kernel's threads, a CI run) is visible, not hidden in a per-job
  figure.

Each row: the role, the pid, CPU seconds, µs per job (CPU seconds / jobs), its share of the
machine's busy time in the window, and the cores it kept busy on average.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dispatch.bench.stats import cpu_ticks

Mode = Literal["tree", "split", "own"]
"""How a watched process is counted: `tree`, with its descendants as one row; `split`, each
descendant a row of its own; `own`, its own threads only."""

BUSY = ("user", "nice", "system", "irq", "softirq")
"""The /proc/stat counters of time spent running something (not idle, iowait or steal)."""

OTHER = "other processes on the machine"


@dataclass(frozen=True)
class Stat:
    """One process's line of /proc/PID/stat, the fields a window needs (times in ticks)."""

    pid: int
    ppid: int
    own: int
    """utime + stime: its threads."""
    reaped: int
    """cutime + cstime: the children it waited for."""
    started: int
    """Start time (ticks since boot): tells a reused pid from the process it replaced."""


def parse_stat(pid: int, text: str) -> Stat:
    """A /proc/PID/stat line. The command name (field 2) may hold spaces and parentheses:
    everything after its last ')' is fixed (state, ppid, ..., utime at 14, stime 15, cutime
    16, cstime 17, start time 22, counted from 1)."""
    fields = text[text.rindex(")") + 2 :].split()
    return Stat(
        pid=pid,
        ppid=int(fields[1]),
        own=int(fields[11]) + int(fields[12]),
        reaped=int(fields[13]) + int(fields[14]),
        started=int(fields[19]),
    )


def process_table(proc: Path = Path("/proc")) -> dict[int, Stat]:
    """Every process's Stat, one walk of /proc (a process gone meanwhile is left out)."""
    table = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        table[int(entry.name)] = parse_stat(int(entry.name), text)
    return table


def descendants(root: int, table: Mapping[int, Stat]) -> list[int]:
    """The living descendants of `root`, children before grandchildren, each in pid order."""
    children: dict[int, list[int]] = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found, level = [], sorted(children.get(root, []))
    while level:
        found += level
        level = sorted(pid for parent in level for pid in children.get(parent, []))
    return found


def find_child(parent: int, name: str, *texts: str, proc: Path = Path("/proc")) -> int | None:
    """The first child of `parent` (lowest pid) named `name` (`/proc/PID/comm`) whose command
    line, its arguments joined by spaces, holds one of `texts`; None if there is none. Several
    texts because a process may rewrite its title: redis-server started with `--port 6380`
    shows `redis-server 127.0.0.1:6380`."""
    for stat in sorted(process_table(proc).values(), key=lambda s: s.pid):
        if stat.ppid != parent:
            continue
        try:
            comm = (proc / str(stat.pid) / "comm").read_text().strip()
            raw = (proc / str(stat.pid) / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        line = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
        if comm == name and any(text in line for text in texts):
            return stat.pid
    return None


@dataclass(frozen=True)
class Watched:
    role: str
    """What the process is: "broker", "leader node", "celery worker", ..."""
    pid: int
    mode: Mode = "tree"


Key = tuple[str, int, int]
"""(role, pid, start time) of one row's process."""


def ticks_by_row(watched: Sequence[Watched], table: Mapping[int, Stat]) -> dict[Key, int]:
    """CPU ticks so far of each row the watched processes make; a watched process that is not
    running makes none."""
    rows: dict[Key, int] = {}
    for process in watched:
        root = table.get(process.pid)
        if root is None:
            continue
        if process.mode == "own":
            rows[(process.role, root.pid, root.started)] = root.own
            continue
        family = [table[pid] for pid in descendants(process.pid, table)]
        if process.mode == "tree":
            total = sum(stat.own + stat.reaped for stat in [root, *family])
            rows[(process.role, root.pid, root.started)] = total
            continue
        rows[(f"{process.role}: main process", root.pid, root.started)] = root.own + root.reaped
        for number, stat in enumerate(family, start=1):
            rows[(f"{process.role}: child {number}", stat.pid, stat.started)] = (
                stat.own + stat.reaped
            )
    return rows


@dataclass(frozen=True)
class Snapshot:
    at: float
    """time.monotonic() when it was read."""
    rows: dict[Key, int]
    machine: dict[str, int]
    """/proc/stat's counters, all CPUs (stats.cpu_ticks)."""


def snapshot(watched: Sequence[Watched]) -> Snapshot:
    machine = cpu_ticks()
    rows = ticks_by_row(watched, process_table())
    return Snapshot(time.monotonic(), rows, machine)


@dataclass(frozen=True)
class Row:
    role: str
    pid: int | None
    cpu_s: float
    us_per_job: float
    share: float | None
    """Of the machine's busy CPU time in the window (None when /proc/stat is not there)."""
    cores: float
    """Cores kept busy on average: cpu_s / the window's seconds."""


@dataclass(frozen=True)
class CpuReport:
    jobs: int
    seconds: float
    """The window's length."""
    nproc: int
    rows: list[Row]
    """Each process's, then (when /proc/stat is there) the rest of the machine's."""
    machine_busy_s: float | None
    """CPU seconds the machine's CPUs spent running anything in the window."""
    steal_s: float | None
    """CPU seconds the hypervisor gave other guests (a slow window has it)."""
    notes: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(row.cpu_s for row in self.rows)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CpuReport:
        """A report read back from JSON (`dispatch bench --json`'s `cpu`)."""
        return cls(
            jobs=int(raw["jobs"]),
            seconds=float(raw["seconds"]),
            nproc=int(raw["nproc"]),
            rows=[Row(**row) for row in raw["rows"]],
            machine_busy_s=raw.get("machine_busy_s"),
            steal_s=raw.get("steal_s"),
            notes=list(raw.get("notes", [])),
        )


def build_report(
    before: Snapshot,
    after: Snapshot,
    jobs: int,
    *,
    added: Sequence[tuple[str, int | None, float]] = (),
    tick_s: float | None = None,
    nproc: int | None = None,
) -> CpuReport:
    """The window between two snapshots: a row for each process read at its end (one that
    started inside it counts from zero), then the processes `added` by hand, then the rest of
    the machine."""
    tick = tick_s if tick_s is not None else 1.0 / os.sysconf("SC_CLK_TCK")
    seconds = max(after.at - before.at, 1e-9)
    measured: list[tuple[str, int | None, float]] = [
        (role, pid, (ticks - before.rows.get((role, pid, started), 0)) * tick)
        for (role, pid, started), ticks in after.rows.items()
    ]
    measured += added
    notes = [
        f"{role} (pid {pid}) ended inside the window: not counted"
        for (role, pid, _started) in before.rows
        if (role, pid) not in {(r, p) for r, p, _ in after.rows}
    ]
    busy = steal = None
    if all(name in before.machine and name in after.machine for name in (*BUSY, "steal")):
        busy = sum(after.machine[name] - before.machine[name] for name in BUSY) * tick
        steal = (after.machine["steal"] - before.machine["steal"]) * tick
        measured.append((OTHER, None, busy - sum(cpu for _, _, cpu in measured)))

    def row(role: str, pid: int | None, cpu: float) -> Row:
        return Row(
            role=role,
            pid=pid,
            cpu_s=round(cpu, 3),
            us_per_job=round(1e6 * cpu / jobs, 1) if jobs else 0.0,
            share=round(cpu / busy, 3) if busy else None,
            cores=round(cpu / seconds, 2),
        )

    return CpuReport(
        jobs=jobs,
        seconds=round(seconds, 3),
        nproc=nproc if nproc is not None else (os.cpu_count() or 1),
        rows=[row(role, pid, cpu) for role, pid, cpu in measured],
        machine_busy_s=None if busy is None else round(busy, 3),
        steal_s=None if steal is None else round(steal, 3),
        notes=notes,
    )


class CpuWindow:
    """`start()` and `stop()` around a benchmark's measured phase, then `report(jobs)`."""

    def __init__(self, watched: Iterable[Watched]) -> None:
        self.watched = list(watched)
        self._added: list[tuple[str, int | None, float]] = []
        self._before: Snapshot | None = None
        self._after: Snapshot | None = None

    def start(self) -> None:
        self._before = snapshot(self.watched)

    def stop(self) -> None:
        self._after = snapshot(self.watched)

    def add(self, role: str, pid: int | None, cpu_s: float) -> None:
        """A process that lived inside the window only, with the CPU it measured itself."""
        self._added.append((role, pid, cpu_s))

    def report(self, jobs: int) -> CpuReport:
        if self._before is None or self._after is None:
            raise RuntimeError("the window was not started and stopped")
        return build_report(self._before, self._after, jobs, added=self._added)


def children_cpu_s() -> float:
    """User + system seconds of this process's children that ended and were waited for."""
    times = os.times()
    return times.children_user + times.children_system


def format_table(report: CpuReport, title: str = "CPU per job by process") -> str:
    """The report as plain text (no colour, no wrapping: these lines are copied into notes)."""
    head = f"{title}: {report.jobs:,} jobs in {report.seconds:.2f} s on {report.nproc} cores"
    if report.machine_busy_s is not None and report.steal_s is not None:
        used = report.machine_busy_s / (report.seconds * report.nproc)
        head += (
            f"; machine busy {report.machine_busy_s:.2f} CPU-s ({used:.0%} of its cores), "
            f"stolen {report.steal_s:.2f} CPU-s"
        )
    labels = ("process", "pid", "CPU s", "µs/job", "share", "cores")
    cells = [
        [
            row.role,
            "" if row.pid is None else str(row.pid),
            f"{row.cpu_s:.2f}",
            f"{row.us_per_job:,.0f}",
            "" if row.share is None else f"{row.share:.0%}",
            f"{row.cores:.2f}",
        ]
        for row in report.rows
    ]
    total = report.total_s
    cells.append(
        [
            "total",
            "",
            f"{total:.2f}",
            f"{1e6 * total / report.jobs:,.0f}" if report.jobs else "0",
            "100%" if report.machine_busy_s else "",
            f"{total / report.seconds:.2f}" if report.seconds else "",
        ]
    )
    widths = [max(len(line[n]) for line in [list(labels), *cells]) for n in range(len(labels))]

    def line(values: Sequence[str]) -> str:
        first = values[0].ljust(widths[0])
        rest = (value.rjust(width) for value, width in zip(values[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    lines = [head, line(labels), rule, *(line(values) for values in cells[:-1]), rule]
    lines += [line(cells[-1]), *(f"note: {note}" for note in report.notes)]
    return "\n".join(lines)
