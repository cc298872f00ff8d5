"""dispatch.bench.fold_options' pure parts: the batch it generates and the partition fold it
measures (whose results every mechanism is compared with)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dispatch.bench.fold_options import (
    events_table,
    fold_arrow,
    fold_partition,
    job_events,
    outcome_of_arrow,
)


def _expected(jobs: int) -> dict[str, tuple[str, int]]:
    # job_events: every 10th job fails once and is retried, every 17th other is left running.
    out = {}
    for n in range(jobs):
        if n % 10 == 0:
            out[str(n)] = ("succeeded", 2)
        elif n % 17 == 0:
            out[str(n)] = ("running", 1)
        else:
            out[str(n)] = ("succeeded", 1)
    return out


def test_the_generated_batch_holds_what_the_core_decided() -> None:
    table = events_table(job_events(40))
    assert table.column("seq").to_pylist() == list(range(table.num_rows))
    per_job = {
        job_id: fold_arrow(table.filter(pc.equal(table.column("job_id"), job_id)))
        for job_id in set(table.column("job_id").to_pylist())
    }
    folded = pa.concat_tables(per_job.values())
    assert outcome_of_arrow(folded) == _expected(40)


def test_the_partition_fold_equals_the_per_job_fold_even_across_record_batches() -> None:
    table = events_table(job_events(40)).sort_by([("job_id", "ascending"), ("seq", "ascending")])
    # Small record batches: a job's events span several of them.
    batches = table.to_batches(max_chunksize=7)
    assert len(batches) > 10
    [result] = list(fold_partition(iter(batches)))
    assert outcome_of_arrow(pa.Table.from_batches([result])) == _expected(40)
