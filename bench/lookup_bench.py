"""What a job beyond the leader's memory costs: a Delta lookup by id, the rebuild of the filter
of finished ids, and the filter itself on the submit path.

    .venv/bin/python -m dispatch.bench.lookup_bench [--appends 50] [--rows 2000] [--out FILE]

Builds a `jobs_archive` of `--appends` commits of `--rows` succeeded jobs each (random ids, as
clients and the node make them) in a temporary folder, then times (median of several):
`find_jobs` for 1 id and for 500 ids, `finished_ids_since` over the whole archive (ids/s), and
`FinishedIds.may_hold` for new ids and `add_many` per id with a day of ids in the filter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltalake import write_deltalake

from dispatch.api.finished_ids import FinishedIds
from dispatch.core.job import JobRecord, JobStatus
from dispatch.delta import tables as t
from dispatch.delta.job_lookup import find_jobs, finished_ids_since
from dispatch.delta.job_rows import JobState
from dispatch.streaming.fold import ArchivedLife, archived_row
from dispatch.warehouse import Warehouse

T0 = 1_800_000_000.0
GROUP = "default"


def build_archive(folder: Path, appends: int, rows: int) -> tuple[Warehouse, list[str]]:
    warehouse = Warehouse.at(folder)
    write_deltalake(
        warehouse.table(t.JOBS), t.empty_table(t.JOBS), partition_by=t.PARTITIONS[t.JOBS]
    )
    ids: list[str] = []
    for commit in range(appends):
        at = T0 + commit * 60.0
        lives = []
        for n in range(rows):
            job = JobRecord(
                id=uuid.uuid4().hex, client_id="acme", exec="image.resize",
                payload={"n": n}, max_attempts=3, timeout_s=30.0, submitted_at=at - 1.0,
                updated_at=at, seq=n, status=JobStatus.SUCCEEDED, attempts=1,
                worker_id="w1", result={"n": n},
            )  # fmt: skip
            ids.append(job.id)
            lives.append(archived_row(ArchivedLife(GROUP, JobState(job), at + 300.0)))
        write_deltalake(
            warehouse.table(t.JOBS_ARCHIVE),
            t.arrow_rows(t.JOBS_ARCHIVE, lives),
            mode="append",
            partition_by=t.PARTITIONS[t.JOBS_ARCHIVE],
        )
    return warehouse, ids


def median_s(run: Callable[[], Any], times: int) -> float:
    taken = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        taken.append(time.perf_counter() - started)
    return statistics.median(taken)


def measure(appends: int, rows: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dispatch-lookup-") as scratch:
        warehouse, ids = build_archive(Path(scratch), appends, rows)
        one = median_s(lambda: find_jobs(warehouse, GROUP, [ids[len(ids) // 2]]), 9)
        many = median_s(lambda: find_jobs(warehouse, GROUP, ids[::7][:500]), 5)
        started = time.perf_counter()
        rebuilt = sum(len(batch) for batch in finished_ids_since(warehouse, GROUP, 0.0))
        rebuild_s = time.perf_counter() - started
    finished = FinishedIds(86_400.0, 64 << 20)
    finished.rebuild(lambda: iter(()))
    day = [(uuid.uuid4().hex, T0 - i * 0.5) for i in range(200_000)]  # spread over a day
    started = time.perf_counter()
    finished.add_many(day)
    add_us = (time.perf_counter() - started) / len(day) * 1e6
    fresh = [uuid.uuid4().hex for _ in range(100_000)]
    started = time.perf_counter()
    held = sum(finished.may_hold(job_id) for job_id in fresh)
    may_hold_us = (time.perf_counter() - started) / len(fresh) * 1e6
    return {
        "archived_lives": appends * rows,
        "files": appends,
        "find_1_id_ms": round(one * 1e3, 1),
        "find_500_ids_ms": round(many * 1e3, 1),
        "finished_ids_since_ids_per_s": round(rebuilt / rebuild_s),
        "filter_may_hold_us": round(may_hold_us, 2),
        "filter_add_us": round(add_us, 2),
        "filter_false_positives": held / len(fresh),
        "filter_mb": finished.memory_bytes() >> 20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=50)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="Also write the figures to this JSON file.")
    args = parser.parse_args()
    figures = measure(args.appends, args.rows)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
