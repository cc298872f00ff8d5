"""Table schemas: what the fold writes fits them, and Spark sees the same types."""

from __future__ import annotations

from dataclasses import fields

from dispatch.core.job import JobRecord
from dispatch.delta import tables as t


def test_jobs_hold_every_job_record_field_and_the_contract_columns() -> None:
    names = set(t.SCHEMAS[t.JOBS].names)
    assert {f.name for f in fields(JobRecord)} <= names
    contract = {"id", "client_id", "exec", "status", "attempts", "worker_id"}
    contract |= {"submitted_at", "updated_at", "result", "error"}
    assert contract <= names
    archive = set(t.SCHEMAS[t.JOBS_ARCHIVE].names)
    assert archive == (names - {"part"}) | {"archived_at", "date"}


def test_partitions_and_keys_are_columns() -> None:
    for name, schema in t.SCHEMAS.items():
        assert set(t.PARTITIONS[name]) <= set(schema.names), name
        assert set(t.KEYS[name]) <= set(schema.names), name


def test_spark_schemas_match_the_arrow_ones() -> None:
    stats = t.spark_schema(t.STATS)
    assert stats["minute"].dataType.simpleString() == "timestamp"
    assert stats["queue_wait_hist"].dataType.simpleString() == "map<int,bigint>"
    assert t.spark_schema(t.EVENTS)["raw"].dataType.simpleString() == "binary"
    assert t.spark_schema(t.JOBS).fieldNames() == t.SCHEMAS[t.JOBS].names


def test_rows_become_arrow_tables_of_the_schema() -> None:
    table = t.arrow_rows(t.JOBS, [{"id": "a", "part": "open"}])
    assert table.schema == t.SCHEMAS[t.JOBS] and table.num_rows == 1
    assert t.empty_table(t.STATS).num_rows == 0
