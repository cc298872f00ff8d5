"""`dispatch.delta_sql`: filtered reads that survive files delta-rs's MERGE rewrote."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from dispatch.delta_sql import plain_types, query, sql_text


def merged_table(path: Path) -> DeltaTable:
    """A table whose rows live partly in a file delta-rs's MERGE wrote (string_view inside)."""
    ids = [f"job-{n:04d}" for n in range(200)]
    write_deltalake(path, pa.table({"id": ids, "status": ["queued"] * 200}))
    table = DeltaTable(path)
    source = pa.table({"id": ids[:10], "status": ["succeeded"] * 10})
    (
        table.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .execute()
    )
    return DeltaTable(path)


def test_canary_pyarrow_still_cannot_compare_string_view_but_query_can(
    tmp_path: Path,
) -> None:
    table = merged_table(tmp_path / "jobs")
    # The failure this module exists for (if pyarrow learns string_view comparisons, this
    # assertion fails and the module's workaround can go).
    with pytest.raises(pa.ArrowNotImplementedError):
        table.to_pyarrow_dataset().to_table(filter=pc.field("id") == "job-0001")
    found = query(table, "jobs", "SELECT * FROM jobs WHERE id IN ('job-0001', 'job-0150')")
    assert sorted(found.to_pylist(), key=lambda row: row["id"]) == [
        {"id": "job-0001", "status": "succeeded"},
        {"id": "job-0150", "status": "queued"},
    ]
    assert found.schema.field("id").type == pa.string()


def test_literals_are_quoted(tmp_path: Path) -> None:
    table = merged_table(tmp_path / "jobs")
    assert sql_text("it's") == "'it''s'"
    injection = sql_text("x' OR '1'='1")
    assert query(table, "jobs", f"SELECT * FROM jobs WHERE id = {injection}").num_rows == 0


def test_plain_types_casts_view_columns_only() -> None:
    table = pa.table(
        {
            "text": pa.array(["a", None], pa.string_view()),
            "bytes": pa.array([b"x", None], pa.binary_view()),
            "number": [1, 2],
        }
    )
    plain = plain_types(table)
    assert plain.schema.types == [pa.string(), pa.binary(), pa.int64()]
    assert plain.to_pylist() == table.to_pylist()
    assert plain_types(plain) is plain
