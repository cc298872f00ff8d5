"""The peer comparison's pure parts: ratios, the table, dispatch's output, Redis's command line.

None of it needs celery, dramatiq or redis-py (CI does not install the `peers` extra).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from dispatch.bench import peers
from dispatch.bench.peer_tasks.redis_server import (
    RedisBinary,
    library_packages,
    missing_sonames,
    redis_argv,
)
from dispatch.bench.peer_tasks.runner import PEERS, PeerResult, peer_processes
from dispatch.bench.peers import (
    DispatchResult,
    comparison_rows,
    parse_dispatch,
    ratio,
    run_dispatch,
)
from dispatch.bench.process_cpu import CpuReport, Snapshot, Watched, build_report

DISPATCH_OK = DispatchResult(
    "ok", jobs_per_s=3000.0, submit_requests_per_s=4000.0, sdk_loop_jobs_per_s=900.0
)
CELERY = PeerResult(
    "Celery", "prefork", e2e_jobs_per_s=1000.0, e2e_seconds=20.0, e2e_submit_per_s=1100.0,
    completed=20_000, enqueue_per_s=450.0, enqueue_seconds=44.4,
)  # fmt: skip
DRAMATIQ = PeerResult(
    "Dramatiq", "2x8", e2e_jobs_per_s=1500.0, e2e_seconds=13.3, e2e_submit_per_s=1600.0,
    completed=20_000, enqueue_per_s=3600.0, enqueue_seconds=5.6,
)  # fmt: skip


def rendered(dispatch: DispatchResult, results: list[PeerResult]) -> str:
    console = Console(record=True, width=200)
    console.print(peers.table(dispatch, results))
    return console.export_text()


def test_a_ratio_is_dispatch_over_the_peer_and_none_without_both() -> None:
    assert ratio(3000.0, 1000.0) == 3.0
    assert ratio(900.0, 3600.0) == 0.25
    assert ratio(None, 1000.0) is None
    assert ratio(3000.0, None) is None
    assert ratio(3000.0, 0.0) is None


def test_rows_put_each_dispatch_figure_beside_the_peers_with_ratios() -> None:
    rows = {row.measure: row for row in comparison_rows(DISPATCH_OK, [CELERY, DRAMATIQ])}
    e2e = rows["end to end jobs/s"]
    assert e2e.dispatch == 3000.0
    assert e2e.peers == {"Celery": 1000.0, "Dramatiq": 1500.0}
    assert e2e.ratios == {"Celery": 3.0, "Dramatiq": 2.0}
    loop = rows["single-job enqueue/s, one loop"]
    assert loop.dispatch == 900.0
    assert loop.peers == {"Celery": 450.0, "Dramatiq": 3600.0}
    assert loop.ratios == {"Celery": 2.0, "Dramatiq": 0.25}
    concurrent = rows["single-job enqueue/s, concurrent"]
    assert concurrent.dispatch == 4000.0
    assert concurrent.peers == {"Celery": None, "Dramatiq": None}
    assert concurrent.ratios == {"Celery": None, "Dramatiq": None}


def test_the_table_shows_figures_and_ratios() -> None:
    text = rendered(DISPATCH_OK, [CELERY, DRAMATIQ])
    line = next(line for line in text.splitlines() if "end to end jobs/s" in line)
    assert line.split("│")[1:-1] == [
        " end to end jobs/s                ",
        "    3,000 ",
        "  1,000 ",
        "    1,500 ",
        "           3.00x ",
        "             2.00x ",
    ]
    assert "dispatch/Celery" in text and "dispatch/Dramatiq" in text


def test_a_failed_dispatch_run_shows_as_failed_beside_the_peers_figures() -> None:
    failed = DispatchResult("failed", error="No such option: --clients")
    rows = comparison_rows(failed, [CELERY, DRAMATIQ])
    assert all(row.dispatch is None for row in rows)
    assert all(value is None for row in rows for value in row.ratios.values())
    text = rendered(failed, [CELERY, DRAMATIQ])
    line = next(line for line in text.splitlines() if "end to end jobs/s" in line)
    assert [cell.strip() for cell in line.split("│")[1:-1]] == [
        "end to end jobs/s", "failed", "1,000", "1,500", "n/a", "n/a",
    ]  # fmt: skip
    skipped = rendered(DispatchResult("skipped"), [CELERY])
    assert "skipped" in skipped and "failed" not in skipped


def test_a_failed_peer_shows_as_failed_and_not_as_missing() -> None:
    broken = PeerResult("Celery", "prefork", error="PeerFailure: workers not ready")
    text = rendered(DISPATCH_OK, [broken, DRAMATIQ])
    line = next(line for line in text.splitlines() if "one loop" in line)
    assert [cell.strip() for cell in line.split("│")[1:-1]] == [
        "single-job enqueue/s, one loop", "900", "failed", "3,600", "n/a", "0.25x",
    ]  # fmt: skip


def test_dispatch_figures_are_read_from_its_json_even_after_log_lines() -> None:
    figures = {"jobs_per_s": 2500.5, "submit_requests_per_s": 4100, "sdk_loop_jobs_per_s": 850.0}
    output = "starting the broker\nINFO something\n" + json.dumps(figures, indent=2) + "\n"
    result = parse_dispatch(output)
    assert result.status == "ok"
    assert (result.jobs_per_s, result.submit_requests_per_s, result.sdk_loop_jobs_per_s) == (
        2500.5,
        4100.0,
        850.0,
    )
    partial = parse_dispatch(json.dumps({"jobs_per_s": 10.0, "sdk_loop_jobs_per_s": None}))
    assert partial.jobs_per_s == 10.0
    assert partial.sdk_loop_jobs_per_s is None and partial.submit_requests_per_s is None
    with pytest.raises(ValueError):
        parse_dispatch("Traceback (most recent call last):\n")
    with pytest.raises(ValueError, match="no JSON object"):
        parse_dispatch("[1, 2]")


def test_the_dispatch_command_line_asks_for_single_job_requests() -> None:
    argv = peers.dispatch_argv(20_000, 64)
    assert argv[1:] == [
        "bench", "--json", "--batch", "1", "--clients", "64", "--jobs", "20000",
        "--sdk-loop", "5000",
    ]  # fmt: skip


def test_a_dispatch_run_that_fails_keeps_its_stderr_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "dispatch"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "print('\\n'.join(f'line {n}' for n in range(40)), file=sys.stderr)\n"
        "print('No such option: --clients', file=sys.stderr)\nsys.exit(2)\n"
    )
    script.chmod(0o755)
    monkeypatch.setattr(peers, "DISPATCH", str(script))
    result = run_dispatch(100, 4)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.endswith("No such option: --clients")
    assert "line 39" in result.error and "line 10" not in result.error


def test_the_peers_table_is_printed_when_the_dispatch_run_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class FakeRedis(RedisBinary):
        def version(self) -> str:
            return "7.0.15"

    monkeypatch.setattr(peers, "missing_extra", list)
    monkeypatch.setattr(peers, "find_redis", lambda: FakeRedis(Path("/nonexistent")))
    monkeypatch.setattr(
        peers, "run_dispatch", lambda jobs, clients: DispatchResult("failed", error="boom")
    )
    monkeypatch.setattr(peers, "run_peers", lambda binary, jobs: [CELERY, DRAMATIQ])
    assert peers.main(["--jobs", "100"]) == 0
    out = capsys.readouterr().out
    assert "dispatch bench failed: boom" in out
    assert "1,500" in out and "redis-server 7.0.15" in out and "load average" in out
    assert "Dramatiq (2x8): end to end 13.30 s" in out
    assert peers.main(["--jobs", "100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dispatch"]["status"] == "failed"
    assert report["peers"]["Dramatiq"]["e2e_jobs_per_s"] == 1500.0
    assert report["rows"][0]["ratios"] == {"Celery": None, "Dramatiq": None}


def test_redis_runs_with_aof_fsynced_every_second_on_loopback(tmp_path: Path) -> None:
    argv = redis_argv(Path("/opt/redis-server"), 6399, tmp_path)
    assert argv[0] == "/opt/redis-server"
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert options["--save"] == ""  # no RDB snapshot forks during a run
    assert options["--bind"] == "127.0.0.1"
    assert options["--port"] == "6399"
    assert options["--dir"] == str(tmp_path)
    assert options["--daemonize"] == "no"  # stopped by the pid the bench started


def test_missing_libraries_and_the_packages_to_fetch_are_read() -> None:
    ldd = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibatomic.so.1 => /lib/x86_64-linux-gnu/libatomic.so.1 (0x00007f57)\n"
        "\tliblzf.so.1 => not found\n"
        "\tlibjemalloc.so.2 => not found\n"
    )
    assert missing_sonames(ldd) == ["liblzf.so.1", "libjemalloc.so.2"]
    depends = (
        "adduser, libatomic1 (>= 4.8), libc6 (>= 2.34), libjemalloc2 (>= 3.5.0), "
        "liblzf1 (>= 1.5), libssl3 (>= 3.0.0), libsystemd0 | libelogind0\n"
    )
    assert library_packages(depends) == [
        "libatomic1", "libc6", "libjemalloc2", "liblzf1", "libssl3", "libsystemd0",
    ]  # fmt: skip


def _cpu_report(role: str, cpu_s: float) -> CpuReport:
    before = Snapshot(0.0, {(role, 7, 1): 0}, {})
    after = Snapshot(2.0, {(role, 7, 1): int(cpu_s * 100)}, {})
    return build_report(before, after, 100, tick_s=0.01, nproc=2)


def test_cpu_tables_are_dispatchs_from_its_json_then_each_peers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = {"jobs_per_s": 3000.0, "seconds": 6.7, "raw_kafka_records_per_s": 18000.5,
           "cpu": _cpu_report("leader node", 0.5).as_dict(), "sdk_loop_cpu": None}  # fmt: skip
    dispatch = parse_dispatch(json.dumps(raw))
    celery = dataclasses.replace(CELERY, cpu=_cpu_report("redis-server", 0.25))
    tables = peers.cpu_tables(dispatch, [celery, DRAMATIQ])  # Dramatiq has none: no table
    assert [table.splitlines()[0].split(":")[0] for table in tables] == [
        "dispatch, end to end", "Celery, end to end",
    ]  # fmt: skip
    assert "leader node" in tables[0] and "5,000" in tables[0]  # 0.5 s over 100 jobs
    assert "redis-server" in tables[1]

    class FakeRedis(RedisBinary):
        def version(self) -> str:
            return "7.0.15"

    monkeypatch.setattr(peers, "missing_extra", list)
    monkeypatch.setattr(peers, "find_redis", lambda: FakeRedis(Path("/nonexistent")))
    monkeypatch.setattr(peers, "run_dispatch", lambda jobs, clients: dispatch)
    monkeypatch.setattr(peers, "run_peers", lambda binary, jobs: [celery, DRAMATIQ])
    assert peers.main(["--jobs", "100"]) == 0
    out = capsys.readouterr().out
    assert "Celery, end to end: CPU per job by process" in out
    assert "end to end 6.7 s; raw kafka-python in the same run 18000.5 records/s" in out
    assert peers.main(["--jobs", "100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["peers"]["Celery"]["cpu"]["rows"][0]["role"] == "redis-server"
    assert report["peers"]["Dramatiq"]["cpu"] is None


def test_a_peers_processes_are_its_redis_its_workers_split_and_this_process(
    tmp_path: Path,
) -> None:
    # A child of this process with the name and the command line of the run's redis-server:
    # a Python that waits, run through a link called redis-server.
    (tmp_path / "redis-server").symlink_to(sys.executable)
    child = subprocess.Popen(
        [tmp_path / "redis-server", "-c", "import sys; sys.stdin.read()", "--port", "6399"],
        stdin=subprocess.PIPE,
    )
    try:
        watched = peer_processes(PEERS[0], "redis://127.0.0.1:6399/0", 4242)
    finally:
        child.communicate(b"")
    assert watched == [
        Watched("redis-server", child.pid),
        Watched("celery worker", 4242, "split"),
        Watched("producer loop (the bench process)", os.getpid(), "own"),
    ]
    # No such Redis: no row for it (the rest of the machine holds it).
    assert [w.role for w in peer_processes(PEERS[1], "redis://127.0.0.1:6398/0", 4242)] == [
        "dramatiq worker", "producer loop (the bench process)",
    ]  # fmt: skip
