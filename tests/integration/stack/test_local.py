"""`dispatch up --detach`, `status` and `down` as a user runs them, as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from dispatch.client import Client
from dispatch.stack.ports import free_port
from dispatch.stack.process import is_running
from tests.integration.leftovers import processes_mentioning

pytestmark = pytest.mark.integration

DISPATCH = str(Path(sys.executable).parent / "dispatch")


class Cli:
    def __init__(self, var: Path) -> None:
        self.var = var
        self.bootstrap = f"127.0.0.1:{free_port()}"
        self.api_port = free_port()
        self.standby_port = free_port()
        self.env = {
            **os.environ,
            "DISPATCH_PATHS__VAR": str(var),
            "DISPATCH_KAFKA__BOOTSTRAP": self.bootstrap,
            "DISPATCH_KAFKA__CONTROLLER_PORT": str(free_port()),
            "DISPATCH_API__PORTS": json.dumps([self.api_port, self.standby_port]),
            "COLUMNS": "200",
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [DISPATCH, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    def broker_pid(self) -> int | None:
        return self._pid(self.var / "kafka" / "broker.pid")

    def api_pid(self) -> int | None:
        return self.pid_of(f"api-{self.api_port}")

    def pid_of(self, component: str) -> int | None:
        return self._pid(self.var / "run" / f"{component}.pid")

    @staticmethod
    def _pid(pid_file: Path) -> int | None:
        return int(json.loads(pid_file.read_text())["pid"]) if pid_file.exists() else None


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    cli = Cli(tmp_path / "var")
    try:
        yield cli
    finally:
        # Stop what this test started even when it failed half-way.
        cli.run("down")


def test_up_detach_runs_everything_and_down_leaves_no_process_behind(cli: Cli) -> None:
    started = cli.run("up", "--detach", "--workers", "1")
    assert started.returncode == 0, started.stderr
    assert "running" in started.stdout
    assert "dispatch.submit" in started.stdout
    names = ["broker", "streaming", f"api-{cli.api_port}", f"api-{cli.standby_port}", "worker-1"]
    pids = {name: cli.broker_pid() if name == "broker" else cli.pid_of(name) for name in names}
    for name, pid in pids.items():
        assert pid is not None and is_running(pid), f"{name} is not running"
    leader = httpx.get(f"http://127.0.0.1:{cli.api_port}/readyz", timeout=5)
    standby = httpx.get(f"http://127.0.0.1:{cli.standby_port}/readyz", timeout=5)
    assert sorted([leader.json()["role"], standby.json()["role"]]) == ["follower", "leader"]

    status = cli.run("status")
    assert status.returncode == 0
    assert all(str(pid) in status.stdout for pid in pids.values())

    # The whole path: the demo worker runs a job, the streaming fold puts it in Delta.
    keys = json.loads((cli.var / "dev-keys.json").read_text())
    urls = [f"http://127.0.0.1:{port}" for port in (cli.standby_port, cli.api_port)]
    with Client(urls, keys["client"]) as client:  # a follower first: it must not matter
        client.submit("demo.echo", 7, id="up-1")
        done = client.wait("up-1", timeout_s=60)
        assert done.status == "succeeded" and done.result == 7
    assert _succeeded_in_delta(cli.var / "delta", "up-1", timeout_s=150)

    stopped = cli.run("down")
    assert stopped.returncode == 0
    assert "worker-1" in stopped.stdout and "streaming" in stopped.stdout
    assert stopped.stdout.rstrip().endswith("broker")
    for name, pid in pids.items():
        assert pid is not None and not is_running(pid), f"{name} survived down"
    assert processes_mentioning(cli.var) == []
    assert cli.run("status").returncode == 3


def _succeeded_in_delta(warehouse: Path, job_id: str, timeout_s: float) -> bool:
    """Whether Delta `jobs` shows the job succeeded within `timeout_s` (delta-rs reads)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            rows = (
                DeltaTable(str(warehouse / "jobs"))
                .to_pyarrow_table(columns=["id", "status"])
                .to_pylist()
            )
        except TableNotFoundError:
            rows = []
        if {"id": job_id, "status": "succeeded"} in rows:
            return True
        time.sleep(0.25)  # a delta-rs read of a small table: cheap beside the fold's batch
    return False


def test_a_restart_keeps_the_log_and_the_cluster(cli: Cli) -> None:
    assert cli.run("up", "--detach", "--no-streaming").returncode == 0
    meta = (cli.var / "kafka" / "data" / "meta.properties").read_text()
    producer = KafkaProducer(bootstrap_servers=cli.bootstrap)
    producer.send("dispatch.submit", key=b"job-1", value=b'{"id": "job-1"}').get(timeout=30)
    producer.close()

    # Starting again while it runs changes nothing.
    again = cli.run("up", "--detach", "--no-streaming")
    assert again.returncode == 0, again.stderr
    assert "created topics" not in again.stdout

    assert cli.run("down").returncode == 0
    assert cli.run("up", "--detach", "--no-streaming").returncode == 0
    assert (cli.var / "kafka" / "data" / "meta.properties").read_text() == meta
    assert _keys_to_the_end(cli.bootstrap, "dispatch.submit") == [b"job-1"]


def _keys_to_the_end(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[bytes]:
    """The key of every record of `topic`, from its beginning to its end offsets now (read
    until there, not until the consumer has been idle for a while)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not (numbers := consumer.partitions_for_topic(topic)):
            assert time.monotonic() < deadline, f"{topic} has no partitions"
            time.sleep(0.1)
        partitions = [TopicPartition(topic, number) for number in sorted(numbers)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        keys: list[bytes] = []
        while any(consumer.position(partition) < end[partition] for partition in partitions):
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout_s} s"
            for records in consumer.poll(timeout_ms=500).values():
                keys += [record.key for record in records]
        return keys
    finally:
        consumer.close()


def test_a_broker_killed_hard_is_seen_as_stopped_and_starts_again(cli: Cli) -> None:
    assert cli.run("up", "--detach", "--no-streaming").returncode == 0
    pid = cli.broker_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)

    status = cli.run("status")
    assert status.returncode == 3
    assert "stopped" in status.stdout

    restarted = cli.run("up", "--detach", "--no-streaming")
    assert restarted.returncode == 0, restarted.stderr
    new_pid = cli.broker_pid()
    assert new_pid is not None and new_pid != pid and is_running(new_pid)


def test_ctrl_c_stops_a_foreground_up_and_everything_it_started(cli: Cli) -> None:
    with subprocess.Popen(
        [DISPATCH, "up", "--no-streaming"],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as foreground:
        try:
            assert foreground.stdout is not None
            lines = []
            for line in foreground.stdout:
                lines.append(line)
                if "press Ctrl-C" in line:
                    break
            assert any("press Ctrl-C" in line for line in lines), "".join(lines)
            pid, api_pid = cli.broker_pid(), cli.api_pid()
            assert pid is not None and is_running(pid)
            assert api_pid is not None and is_running(api_pid)

            foreground.send_signal(signal.SIGINT)
            assert foreground.wait(timeout=60) == 0
            assert not is_running(pid) and not is_running(api_pid)
            assert processes_mentioning(cli.var) == []
        finally:
            if foreground.poll() is None:
                foreground.kill()
                foreground.wait()


def test_restart_replaces_one_component_and_leaves_the_others_running(cli: Cli) -> None:
    assert cli.run("up", "--detach", "--no-streaming").returncode == 0
    broker, node, standby = cli.broker_pid(), cli.api_pid(), cli.pid_of(f"api-{cli.standby_port}")
    assert None not in (broker, node, standby)

    restarted = cli.run("restart", "broker")
    assert restarted.returncode == 0, restarted.stderr
    new_broker = cli.broker_pid()
    assert new_broker not in (None, broker) and is_running(new_broker or 0)
    assert (cli.api_pid(), cli.pid_of(f"api-{cli.standby_port}")) == (node, standby)

    restarted = cli.run("restart", "node", str(cli.api_port))
    assert restarted.returncode == 0, restarted.stderr
    assert cli.api_pid() not in (None, node)
    assert (cli.broker_pid(), cli.pid_of(f"api-{cli.standby_port}")) == (new_broker, standby)
    # The stack serves again: one of the nodes leads.
    deadline = time.monotonic() + 60
    urls = [f"http://127.0.0.1:{port}/readyz" for port in (cli.api_port, cli.standby_port)]
    while not any(_ready(url) for url in urls):
        assert time.monotonic() < deadline, "no node became ready after the restarts"
        time.sleep(0.1)

    unknown = cli.run("restart", "kettle")
    assert unknown.returncode != 0 and "kettle" in unknown.stdout + unknown.stderr


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
