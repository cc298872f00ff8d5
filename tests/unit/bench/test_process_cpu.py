"""CPU per job by process: reading /proc, counting a process with or without its descendants,
the window's rows (the rest of the machine included), the table, and a window on this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.bench.process_cpu import (
    OTHER,
    CpuReport,
    CpuWindow,
    Snapshot,
    Stat,
    Watched,
    build_report,
    children_cpu_s,
    descendants,
    find_child,
    format_table,
    parse_stat,
    process_table,
    ticks_by_row,
)


def _stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int = 0,
               cstime: int = 0, started: int = 1000) -> str:  # fmt: skip
    """A /proc/PID/stat line: fields 3.. are state, ppid, 9 others, utime, stime, cutime,
    cstime, 4 others, start time."""
    rest = ["S", str(ppid), *["0"] * 9, str(utime), str(stime), str(cutime), str(cstime)]
    rest += ["20", "0", "1", "0", str(started), "0"]
    return f"{pid} ({comm}) {' '.join(rest)}\n"


def _table(*stats: Stat) -> dict[int, Stat]:
    return {stat.pid: stat for stat in stats}


def _machine(user: int, system: int, idle: int, steal: int = 0) -> dict[str, int]:
    return {"user": user, "nice": 0, "system": system, "idle": idle, "iowait": 0, "irq": 0,
            "softirq": 0, "steal": steal}  # fmt: skip


def test_a_stat_line_is_read_after_the_command_name_whatever_it_holds() -> None:
    line = _stat_line(42, "java) (odd name", 7, utime=150, stime=30, cutime=5, cstime=2,
                      started=9999)  # fmt: skip
    assert parse_stat(42, line) == Stat(pid=42, ppid=7, own=180, reaped=7, started=9999)


def test_the_process_table_is_one_walk_of_proc(tmp_path: Path) -> None:
    for pid, ppid in ((1, 0), (10, 1), (11, 10)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat_line(pid, "x", ppid, pid, 0))
    (tmp_path / "self").mkdir()  # not a pid
    (tmp_path / "12").mkdir()  # gone between the listing and the read: no stat file
    table = process_table(tmp_path)
    assert sorted(table) == [1, 10, 11]
    assert table[11].ppid == 10 and table[11].own == 11


def test_descendants_are_children_then_grandchildren() -> None:
    table = _table(
        Stat(1, 0, 0, 0, 0), Stat(5, 1, 0, 0, 0), Stat(3, 1, 0, 0, 0), Stat(9, 3, 0, 0, 0),
        Stat(4, 5, 0, 0, 0), Stat(8, 2, 0, 0, 0),
    )  # fmt: skip
    assert descendants(1, table) == [3, 5, 4, 9]
    assert descendants(9, table) == []
    assert descendants(77, table) == []


def test_a_child_is_found_by_its_name_and_its_command_line(tmp_path: Path) -> None:
    processes = {
        20: (1, "redis-server", ["redis-server", "--port", "6380"]),  # another parent's
        21: (2, "redis-server", ["redis-server", "--port", "6381"]),
        22: (2, "redis-server", ["/usr/bin/redis-server 127.0.0.1:6380", "", ""]),  # retitled
        23: (2, "sleep", ["sleep", "--port", "6380"]),
        24: (2, "redis-server", ["redis-server", "--port", "6380"]),
    }
    for pid, (ppid, comm, argv) in processes.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat_line(pid, comm, ppid, 0, 0))
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
        (tmp_path / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    texts = (":6380", "--port 6380")
    assert find_child(2, "redis-server", *texts, proc=tmp_path) == 22  # the lowest pid first
    assert find_child(2, "redis-server", "--port 6380", proc=tmp_path) == 24
    assert find_child(2, "sleep", *texts, proc=tmp_path) == 23
    assert find_child(2, "redis-server", ":6399", proc=tmp_path) is None
    assert find_child(3, "redis-server", *texts, proc=tmp_path) is None


FAMILY = _table(
    Stat(100, 1, own=50, reaped=7, started=10),  # a worker's main process
    Stat(101, 100, own=200, reaped=0, started=11),  # its pool
    Stat(102, 100, own=300, reaped=0, started=12),
    Stat(103, 101, own=5, reaped=0, started=13),  # a grandchild
    Stat(200, 1, own=80, reaped=40, started=20),  # the bench process itself
)


def test_a_tree_is_one_row_with_its_descendants_and_reaped_children() -> None:
    rows = ticks_by_row([Watched("celery worker", 100)], FAMILY)
    assert rows == {("celery worker", 100, 10): 50 + 7 + 200 + 300 + 5}


def test_split_makes_a_row_of_each_descendant() -> None:
    rows = ticks_by_row([Watched("celery worker", 100, "split")], FAMILY)
    assert rows == {
        ("celery worker: main process", 100, 10): 57,
        ("celery worker: child 1", 101, 11): 200,
        ("celery worker: child 2", 102, 12): 300,
        ("celery worker: child 3", 103, 13): 5,
    }


def test_own_counts_only_the_process_threads_not_its_children() -> None:
    # Its children (the load generator) have rows of their own.
    rows = ticks_by_row([Watched("bench process", 200, "own")], FAMILY)
    assert rows == {("bench process", 200, 20): 80}


def test_a_watched_process_that_is_not_running_makes_no_row() -> None:
    assert ticks_by_row([Watched("broker", 999)], FAMILY) == {}


def _snapshot(
    at: float, rows: dict[tuple[str, int, int], int], machine: dict[str, int]
) -> Snapshot:
    return Snapshot(at=at, rows=rows, machine=machine)


def test_a_report_is_cpu_per_job_share_and_cores_with_the_rest_of_the_machine() -> None:
    before = _snapshot(10.0, {("broker", 7, 1): 1000, ("leader node", 8, 2): 500},
                       _machine(user=10_000, system=2000, idle=50_000, steal=100))  # fmt: skip
    after = _snapshot(12.0, {("broker", 7, 1): 1100, ("leader node", 8, 2): 650},
                      _machine(user=10_250, system=2050, idle=50_080, steal=120))  # fmt: skip
    report = build_report(before, after, 1000, tick_s=0.01, nproc=2,
                          added=[("load generator", 9, 0.5)])  # fmt: skip
    assert (report.jobs, report.seconds, report.nproc) == (1000, 2.0, 2)
    assert (report.machine_busy_s, report.steal_s) == (3.0, 0.2)
    rows = {row.role: row for row in report.rows}
    assert list(rows) == ["broker", "leader node", "load generator", OTHER]
    assert (rows["broker"].pid, rows["broker"].cpu_s, rows["broker"].us_per_job) == (7, 1.0, 1000.0)
    assert (rows["broker"].share, rows["broker"].cores) == (0.333, 0.5)
    assert rows["leader node"].cpu_s == 1.5
    assert rows["load generator"].us_per_job == 500.0
    assert (rows[OTHER].pid, rows[OTHER].cpu_s) == (None, 0.0)
    assert report.total_s == pytest.approx(3.0)
    assert report.notes == []


def test_a_process_started_inside_the_window_counts_from_zero_and_one_gone_is_noted() -> None:
    before = _snapshot(0.0, {("worker: child 1", 30, 5): 400, ("broker", 7, 1): 10}, {})
    # pid 30 is another process now (another start time): all of its time is in the window.
    after = _snapshot(1.0, {("worker: child 1", 30, 6): 25, ("worker: child 2", 31, 7): 5}, {})
    report = build_report(before, after, 10, tick_s=0.01, nproc=2)
    assert [(row.role, row.cpu_s) for row in report.rows] == [
        ("worker: child 1", 0.25), ("worker: child 2", 0.05),
    ]  # fmt: skip
    assert report.notes == ["broker (pid 7) ended inside the window: not counted"]
    # Without /proc/stat's counters there is no machine row and no share.
    assert report.machine_busy_s is None and report.steal_s is None
    assert all(row.share is None for row in report.rows)


def test_the_table_has_a_row_per_process_and_a_total() -> None:
    before = _snapshot(0.0, {("broker", 7, 1): 0}, _machine(0, 0, 0))
    after = _snapshot(4.0, {("broker", 7, 1): 300}, _machine(user=500, system=100, idle=200))
    report = build_report(before, after, 20_000, tick_s=0.01, nproc=2,
                          added=[("load generator (4 clients, batch 500)", 9, 1.25)])  # fmt: skip
    lines = format_table(report, "CPU per job by process, measured phase").splitlines()
    assert lines[0] == (
        "CPU per job by process, measured phase: 20,000 jobs in 4.00 s on 2 cores; "
        "machine busy 6.00 CPU-s (75% of its cores), stolen 0.00 CPU-s"
    )
    assert lines[1].split() == ["process", "pid", "CPU", "s", "µs/job", "share", "cores"]
    body = [line.split("  ") for line in lines[3:6]]
    assert [[cell.strip() for cell in cells if cell.strip()] for cells in body] == [
        ["broker", "7", "3.00", "150", "50%", "0.75"],
        ["load generator (4 clients, batch 500)", "9", "1.25", "62", "21%", "0.31"],
        [OTHER, "1.75", "88", "29%", "0.44"],
    ]
    assert lines[-1].split() == ["total", "6.00", "300", "100%", "1.50"]
    # Every line of the table lines up: the columns end at the same place.
    assert len({len(line) for line in lines[1:] if not line.startswith("total")}) <= 2


def test_a_report_survives_json() -> None:
    before = _snapshot(0.0, {("broker", 7, 1): 0}, _machine(0, 0, 0))
    after = _snapshot(2.0, {("broker", 7, 1): 100}, _machine(user=150, system=0, idle=250))
    report = build_report(before, after, 100, tick_s=0.01, nproc=2)
    assert CpuReport.from_dict(json.loads(json.dumps(report.as_dict()))) == report


def test_a_window_on_this_process_reads_its_cpu_and_the_machines() -> None:
    window = CpuWindow([Watched("this test", os.getpid(), "own"), Watched("gone", 2**22 + 1)])
    with pytest.raises(RuntimeError, match="not started"):
        window.report(1)
    window.start()
    sum(range(100_000))
    window.stop()
    window.add("a process that ended", None, 0.0)
    report = window.report(1000)
    roles = [row.role for row in report.rows]
    assert roles == ["this test", "a process that ended", OTHER]
    assert report.rows[0].pid == os.getpid()
    assert report.rows[0].cpu_s >= 0 and report.machine_busy_s is not None
    assert report.nproc == os.cpu_count()


def test_the_cpu_of_ended_children_grows_once_one_is_waited_for() -> None:
    before = children_cpu_s()
    subprocess.run([sys.executable, "-c", "sum(range(10**6))"], check=True)
    assert children_cpu_s() >= before
