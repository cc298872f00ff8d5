"""JVM start-up: what the class-data-sharing archives and the client compiler save
(docs/deployment.md, *JVM start-up*).

    .venv/bin/python -m dispatch.bench.jvm_start_bench [--rounds 3]

Two measurements, each in a fresh process (so a fresh JVM) on a temporary stack:
- **broker**: `Broker.start` until it answers metadata, then the first transaction and a
  consumer group's commit (`dispatch.streaming.class_training.broker_workload`);
- **spark**: `spark_session` until the session exists, then the first Delta write, MERGE and
  read by Spark (`dispatch.streaming.class_training.delta_workload`).

Four variants of each (neither, the archive, the client compiler, both), interleaved round by
round so that a change in the machine's speed hits them all alike; the medians are printed.
The archives must exist (`python -m dispatch.streaming.class_training`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.settings import ENV_PREFIX, Settings, load_settings
from dispatch.stack.ports import free_port

VARIANTS: dict[str, dict[str, bool]] = {
    "neither": {"class_sharing": False, "quick_start": False, "quick_start_driver": False},
    "archive": {"class_sharing": True, "quick_start": False, "quick_start_driver": False},
    # The driver too (`jvm.quick_start_driver`), as for the short-lived drivers of the tests.
    "client compiler": {"class_sharing": False, "quick_start": True, "quick_start_driver": True},
    "both": {"class_sharing": True, "quick_start": True, "quick_start_driver": True},
}
TARGETS = ("broker", "spark")
MEASUREMENT_TIMEOUT_S = 600.0
"""One measurement takes under a minute even on a loaded machine."""


def _scratch_settings(scratch: Path) -> Settings:
    var = scratch / "var"
    return load_settings(
        paths={"var": str(var), "warehouse": str(var / "delta")},
        kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
    )


def measure_broker(scratch: Path) -> dict[str, float]:
    from dispatch.stack.broker import Broker, create_topics
    from dispatch.streaming.class_training import broker_workload

    settings = _scratch_settings(scratch)
    started = time.monotonic()
    broker = Broker(settings)
    broker.start()
    try:
        ready = time.monotonic()
        create_topics(settings.kafka)
        broker_workload(settings)
        done = time.monotonic()
    finally:
        broker.stop()
    return {"start_s": ready - started, "work_s": done - ready}


def measure_spark(scratch: Path) -> dict[str, float]:
    from dispatch.streaming.class_training import delta_workload
    from dispatch.streaming.session import spark_session

    settings = _scratch_settings(scratch)
    started = time.monotonic()
    spark = spark_session(settings, "jvm-start-bench")
    try:
        ready = time.monotonic()
        delta_workload(spark, scratch / "table")
        done = time.monotonic()
    finally:
        spark.stop()
    return {"start_s": ready - started, "work_s": done - ready}


def run_one(target: str, variant: str) -> dict[str, float]:
    """One measurement in a fresh process with the variant's settings in its environment."""
    environment = {
        **os.environ,
        **{
            f"{ENV_PREFIX}JVM__{key.upper()}": str(on).lower()
            for key, on in VARIANTS[variant].items()
        },
    }
    command = [sys.executable, "-m", "dispatch.bench.jvm_start_bench", "--one", target]
    # A JVM that never answers must not hold the benchmark: run() kills it at the timeout.
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, check=False,
        timeout=MEASUREMENT_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{target} / {variant} failed:\n{done.stdout}\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@unwinds_on_sigterm
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.jvm_start_bench", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--one", choices=TARGETS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        with tempfile.TemporaryDirectory(prefix="jvm-start-bench-") as scratch:
            measure = measure_broker if args.one == "broker" else measure_spark
            print(json.dumps(measure(Path(scratch))))
        return 0
    targets = args.targets.split(",")
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_number in range(1, args.rounds + 1):
        for target in targets:
            for variant in VARIANTS:
                samples.setdefault((target, variant), []).append(run_one(target, variant))
        print(f"round {round_number} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print(f"{'target':<8} {'variant':<16} {'start s':>8} {'work s':>8} {'total s':>8}")
    for (target, variant), runs in samples.items():
        start = statistics.median(run["start_s"] for run in runs)
        work = statistics.median(run["work_s"] for run in runs)
        total = statistics.median(run["start_s"] + run["work_s"] for run in runs)
        print(f"{target:<8} {variant:<16} {start:8.1f} {work:8.1f} {total:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
