"""`dispatch demo`: the whole product in two minutes, for a newcomer.

It brings up a stack of its own (under `<var>/demo`, on free ports, so it never disturbs a
`dispatch up` already running): the Kafka broker, the streaming fold, a leader and a standby
API node, two demo workers. Then it submits a mix of jobs (successes, a retried flaky one, a
slow one that times out once, one that dead-letters, a duplicate submission, one written by a
raw Kafka producer and one malformed record), kills the leader with SIGKILL and shows the
standby take over, waits until the Delta tables have caught up with the log and prints a
summary read back from Delta. It stops everything it started, even on Ctrl-C or failure, and
exits 0 only if every check held.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dispatch.client import Client
from dispatch.delta_sql import query
from dispatch.settings import Settings, load_settings
from dispatch.stack.local import LocalStack
from dispatch.stack.plan import StackPlan
from dispatch.stack.ports import free_port
from dispatch.warehouse import Warehouse

console = Console()

DEMO_WORKERS = 2
CATCH_UP_TIMEOUT_S = 180.0


class DemoFailed(Exception):
    """A check of the demo did not hold; the message says which."""


@dataclass
class Expected:
    """The end state each submitted job must reach."""

    statuses: dict[str, str] = field(default_factory=dict)

    def add(self, job_id: str, status: str) -> None:
        self.statuses[job_id] = status


def demo_settings(base: Settings) -> Settings:
    """The configured settings with a folder and ports of the demo's own."""
    var = base.paths.var / "demo"
    return load_settings(
        paths={"var": str(var), "warehouse": str(var / "delta")},
        kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
        api={"ports": [free_port(), free_port()]},
        # Short ack timeouts so the slow job's retry shows within the demo.
        dispatcher={"ack_timeout_s": 2.0, "max_ack_timeout_s": 8.0},
    )


def run_demo(base: Settings) -> int:
    settings = demo_settings(base)
    stack = LocalStack(settings, StackPlan(streaming=True, workers=DEMO_WORKERS))
    started = time.monotonic()
    try:
        _step("1/6", "starting the stack (broker, streaming fold, leader + standby, 2 workers)")
        stack.up()
        took = time.monotonic() - started
        console.print(f"    up in {took:.0f} s; data under {settings.paths.var}")
        keys = json.loads(settings.auth.dev_keys_file.read_text())
        urls = [node.url for node in stack.nodes]
        with Client(urls, keys["admin"], retry_timeout_s=60.0) as client:
            expected = Expected()
            _step("2/6", "submitting a mix of jobs")
            _submit_mix(client, settings, expected)
            _wait_terminal(client, expected, "the first jobs")
            _step("3/6", "killing the leader with SIGKILL")
            took = _failover(stack, client, expected)
            console.print(f"    the standby leads after {took:.1f} s (kill -> /readyz 200)")
            _wait_terminal(client, expected, "the jobs submitted across the failover")
        _step("4/6", "waiting for the Delta tables to catch up with the log")
        _wait_caught_up(settings, expected)
        _step("5/6", "reading the state back from Delta (delta-rs)")
        _summarise(settings, expected)
        _step("6/6", "what next")
        dispatch = dispatch_command()
        console.print(
            f"    your first job: `{dispatch} up --detach --workers 2`, then "
            f"`{dispatch} submit demo.echo --payload '{{\"hi\": 1}}' --wait` (README, *Your first "
            "job in one minute*)\n"
            "    the dashboard is then at "
            f"http://{settings.api.host}:{base.api.ports[0]}/ui\n"
            f"    the notebooks in notebooks/ take warehouse={settings.paths.warehouse}\n"
            f"    the demo took {time.monotonic() - started:.0f} s in all"
        )
        return 0
    except DemoFailed as failure:
        console.print(f"[red]demo failed:[/red] {failure}", highlight=False)
        return 1
    finally:
        stopped = stack.down()
        console.print(f"stopped: {', '.join(stopped)}")


def dispatch_command() -> str:
    """How the user reaches this `dispatch`: its bare name when the PATH finds this very
    executable (an activated venv, an installed package), else its path, relative to the
    current folder when inside it (`.venv/bin/dispatch` from a checkout)."""
    ours = Path(sys.executable).parent / "dispatch"
    found = shutil.which("dispatch")
    if found is not None and Path(found).resolve() == ours.resolve():
        return "dispatch"
    try:
        return str(ours.relative_to(Path.cwd()))
    except ValueError:
        return str(ours)


def _step(number: str, title: str) -> None:
    console.print(f"[bold cyan]{number}[/bold cyan] {title}")


def _submit_mix(client: Client, settings: Settings, expected: Expected) -> None:
    echoes = [f"echo-{n}" for n in range(20)]
    client.submit_many(
        {"id": job_id, "exec": "demo.echo", "payload": {"n": n}} for n, job_id in enumerate(echoes)
    )
    for job_id in echoes:
        expected.add(job_id, "succeeded")
    client.submit("demo.flaky", id="flaky-1")
    expected.add("flaky-1", "succeeded")
    # Sleeps 3 s without heartbeats: attempt 1 (2 s deadline) times out, attempt 2 (4 s) ends.
    client.submit("demo.stall", {"seconds": 3}, id="slow-1", timeout_s=2.0, max_attempts=3)
    expected.add("slow-1", "succeeded")
    client.submit("demo.fail", {"reason": "invalid input, on purpose"}, id="doomed-1")
    expected.add("doomed-1", "dead")
    client.submit("demo.echo", "first", id="dup-1")
    client.wait("dup-1", timeout_s=60.0)
    again = client.submit("demo.echo", "second", id="dup-1")
    expected.add("dup-1", "succeeded")
    console.print(f"    dup-1 submitted again: answered with the existing job ({again.existing})")
    if not again.existing:
        raise DemoFailed("a second submission of dup-1 was not recognised as the same job")
    _produce_raw(settings, expected)
    console.print(f"    {len(expected.statuses)} jobs submitted, plus one malformed record")


def _produce_raw(settings: Settings, expected: Expected) -> None:
    """What any Kafka producer can do: the README's record format, and a broken record."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    try:
        record = {"id": "raw-1", "exec": "demo.echo", "payload": {"via": "kafka"}}
        producer.send(settings.kafka.submit_topic, key=b"raw-1", value=json.dumps(record).encode())
        producer.send(settings.kafka.submit_topic, key=b"broken", value=b"{not json")
        producer.flush(30)
    finally:
        producer.close(5)
    expected.add("raw-1", "succeeded")


def _wait_terminal(client: Client, expected: Expected, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    for job_id, status in expected.statuses.items():
        remaining = max(1.0, deadline - time.monotonic())
        job = client.wait(job_id, timeout_s=remaining)
        if job.status != status:
            raise DemoFailed(f"{job_id} ended {job.status}, expected {status} ({job.error})")
    console.print(f"    {what}: every job ended as expected")


def _leader_index(stack: LocalStack) -> int | None:
    for index, node in enumerate(stack.nodes):
        if node.answers("/readyz"):
            return index
    return None


def _failover(stack: LocalStack, client: Client, expected: Expected) -> float:
    leader = _leader_index(stack)
    if leader is None:
        raise DemoFailed("no node leads before the kill")
    record = stack.nodes[leader].process.record()
    if record is None:
        raise DemoFailed("the leader's process is gone before the kill")
    killed_at = time.monotonic()
    os.kill(record.pid, signal.SIGKILL)
    # Submissions go on during the failover: the standby writes them to Kafka at once.
    after = [f"after-{n}" for n in range(10)]
    client.submit_many({"id": job_id, "exec": "demo.echo", "payload": job_id} for job_id in after)
    for job_id in after:
        expected.add(job_id, "succeeded")
    took = _until(lambda: _leader_index(stack) not in (None, leader), 60.0, killed_at)
    if took is None:
        raise DemoFailed("the standby did not take over within 60 s")
    return took


def _until(condition: Callable[[], bool], timeout_s: float, since: float) -> float | None:
    while time.monotonic() - since < timeout_s:
        if condition():
            return time.monotonic() - since
        time.sleep(0.1)
    return None


def _wait_caught_up(settings: Settings, expected: Expected) -> None:
    """Until Delta `jobs` shows every job as it ended (the fold trails the log by a batch or
    two; the lag itself never stays at 0 while workers heartbeat)."""
    from deltalake.exceptions import TableNotFoundError

    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while True:
        try:
            rows = _rows(Warehouse.of(settings), "jobs", "SELECT id, status FROM jobs")
        except TableNotFoundError:  # the first batch is still coming
            rows = []
        shown = {row["id"]: row["status"] for row in rows}
        behind = [
            job_id for job_id, status in expected.statuses.items() if shown.get(job_id) != status
        ]
        if not behind:
            return
        if time.monotonic() > deadline:
            raise DemoFailed(
                f"after 3 minutes Delta `jobs` still lacks the end of {len(behind)} jobs "
                f"(e.g. {behind[:3]}); see {settings.paths.var / 'logs' / 'streaming.log'}"
            )
        time.sleep(1.0)


def _rows(warehouse: Warehouse, name: str, sql: str) -> list[dict[str, Any]]:
    """Rows of a Delta table by SQL through delta-rs' DataFusion (no JVM)."""
    rows: list[dict[str, Any]] = query(warehouse.open(name), name, sql).to_pylist()
    return rows


def _summarise(settings: Settings, expected: Expected) -> None:
    warehouse = Warehouse.of(settings)
    jobs = _rows(warehouse, "jobs", "SELECT id, exec, status, attempts, error FROM jobs")
    by_id = {row["id"]: row for row in jobs}
    table = Table("status", "jobs (Delta `jobs`)")
    for status, count in sorted(Counter(row["status"] for row in jobs).items()):
        table.add_row(status, str(count))
    console.print(table)
    for job_id, status in expected.statuses.items():
        row = by_id.get(job_id)
        if row is None or row["status"] != status:
            shown = row["status"] if row else "missing"
            raise DemoFailed(f"Delta `jobs` shows {job_id} as {shown}, not {status}")
    slow = by_id["slow-1"]
    console.print(f"    slow-1 took {slow['attempts']} attempts (the first timed out)")
    if slow["attempts"] < 2:
        raise DemoFailed("slow-1 should have needed a second attempt")
    dead = [row for row in jobs if row["status"] == "dead"]
    console.print(f"    dead-letter queue: {[(row['id'], row['error']) for row in dead]}")
    [rejected] = _rows(warehouse, "rejected", "SELECT count(*) AS n FROM rejected")
    [events] = _rows(warehouse, "events", "SELECT count(*) AS n FROM events")
    console.print(
        f"    rejected records: {rejected['n']}; rows of history in `events`: {events['n']}"
    )
    if rejected["n"] < 1:
        raise DemoFailed("the malformed record is missing from Delta `rejected`")
