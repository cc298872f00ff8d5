"""kafka-python against librdkafka (confluent-kafka) for what a submission needs of a producer.

A REST submission waits for its record's acknowledgement (acks=all, idempotent), so the
producer's round trip is the floor of a single-job request, and how many records it carries
per second with many requests waiting at once is the ceiling of concurrent ones. This bench
measures both for the two clients on the same broker, in the same run:

- *sequential*: send one record, wait for its acknowledgement, repeat (one client's loop);
- *64 outstanding*: keep 64 records waiting, send the next as each one is acknowledged
  (64 concurrent single-job requests).

Run: `.venv/bin/python -m dispatch.bench.producer_bench [--records N] [--json]`. It uses the local
stack's broker if one answers, else starts a temporary one.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from kafka import KafkaProducer

from dispatch.bench.e2e import broker_for
from dispatch.bench.stats import machine, percentiles, steal_percent
from dispatch.settings import Settings
from dispatch.stack.broker import create_topics

VALUE = b"x" * 150
"""About a submission record's size with a small payload."""

Send = Callable[[Callable[[], None]], None]
"""Sends one record and calls its argument once the record is acknowledged."""

Client = tuple[Send, Callable[[], None]]
"""A sender and how to close it."""


def kafka_python_sender(bootstrap: str, linger_ms: int, topic: str) -> Client:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=linger_ms
    )

    def send(acknowledged: Callable[[], None]) -> None:
        sent = producer.send(topic, key=os.urandom(8), value=VALUE)
        sent.add_callback(lambda _metadata: acknowledged())

    return send, lambda: producer.close(5)


def librdkafka_sender(bootstrap: str, linger_ms: int, topic: str) -> Client:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
        }
    )
    stop = threading.Event()

    def serve_reports() -> None:  # delivery reports are served by poll(), as in the node
        while not stop.is_set():
            producer.poll(0.1)

    poller = threading.Thread(target=serve_reports, daemon=True)
    poller.start()

    def send(acknowledged: Callable[[], None]) -> None:
        producer.produce(topic, key=os.urandom(8), value=VALUE,
                         on_delivery=lambda _error, _message: acknowledged())  # fmt: skip

    def close() -> None:
        producer.flush(5)
        stop.set()
        poller.join(5)

    return send, close


def measure(send: Send, records: int, outstanding: int) -> dict[str, Any]:
    """Records/s and each record's round trip with `outstanding` records kept waiting."""
    done = threading.Semaphore(0)
    round_trips: list[float] = []
    sent = 0

    def fire() -> None:
        began = time.perf_counter()

        def acknowledged() -> None:
            round_trips.append(time.perf_counter() - began)
            done.release()

        send(acknowledged)

    for _ in range(20):  # connect and warm up
        fire()
        done.acquire()
    round_trips.clear()
    started = time.perf_counter()
    for _ in range(min(outstanding, records)):
        fire()
        sent += 1
    for _ in range(records):
        done.acquire()
        if sent < records:
            fire()
            sent += 1
    seconds = time.perf_counter() - started
    return {"records_per_s": round(records / seconds, 1), "round_trip_ms": percentiles(round_trips)}


def run(settings: Settings, records: int) -> dict[str, Any]:
    before = machine()
    results: dict[str, Any] = {}
    with broker_for(settings) as on_broker:
        topic = f"bench-producers-{int(time.time() * 1000)}"
        create_topics(on_broker.kafka, {topic: on_broker.kafka.submit_partitions})
        bootstrap = on_broker.kafka.bootstrap
        for name, make, linger_ms in (
            ("kafka-python linger 0", kafka_python_sender, 0),
            ("kafka-python linger 1", kafka_python_sender, 1),
            ("librdkafka linger 0", librdkafka_sender, 0),
        ):
            send, close = make(bootstrap, linger_ms, topic)
            try:
                results[name] = {
                    "sequential": measure(send, records // 4, 1),
                    "64 outstanding": measure(send, records, 64),
                }
            finally:
                close()
    return {"machine_before": before, "machine_after": machine(), "records": records,
            "clients": results}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(Settings(), args.records)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    before = result["machine_before"]
    print(f"machine: {before['nproc']} cores, {before['cpu']}, Python {before['python']}, "
          f"load {before['load_average']}")  # fmt: skip
    for name, modes in result["clients"].items():
        for mode, figures in modes.items():
            trip = figures["round_trip_ms"]
            print(f"{name:24} {mode:15} {figures['records_per_s']:>9,.0f} records/s  "
                  f"round trip p50 {trip['p50']} ms p99 {trip['p99']} ms")  # fmt: skip
    steal = steal_percent(before, result["machine_after"])
    print(f"load after: {result['machine_after']['load_average']}; CPU stolen by other guests "
          f"during the run: {steal if steal is not None else 'unknown'}%")  # fmt: skip


if __name__ == "__main__":
    main()
