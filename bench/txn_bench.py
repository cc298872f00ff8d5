"""What one Kafka transaction costs, by client: the leader's event log on kafka-python against
librdkafka, one small record a transaction, on the same broker, interleaved.

A sequential submitter gives the leader a transaction or two a job (its `enqueued` and
`assigned`, then its completion), so this is the floor of the one-at-a-time path: how many
transactions a second one client gets through, and whose CPU each costs (the broker's and the
client process's, from /proc). `--broker-property k=v` starts the bench's own broker with a
property changed, to see what a broker setting would give (e.g.
`transaction.partition.verification.enable=false`, which this project does not set: it is
Kafka's guard against hanging transactions).

Run: `.venv/bin/python -m dispatch.bench.txn_bench [--transactions N] [--rounds R] [--json]`.
It uses the local stack's broker if one answers (then `--broker-property` is refused), else
starts a temporary one.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dispatch.stack.broker as broker_module
from dispatch.api.leader_io import open_event_log
from dispatch.bench.e2e import broker_for, broker_processes
from dispatch.bench.stats import machine
from dispatch.settings import KafkaSettings, Settings
from dispatch.stack.broker import Broker, create_topics

CLIENTS = ("kafka-python", "librdkafka")
RECORD = b"x" * 300
"""About one iteration's events record for a single job."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def measure(commit: Callable[[], None], transactions: int, broker_pid: int) -> dict[str, float]:
    broker_before, own_before = cpu_seconds(broker_pid), own_cpu_seconds()
    started = time.perf_counter()
    for _ in range(transactions):
        commit()
    seconds = time.perf_counter() - started
    return {
        "transactions_per_s": round(transactions / seconds, 1),
        "broker_us": round((cpu_seconds(broker_pid) - broker_before) / transactions * 1e6),
        "client_us": round((own_cpu_seconds() - own_before) / transactions * 1e6),
    }


@contextmanager
def broker_with(settings: Settings, properties: dict[str, str]) -> Iterator[Settings]:
    """`broker_for`, with `properties` added to a temporary broker's configuration."""
    if properties and Broker(settings).running() is not None:
        raise SystemExit("--broker-property needs the bench's own broker: stop the local stack")
    original = broker_module.server_properties
    broker_module.server_properties = lambda *a, **k: {**original(*a, **k), **properties}
    try:
        with broker_for(settings) as running:
            yield running
    finally:
        broker_module.server_properties = original


def run(transactions: int, rounds: int, warmup: int, properties: dict[str, str]) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {client: [] for client in CLIENTS}
    with broker_with(Settings(), properties) as settings:
        create_topics(settings.kafka)
        [broker] = broker_processes(settings)[:1]
        for _round in range(rounds):
            for client in CLIENTS:
                kafka: KafkaSettings = settings.kafka.model_copy(update={"leader_client": client})
                log = open_event_log(kafka, f"txn-bench-{client}", f"txn-bench-{client}")
                try:

                    def commit(log: Any = log) -> None:
                        log.commit([RECORD], [])

                    for _ in range(warmup):
                        commit()
                    figures = measure(commit, transactions, broker.pid)
                finally:
                    log.close()
                results[client].append(figures)
                print(f"{client:13s} {figures}", flush=True)
    return {"transactions": transactions, "properties": properties, "machine": machine(),
            "results": results}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1000, help="transactions left out first")
    parser.add_argument("--broker-property", action="append", default=[], metavar="K=V")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    properties = dict(item.split("=", 1) for item in args.broker_property)
    report = run(args.transactions, args.rounds, args.warmup, properties)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
