"""Which Spark mechanism could run the per-job fold on executors, measured against the driver.

    .venv/bin/python -m dispatch.bench.fold_options                 # 100, 30,000 and 150,000 events
    .venv/bin/python -m dispatch.bench.fold_options --events 30000 --json
    PYTHONPATH=/tmp/tws_deps .venv/bin/python -m dispatch.bench.fold_options  # with protobuf for
    TWS

One batch as the leader logs it: about N/3.1 jobs submitted, assigned to a worker with enough credit
and acked by the real core (`dispatch.core.dispatcher.Dispatcher`); every 10th job fails once
(retryable) and is assigned again, every 17th is left running. Only the job events go into a
cached DataFrame of (job_id, seq, event_json) rows, as a micro-batch holds them after decoding
(`event.to_dict()` as JSON, as `dispatch.event_records` writes them). On `local[2]`, with
`spark.sql.shuffle.partitions=2`, each mechanism folds every job's events (in `seq` order)
with the core's reducer (`fold_job_events`) from an empty record:

- `driver`: `toArrow()` to the driver, group and fold in one Python thread (what
  `streaming/batch.py` does today, minus Delta).
- `applyInPandas`: `groupBy("job_id").applyInPandas`, one pandas frame per job; the result
  (one row per job: id, status, attempts, record JSON) collected with `toArrow()`.
- `applyInArrow`: the same with `groupBy("job_id").applyInArrow` (one `pyarrow.Table` a job).
- `mapInArrow`: `repartition("job_id")`, `sortWithinPartitions("job_id", "seq")`, then
  `mapInArrow` folding a whole partition's jobs in one Python call (the driver's loop, run
  per partition on the executors).
- `tws`: a streaming query, `groupBy("job_id").transformWithStateInPandas` with a
  `StatefulProcessor` keeping each job's record (JSON) in a ValueState, RocksDB state store,
  output mode Update, memory sink; its source is a parquet file per micro-batch
  (`maxFilesPerTrigger=1`, `availableNow`). Each batch holds other jobs (an id prefix per
  batch), so the state store grows as it would. Time per batch: the query progress'
  `triggerExecution`. transformWithStateInPandas needs the `protobuf` package on the driver
  and the Python workers (not a project dependency): without it the row says why.
- `tws-row`: the same with `transformWithState` (pyspark >= 4.1: one `Row` per event, no
  pandas).

Every mechanism's per-job (status, attempts) is compared with the driver's. Wall time per
batch is the median of `--repeat` runs after `--warmup` runs (for `tws`: batches).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dispatch import fast_json
from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event, JobEvent, event_from_dict
from dispatch.core.job import JobRecord
from dispatch.core.reducer import fold_job_events

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

from pyspark.sql import Row as SparkRow
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

Outcome = dict[str, tuple[str, int]]
"""job id (without its batch prefix) -> (status, attempts)."""

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
EVENT_SCHEMA = pa.schema([("job_id", pa.string()), ("seq", pa.int64()), ("event", pa.string())])
OUT_DDL = "id STRING, status STRING, attempts INT, record STRING"
OUT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("status", pa.string()),
        ("attempts", pa.int32()),
        ("record", pa.string()),
    ]
)
SIZES = (100, 30_000, 150_000)


# --- events ---------------------------------------------------------------------------------


def job_events(jobs: int, prefix: str = "") -> list[JobEvent]:
    """The job events of `jobs` jobs run by the real core, in log order."""
    core = Dispatcher(
        CoreConfig(
            ack_timeout_s=600.0,
            max_ack_timeout_s=600.0,
            worker_expiry_s=None,
            default_cap=max(jobs, 1),
        )
    )
    now = 1_790_000_000.0
    events: list[Event] = core.begin_epoch(1, now) + core.join("w", ["job.assign.>"], now)
    requests = [
        SubmitRequest(
            id=f"{prefix}job-{n}",
            exec="image.resize",
            payload={"n": n, "tags": ["a", "b"]},
            client_id="c",
            max_attempts=3,
        )
        for n in range(jobs)
    ]
    events += core.submit_many(requests, now)
    first = core.grant_credit("w", 2 * jobs, now + 10)
    events += first
    second: list[Event] = []
    for event in first:
        if not isinstance(event, Assigned):
            continue
        n = int(event.job_id.rsplit("-", 1)[1])
        if n % 10 == 0:
            second += core.fail(event.job_id, event.attempt, event.lease, now + 20, error="boom")
        elif n % 17 != 0:
            events += core.ack(event.job_id, event.attempt, event.lease, now + 20, result="ok")
    events += second
    for event in second:
        if isinstance(event, Assigned):
            events += core.ack(event.job_id, event.attempt, event.lease, now + 30, result="ok")
    return [event for event in events if isinstance(event, JobEvent)]


def events_table(events: Iterable[JobEvent], seq0: int = 0) -> pa.Table:
    """(job_id, seq, event_json) rows, seq in log order."""
    ids, seqs, texts = [], [], []
    for seq, event in enumerate(events, seq0):
        ids.append(event.job_id)
        seqs.append(seq)
        texts.append(fast_json.dumps(event.to_dict()).decode())
    return pa.table([ids, seqs, texts], schema=EVENT_SCHEMA)


def jobs_for(events: int) -> int:
    """Jobs whose events number about `events` (3.1 events a job in `job_events`)."""
    return max(1, round(events / 3.1))


# --- the fold, shared by every mechanism ----------------------------------------------------


def fold_texts(job: JobRecord | None, texts: Iterable[str]) -> JobRecord | None:
    """The core's reducer over JSON-encoded events (already in log order)."""
    return fold_job_events(job, (event_from_dict(orjson.loads(text)) for text in texts))


def record_json(job: JobRecord) -> str:
    return fast_json.dumps(job.to_dict()).decode()


def outcome_of(ids: Iterable[str], statuses: Iterable[str], attempts: Iterable[int]) -> Outcome:
    return {
        job_id.split("job-", 1)[1]: (status, int(tries))
        for job_id, status, tries in zip(ids, statuses, attempts, strict=True)
    }


def outcome_of_arrow(table: pa.Table) -> Outcome:
    return outcome_of(
        table.column("id").to_pylist(),
        table.column("status").to_pylist(),
        table.column("attempts").to_pylist(),
    )


def fold_pandas(frame: pd.DataFrame) -> pd.DataFrame:
    """applyInPandas: one job's events -> its record (one row)."""
    ordered = frame.sort_values("seq")
    job = fold_texts(None, ordered["event"].tolist())
    if job is None:
        return pd.DataFrame({"id": [], "status": [], "attempts": [], "record": []})
    return pd.DataFrame(
        {
            "id": [job.id],
            "status": [job.status.value],
            "attempts": [job.attempts],
            "record": [record_json(job)],
        }
    )


def fold_arrow(table: pa.Table) -> pa.Table:
    """applyInArrow: one job's events -> its record (one row)."""
    ordered = table.sort_by("seq")
    job = fold_texts(None, ordered.column("event").to_pylist())
    if job is None:
        return OUT_SCHEMA.empty_table()
    return pa.table(
        [[job.id], [job.status.value], [job.attempts], [record_json(job)]], schema=OUT_SCHEMA
    )


def fold_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow over a partition sorted by (job_id, seq): every job in it, in one pass (no
    per-group call, frame or Arrow message)."""
    ids: list[str] = []
    statuses: list[str] = []
    attempts: list[int] = []
    records: list[str] = []

    def emit(texts: list[str]) -> None:
        job = fold_texts(None, texts)
        if job is not None:
            ids.append(job.id)
            statuses.append(job.status.value)
            attempts.append(job.attempts)
            records.append(record_json(job))

    current: str | None = None
    texts: list[str] = []
    for batch in batches:
        for job_id, text in zip(
            batch.column(0).to_pylist(), batch.column(2).to_pylist(), strict=True
        ):
            if job_id != current:
                if texts:
                    emit(texts)
                current, texts = job_id, []
            texts.append(text)
    if texts:
        emit(texts)
    yield pa.RecordBatch.from_arrays(
        [
            pa.array(ids, pa.string()),
            pa.array(statuses, pa.string()),
            pa.array(attempts, pa.int32()),
            pa.array(records, pa.string()),
        ],
        schema=OUT_SCHEMA,
    )


class JobFold(StatefulProcessor):
    """transformWithStateInPandas: each job's record (JSON) in a ValueState."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.record = handle.getValueState("record", "record STRING")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        frame = frames[0] if len(frames) == 1 else pd.concat(frames)
        stored = self.record.get() if self.record.exists() else None
        job = None if stored is None else JobRecord.from_dict(orjson.loads(stored[0]))
        job = fold_texts(job, frame.sort_values("seq")["event"].tolist())
        if job is None:
            return
        text = record_json(job)
        self.record.update((text,))
        yield pd.DataFrame(
            {
                "id": [job.id],
                "status": [job.status.value],
                "attempts": [job.attempts],
                "record": [text],
            }
        )

    def close(self) -> None:
        pass


class JobFoldRows(StatefulProcessor):
    """transformWithState (the Row API, pyspark >= 4.1): the same, one Row per event."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.record = handle.getValueState("record", "record STRING")

    def handleInputRows(
        self, key: Any, rows: Iterator[SparkRow], timerValues: Any
    ) -> Iterator[SparkRow]:
        texts = [text for _, text in sorted((row.seq, row.event) for row in rows)]
        stored = self.record.get() if self.record.exists() else None
        job = None if stored is None else JobRecord.from_dict(orjson.loads(stored[0]))
        job = fold_texts(job, texts)
        if job is None:
            return
        text = record_json(job)
        self.record.update((text,))
        yield SparkRow(id=job.id, status=job.status.value, attempts=job.attempts, record=text)

    def close(self) -> None:
        pass


# --- mechanisms -----------------------------------------------------------------------------


@dataclass
class Row:
    mechanism: str
    events: int
    jobs: int
    seconds: list[float] = field(default_factory=list)
    """Measured batches (after the warm-up)."""
    equal: bool | None = None
    error: str | None = None
    note: str = ""

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def events_per_s(self) -> float | None:
        median = self.median_s
        return None if not median else self.events / median

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"median_s": self.median_s, "events_per_s": self.events_per_s}


def driver_fold(df: DataFrame) -> Outcome:
    table: pa.Table = df.toArrow()
    by_job: dict[str, list[tuple[int, str]]] = {}
    for job_id, seq, text in zip(
        table.column("job_id").to_pylist(),
        table.column("seq").to_pylist(),
        table.column("event").to_pylist(),
        strict=True,
    ):
        by_job.setdefault(job_id, []).append((seq, text))
    ids, statuses, attempts = [], [], []
    for items in by_job.values():
        items.sort()
        job = fold_texts(None, (text for _, text in items))
        if job is not None:
            ids.append(job.id)
            statuses.append(job.status.value)
            attempts.append(job.attempts)
    return outcome_of(ids, statuses, attempts)


def pandas_fold(df: DataFrame) -> Outcome:
    result = df.groupBy("job_id").applyInPandas(fold_pandas, OUT_DDL)
    return outcome_of_arrow(result.toArrow())


def arrow_fold(df: DataFrame) -> Outcome:
    result = df.groupBy("job_id").applyInArrow(fold_arrow, OUT_DDL)
    return outcome_of_arrow(result.toArrow())


def partition_fold(df: DataFrame) -> Outcome:
    ordered = df.select("job_id", "seq", "event").repartition("job_id")
    ordered = ordered.sortWithinPartitions("job_id", "seq")
    return outcome_of_arrow(ordered.mapInArrow(fold_partition, OUT_DDL).toArrow())


BATCH_MECHANISMS: dict[str, Callable[[DataFrame], Outcome]] = {
    "driver": driver_fold,
    "applyInPandas": pandas_fold,
    "applyInArrow": arrow_fold,
    "mapInArrow": partition_fold,
}


def time_batch(
    name: str,
    run: Callable[[DataFrame], Outcome],
    df: DataFrame,
    size: int,
    jobs: int,
    baseline: Outcome | None,
    warmup: int,
    repeat: int,
) -> tuple[Row, Outcome | None]:
    row = Row(name, size, jobs)
    outcome: Outcome | None = None
    try:
        for index in range(warmup + repeat):
            start = time.perf_counter()
            outcome = run(df)
            elapsed = time.perf_counter() - start
            if index >= warmup:
                row.seconds.append(elapsed)
    except Exception as error:  # noqa: BLE001 - the spike reports any failure as a row
        row.error = _error_text(error)
        return row, None
    row.equal = outcome == baseline if baseline is not None else True
    return row, outcome


def time_tws(
    spark: SparkSession,
    work: Path,
    size: int,
    baseline: Outcome,
    warmup: int,
    repeat: int,
    provider: str = ROCKSDB,
    api: str = "pandas",
) -> Row:
    """A streaming query folding `warmup + repeat` batches of about `size` events each."""
    jobs = jobs_for(size)
    name = "tws" if api == "pandas" else "tws-row"
    if provider != ROCKSDB:
        name += " (default provider)"
    row = Row(name, 0, jobs)
    tag = f"{api}_{size}_{provider.rsplit('.', 1)[1].lower()}"
    source = work / f"tws-src-{tag}"
    checkpoint = work / f"tws-ckpt-{tag}"
    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    source.mkdir(parents=True)
    seq0 = 0
    sizes = []
    for batch in range(warmup + repeat):
        table = events_table(job_events(jobs, prefix=f"b{batch}-"), seq0)
        seq0 += table.num_rows
        sizes.append(table.num_rows)
        path = source / f"batch-{batch:03d}.parquet"
        pq.write_table(table, path)
        # The file source orders new files by modification time.
        os.utime(path, (1_700_000_000 + batch, 1_700_000_000 + batch))
    row.events = round(statistics.mean(sizes))
    sink = f"tws_{tag}"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    try:
        stream = (
            spark.readStream.schema("job_id STRING, seq BIGINT, event STRING")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
        )
        grouped = stream.groupBy("job_id")
        if api == "pandas":
            folded = grouped.transformWithStateInPandas(
                statefulProcessor=JobFold(),
                outputStructType=OUT_DDL,
                outputMode="Update",
                timeMode="None",
            )
        else:
            folded = grouped.transformWithState(
                statefulProcessor=JobFoldRows(),
                outputStructType=OUT_DDL,
                outputMode="Update",
                timeMode="None",
            )
        query = (
            folded.writeStream.format("memory")
            .queryName(sink)
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        progress = [p for p in query.recentProgress if p.numInputRows > 0]
        durations = [p.durationMs["triggerExecution"] / 1000 for p in progress]
        row.seconds = durations[warmup:]
        row.note = "batches: " + ", ".join(
            f"{p.numInputRows} ev {p.durationMs['triggerExecution']} ms" for p in progress
        )
        output: pa.Table = spark.table(sink).toArrow()
    except Exception as error:  # noqa: BLE001 - the spike reports any failure as a row
        row.error = _error_text(error)
        return row
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    ids = output.column("id").to_pylist()
    statuses = output.column("status").to_pylist()
    attempts = output.column("attempts").to_pylist()
    row.equal = len(progress) == warmup + repeat and all(
        outcome_of(
            [i for i in ids if i.startswith(f"b{batch}-")],
            [s for i, s in zip(ids, statuses, strict=True) if i.startswith(f"b{batch}-")],
            [a for i, a in zip(ids, attempts, strict=True) if i.startswith(f"b{batch}-")],
        )
        == baseline
        for batch in range(warmup + repeat)
    )
    return row


def _error_text(error: BaseException) -> str:
    """The error's first line and, if it carries a Python traceback (a worker's), the
    Python exception that ended it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    head = lines[0] if lines else ""
    causes = [line for line in lines if re.match(r"^[A-Z]\w*(Error|Exception): ", line)]
    cause = f" <- {causes[-1]}" if causes and causes[-1] != head else ""
    return f"{type(error).__name__}: {head}{cause}"[:800]


# --- driver ---------------------------------------------------------------------------------


def session() -> SparkSession:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # pyspark 4.2 warns that it does not fully support pandas 3 (on the driver and workers).
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    warnings.filterwarnings("ignore", category=FutureWarning)
    return (
        SparkSession.builder.master("local[2]")
        .appName("fold-options")
        .config("spark.sql.shuffle.partitions", "2")
        # AQE would coalesce the two shuffle partitions of a batch this small (< 64 MiB) into
        # one, and the grouped UDFs would then run on one core of the two.
        .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )


def run(
    sizes: list[int],
    warmup: int,
    repeat: int,
    tws: bool,
    probe: bool,
    log: Callable[[str], None],
    only: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    load_before = os.getloadavg()
    spark = session()
    spark.sparkContext.setLogLevel("ERROR")
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="fold-options-"))
    try:
        for size in sizes:
            jobs = jobs_for(size)
            started = time.perf_counter()
            table = events_table(job_events(jobs, prefix="b0-"))
            log(f"{table.num_rows} events of {jobs} jobs in {time.perf_counter() - started:.1f} s")
            df = spark.createDataFrame(table).cache()
            df.count()
            baseline: Outcome | None = None
            for name, mechanism in BATCH_MECHANISMS.items():
                if name != "driver" and only and name not in only:
                    continue
                row, outcome = time_batch(
                    name, mechanism, df, table.num_rows, jobs, baseline, warmup, repeat
                )
                if name == "driver":
                    baseline = outcome
                rows.append(row)
                log(_line(row))
            df.unpersist()
            if tws and baseline is not None:
                for api in ("pandas", "row"):
                    if only and ("tws" if api == "pandas" else "tws-row") not in only:
                        continue
                    row = time_tws(spark, work, size, baseline, warmup, repeat, api=api)
                    rows.append(row)
                    log(_line(row))
                if probe and size == sizes[0]:
                    row = time_tws(
                        spark,
                        work,
                        size,
                        baseline,
                        0,
                        1,
                        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
                    )
                    rows.append(row)
                    log(_line(row))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "warmup": warmup,
        "repeat": repeat,
        "rows": [row.as_dict() for row in rows],
    }


def _line(row: Row) -> str:
    if row.error:
        return f"{row.mechanism:<24} {row.events:>8} {row.jobs:>7}  ERROR {row.error}"
    median = row.median_s or 0.0
    rate = row.events_per_s or 0.0
    runs = " ".join(f"{s:.2f}" for s in row.seconds)
    return (
        f"{row.mechanism:<24} {row.events:>8} {row.jobs:>7} {median:>9.3f} {rate:>10,.0f}"
        f"  {row.equal!s:<5}  [{runs}]"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, action="append", help="batch size (repeatable)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-tws", action="store_true", help="skip transformWithStateInPandas")
    parser.add_argument(
        "--probe-provider",
        action="store_true",
        help="also run the smallest TWS case with the default (HDFS-backed) state store",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated mechanisms to run besides the driver baseline "
        "(applyInPandas, applyInArrow, mapInArrow, tws, tws-row); default: all",
    )
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args(argv)
    sizes = sorted(args.events) if args.events else list(SIZES)

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    log(f"{'mechanism':<24} {'events':>8} {'jobs':>7} {'median s':>9} {'events/s':>10}  equal")
    try:
        only = frozenset(name for name in args.only.split(",") if name)
        result = run(
            sizes, args.warmup, args.repeat, not args.no_tws, args.probe_provider, log, only
        )
    except Exception:
        traceback.print_exc()
        raise
    log(f"load average before {result['load_before']}, after {result['load_after']}")
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
