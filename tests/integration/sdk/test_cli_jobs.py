"""The job commands against a real node: through typer's runner with `register` applied,
and as real processes (`python -m dispatch.cli`), including SIGTERM to a worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from dispatch.cli import app
from dispatch.cli_jobs import EXIT_ERROR, EXIT_JOB_FAILED, EXIT_TIMEOUT, EXIT_USAGE, register
from dispatch.client import Client
from dispatch.worker.examples import app as demo_app
from tests.integration.api.conftest import RunningNode
from tests.integration.sdk.conftest import running_worker, visible, wait_until

pytestmark = pytest.mark.integration

register(app)
runner = CliRunner()


def _env(node: RunningNode, role: str = "admin") -> dict[str, str]:
    # A wide terminal for rich, so table cells are not wrapped mid-word in the asserts.
    return {"DISPATCH_URL": node.url, "DISPATCH_API_KEY": node.keys[role], "COLUMNS": "200"}


def _run(node: RunningNode, *args: str, role: str = "admin") -> Result:
    return runner.invoke(app, list(args), env=_env(node, role))


def _json(result: Result) -> object:
    return json.loads(result.stdout)


def test_submit_wait_status_and_dead_letters(api_node: RunningNode, tmp_path: Path) -> None:
    with running_worker(demo_app, api_node, concurrency=2):
        queued = _run(api_node, "submit", "demo.echo", "--payload", '{"x": 1}', "--id", "e1")
        assert queued.exit_code == 0, queued.output
        assert "accepted job e1" in queued.stdout

        done = _run(api_node, "submit", "demo.echo", "--payload", "[1, 2]", "--wait", "--json")
        assert done.exit_code == 0, done.output
        job = _json(done)
        assert isinstance(job, dict) and (job["status"], job["result"]) == ("succeeded", [1, 2])

        flaky = _run(api_node, "submit", "demo.flaky", "--id", "f1", "--wait")
        assert flaky.exit_code == 0, flaky.output
        assert "succeeded" in flaky.stdout and "2 of" in flaky.stdout

        failed = _run(api_node, "submit", "demo.fail", "--id", "bad1", "--wait", "--timeout", "20")
        assert failed.exit_code == EXIT_JOB_FAILED, failed.output
        assert "dead" in failed.stdout and "permanent_failure" in failed.stdout

    status = _run(api_node, "status", "e1")
    assert status.exit_code == 0 and "succeeded" in status.stdout and '{"x": 1}' in status.stdout
    shown = _json(_run(api_node, "status", "e1", "--json"))
    assert isinstance(shown, dict) and (shown["id"], shown["result"]) == ("e1", {"x": 1})
    missing = _run(api_node, "status", "no-such-job")
    assert missing.exit_code == EXIT_ERROR
    assert missing.stderr.strip().splitlines() == ["error: not_found: no job 'no-such-job'"]

    listed = _run(api_node, "dlq", "list")
    assert (
        listed.exit_code == 0 and "bad1" in listed.stdout and "permanent_failure" in listed.stdout
    )
    assert _json(_run(api_node, "dlq", "list", "--exec", "demo.other", "--json")) == []
    assert "empty" in _run(api_node, "dlq", "list", "--exec", "demo.other").stdout
    redriven = _run(api_node, "dlq", "redrive", "bad1")
    assert redriven.exit_code == 0 and "queued" in redriven.stdout
    again = _run(api_node, "dlq", "redrive", "bad1")
    assert again.exit_code == EXIT_ERROR and again.stderr.startswith("error: not_dead:")

    forbidden = _run(api_node, "dlq", "list", role="client")
    assert forbidden.exit_code == EXIT_ERROR and forbidden.stderr.startswith("error: forbidden:")

    # Nobody serves this exec: --wait gives up after its timeout, with its own exit code.
    timed_out = _run(api_node, "submit", "nobody.home", "--wait", "--timeout", "0.5")
    assert timed_out.exit_code == EXIT_TIMEOUT, timed_out.output
    assert "still queued" in timed_out.stderr


def test_submit_a_jsonl_file_in_batches(api_node: RunningNode, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    lines = [json.dumps({"exec": "file.job", "payload": n, "id": f"file{n}"}) for n in range(1500)]
    jobs.write_text("\n".join([*lines[:3], "", *lines[3:]]) + "\n")
    submitted = _run(api_node, "submit", "--file", str(jobs), "--json")
    assert submitted.exit_code == 0, submitted.output
    summary = _json(submitted)
    assert isinstance(summary, dict)
    assert (summary["submitted"], summary["new"], summary["existing"]) == (1500, 1500, 0)
    with Client(api_node.url, api_node.keys["admin"]) as admin:
        assert visible(admin, "file1499").payload == 1499
    # Known to the leader now: the same file again enqueues nothing.
    human = _run(api_node, "submit", "--file", str(jobs))
    assert human.exit_code == 0, human.output
    assert "submitted 1500 jobs (0 new, 1500 already known)" in human.stdout

    broken = tmp_path / "broken.jsonl"
    broken.write_text(lines[0] + "\n" + '{"exec": "file.job", "colour": "red"}\n')
    refused = _run(api_node, "submit", "--file", str(broken))
    assert refused.exit_code == EXIT_USAGE
    assert refused.stderr.strip() == f"error: {broken}:2: colour: Extra inputs are not permitted"


def test_status_without_an_id_still_shows_the_local_stack(api_node: RunningNode) -> None:
    result = _run(api_node, "status")
    assert result.exit_code in (0, 3), result.output  # 3: some component is not running
    assert "component" in result.stdout


# --- real processes -------------------------------------------------------------------------


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


def _dispatch(node: RunningNode, *args: str, role: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatch.cli", *args],
            env={**os.environ, **_env(node, role)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def test_a_command_runs_as_a_real_process(api_node: RunningNode) -> None:
    submitted = subprocess.run(
        [sys.executable, "-m", "dispatch.cli", "submit", "proc.job", "--id", "p1", "--json"],
        env={**os.environ, **_env(api_node, "client")},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr.decode()
    answer = json.loads(submitted.stdout)
    # (A `warning` may come too: nothing serves proc.job.)
    assert {key: answer[key] for key in ("id", "status", "existing")} == {
        "id": "p1", "status": "queued", "existing": False,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("transport", "grace_s", "seconds", "expected"),
    [("ws", 20, 1.5, ("succeeded", 1)), ("rest", 0.2, 60, ("retrying", 1))],
    ids=["ws-finishes", "rest-releases"],
)
def test_sigterm_lets_a_worker_process_finish_or_release_its_jobs(
    api_node: RunningNode,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    transport: str,
    grace_s: float,
    seconds: float,
    expected: tuple[str, int],
) -> None:
    log = tmp_path / "worker.log"
    worker = _dispatch(
        api_node, "worker", "--app", "dispatch.worker.examples:app", "--transport", transport,
        "--grace", str(grace_s), "--worker-id", "proc-worker", "--concurrency", "2",
        role="worker", log=log,
    )  # fmt: skip
    processes.append(worker)
    with Client(api_node.url, api_node.keys["admin"]) as admin:
        wait_until(
            lambda: (
                worker.poll() is None and "proc-worker" in [w.worker_id for w in admin.workers()]
            ),
            timeout_s=60,
            what=f"the worker process to join:\n{log.read_text()}",
        )
        for n in range(2):
            admin.submit("demo.sleep", {"seconds": seconds}, id=f"sleep{n}")
        wait_until(
            lambda: all(visible(admin, f"sleep{n}").status == "running" for n in range(2)),
            what="both jobs to run",
        )
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
        assert time.monotonic() - stopped_at < grace_s + 10
        for n in range(2):
            job = admin.get(f"sleep{n}")
            assert (job.status, job.attempts) == expected, (job, log.read_text())
        assert "proc-worker: stopped" in log.read_text()


USER_WORKER = """\
from dispatch.worker import Assignment, WorkerApp

app = WorkerApp("mine")


@app.handler("mine.greet")
def greet(job: Assignment) -> str:
    return f"hello {job.payload}"
"""


def test_a_user_module_named_worker_is_the_app_it_names(
    api_node: RunningNode, processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """The natural names of a user's modules (worker.py, api.py, tasks.py, streaming.py) shadow
    none of ours: the project installs only `dispatch` at top level."""
    (tmp_path / "worker.py").write_text(USER_WORKER)
    for name in ("api", "tasks", "streaming", "bench"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('a user module was imported')\n")
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [sys.executable, "-m", "dispatch.cli", "worker", "--app", "worker:app"],
            env={**os.environ, **_env(api_node, "worker")},
            cwd=tmp_path,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    processes.append(worker)
    with Client(api_node.url, api_node.keys["client"]) as client:
        client.submit("mine.greet", "you", id="greet-1")
        job = client.wait("greet-1", timeout_s=60)
    assert (job.status, job.result) == ("succeeded", "hello you"), log.read_text()
    assert worker.poll() is None, log.read_text()


# --- failing fast, and a worker that starts or stops while nothing runs ---------------------


def _closed_port_url() -> str:
    from dispatch.stack.ports import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def _worker_process(
    url: str, log: Path, transport: str = "ws", key: str = "unused"
) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatch.cli", "worker", "--app",
             "dispatch.worker.examples:app", "--transport", transport],
            env={**os.environ, "DISPATCH_URL": url, "DISPATCH_API_KEY": key},
            stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def _sigterm_seconds(worker: subprocess.Popen[bytes], log: Path) -> float:
    stopped_at = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, log.read_text()
    return time.monotonic() - stopped_at


def test_a_worker_says_at_once_that_no_node_answers_and_keeps_trying(
    processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Started before the stack, a worker says so within a second or two (not after its retry
    budget), keeps retrying, and stops at once on SIGTERM."""
    log = tmp_path / "worker.log"
    worker = _worker_process(_closed_port_url(), log)
    processes.append(worker)
    wait_until(lambda: "cannot reach" in log.read_text(), timeout_s=8, what="the first failure")
    first = log.read_text()
    assert "dispatch up --detach" in first and "retrying" in first, first
    # At once: the start line and the failure's are stamped within a second of each other.
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in first.splitlines()
        if " transport, concurrency " in line or "cannot reach" in line
    ]
    assert len(stamps) == 2 and (stamps[1] - stamps[0]).total_seconds() < 1.0, first
    time.sleep(2)
    assert worker.poll() is None, log.read_text()  # still trying, not given up
    assert _sigterm_seconds(worker, log) < 2.0, log.read_text()


@pytest.mark.parametrize("transport", ["ws", "rest"])
def test_sigterm_stops_an_idle_connected_worker_at_once(
    api_node: RunningNode,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    transport: str,
) -> None:
    log = tmp_path / "worker.log"
    worker = _worker_process(api_node.url, log, transport, api_node.keys["worker"])
    processes.append(worker)
    with Client(api_node.url, api_node.keys["admin"]) as admin:
        wait_until(
            lambda: worker.poll() is None and len(admin.workers()) == 1,
            timeout_s=60,
            what=f"the worker to join:\n{log.read_text()}",
        )
    time.sleep(1.0)  # idle, in the middle of a long-poll or a quiet socket
    assert _sigterm_seconds(worker, log) < 2.0, log.read_text()
    assert "stopped" in log.read_text()


def test_without_a_key_each_command_uses_the_development_key_of_its_role(
    api_node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first-hour flow with no key configured: submit and status as the client, the
    dead-letter queue as the admin (a client key is refused there); --api-key wins."""
    monkeypatch.delenv("DISPATCH_API_KEY", raising=False)
    env = {"DISPATCH_URL": api_node.url, "COLUMNS": "200",
           "DISPATCH_AUTH__DEV_KEYS_FILE": str(api_node.settings.auth.dev_keys_file)}  # fmt: skip

    def run(*args: str) -> Result:
        return runner.invoke(app, list(args), env=env)

    submitted = run("submit", "keyless.job", "--id", "k1", "--json")
    assert submitted.exit_code == 0, submitted.output
    with Client(api_node.url, api_node.keys["client"]) as client:
        assert visible(client, "k1").client_id == "dev"
    assert run("status", "k1").exit_code == 0
    listed = run("dlq", "list", "--json")
    assert listed.exit_code == 0 and _json(listed) == [], listed.output
    as_client = run("dlq", "list", "--api-key", api_node.keys["client"])
    assert as_client.exit_code == EXIT_ERROR and as_client.stderr.startswith("error: forbidden:")


def test_pause_resume_purge_and_cancel_from_the_shell(api_node: RunningNode) -> None:
    paused = _run(api_node, "pause", "--exec", "cli.*", "--reason", "deploy")
    assert paused.exit_code == 0, paused.output
    assert "cli.*" in paused.stdout and "deploy" in paused.stdout
    for n in range(3):
        queued = _run(api_node, "submit", "cli.work", "--id", f"c{n}", "--max-run", "60")
        assert queued.exit_code == 0, queued.output
    listed = _json(_run(api_node, "pause", "--json"))
    assert isinstance(listed, list) and [p["target"] for p in listed] == ["cli.*"]

    cancelled = _run(api_node, "cancel", "c0", "--reason", "not needed", "--json")
    assert cancelled.exit_code == 0, cancelled.output
    job = _json(cancelled)
    assert isinstance(job, dict) and job["status"] == "cancelled" and job["max_run_s"] == 60
    purged = _run(api_node, "purge", "--exec", "cli.>")
    assert purged.exit_code == 0 and "purged 2 queued job(s)" in purged.stdout, purged.output

    resumed = _run(api_node, "resume", "--exec", "cli.*")
    assert resumed.exit_code == 0 and "nothing is paused" in resumed.stdout, resumed.output
    with Client(api_node.url, api_key=api_node.keys["client"]) as client:
        assert [client.get(f"c{n}").status for n in range(3)] == ["cancelled"] * 3
        assert client.get("c0").error == "not needed"


def test_limits_set_list_and_remove_from_the_shell(api_node: RunningNode) -> None:
    empty = _run(api_node, "limits")
    assert empty.exit_code == 0 and "no limits are in force" in empty.stdout, empty.output
    limited = _run(api_node, "limits", "set", "key", "cli:acct", "--max-inflight", "1",
                   "--reason", "one at a time")  # fmt: skip
    assert limited.exit_code == 0, limited.output
    assert "cli:acct" in limited.stdout and "one at a time" in limited.stdout
    rated = _run(api_node, "limits", "set", "exec", "cli.>", "--rate", "2.5", "--json")
    assert rated.exit_code == 0, rated.output
    views = _json(rated)
    assert isinstance(views, list) and len(views) == 1
    assert (views[0]["rate"], views[0]["burst"], views[0]["source"]) == (2.5, 3, "runtime")

    for n in range(2):
        submitted = _run(api_node, "submit", "cli.keyed", "--id", f"ck{n}", "--key", "cli:acct")
        assert submitted.exit_code == 0, submitted.output
    with Client(api_node.url, api_node.keys["client"]) as client:
        assert visible(client, "ck1").key == "cli:acct"
    shown = _run(api_node, "status", "ck0")
    assert shown.exit_code == 0 and "cli:acct" in shown.stdout, shown.output

    listed = _json(_run(api_node, "limits", "--json"))
    assert isinstance(listed, list)
    assert sorted((limit["scope"], limit["target"]) for limit in listed) == [
        ("exec", "cli.>"), ("key", "cli:acct"),
    ]  # fmt: skip
    table = _run(api_node, "limits")
    assert table.exit_code == 0 and "cli:acct" in table.stdout and "cli.>" in table.stdout

    refused = _run(api_node, "limits", "set", "key", "a*b", "--max-inflight", "1")
    assert refused.exit_code == EXIT_ERROR and "key" in refused.stderr, refused.output
    removed = _run(api_node, "limits", "rm", "key", "cli:acct")
    assert removed.exit_code == 0 and "removed key cli:acct" in removed.stdout, removed.output
    again = _run(api_node, "limits", "rm", "key", "cli:acct", "--json")
    assert again.exit_code == 0 and _json(again) == {"removed": False, "limit": None}
    as_client = _run(api_node, "limits", role="client")
    assert as_client.exit_code == EXIT_ERROR and as_client.stderr.startswith("error: forbidden:")
