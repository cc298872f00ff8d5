"""`dispatch.streaming.delta_commits`: delta-rs commits keyed on (app, batch) apply once."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.table import TableMerger

from dispatch.streaming.delta_commits import DeltaCommits
from dispatch.warehouse import Warehouse


def table_at(path: Path) -> DeltaCommits:
    write_deltalake(
        path, pa.table({"id": pa.array([], pa.string()), "n": pa.array([], pa.int64())})
    )
    return DeltaCommits(Warehouse.at(path.parent))


def rows(path: Path) -> list[dict[str, object]]:
    return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda row: str(row["id"]))


def test_an_append_is_written_once_per_app_and_batch(tmp_path: Path) -> None:
    commits = table_at(tmp_path / "t")
    batch = pa.table({"id": ["a"], "n": [1]})
    assert commits.append("t", batch, app_id="app", version=3, metadata='{"batch": 3}')
    # The same batch replayed, and an older one, change nothing; another app's does.
    assert not commits.append("t", batch, app_id="app", version=3, metadata="again")
    assert not commits.append("t", batch, app_id="app", version=2, metadata="older")
    assert commits.append(
        "t", pa.table({"id": ["b"], "n": [2]}), app_id="other", version=0, metadata=""
    )
    assert [row["id"] for row in rows(tmp_path / "t")] == ["a", "b"]
    history = DeltaTable(tmp_path / "t").history()
    assert [commit.get("userMetadata") for commit in history[:2]] == ["", '{"batch": 3}']
    # A fresh handle (a restarted application) sees the recorded version too.
    assert DeltaTable(tmp_path / "t").transaction_version("app") == 3


def upsert(merge: TableMerger) -> TableMerger:
    return merge.when_matched_update_all().when_not_matched_insert_all()


def test_a_merge_is_skipped_when_its_batch_is_in_the_table(tmp_path: Path) -> None:
    commits = table_at(tmp_path / "t")
    commits.append("t", pa.table({"id": ["a"], "n": [1]}), app_id="app", version=0, metadata="")
    source = pa.table({"id": ["a", "b"], "n": [10, 20]})
    merge = partial(commits.merge, "t", source, "t.id = s.id", upsert, app_id="app", version=1)
    assert merge(metadata="m")
    assert not merge(metadata="replayed")
    assert rows(tmp_path / "t") == [{"id": "a", "n": 10}, {"id": "b", "n": 20}]
    assert DeltaTable(tmp_path / "t").transaction_version("app") == 1
    assert DeltaTable(tmp_path / "t").history(1)[0]["userMetadata"] == "m"


def only_deletes(merge: TableMerger) -> TableMerger:
    return merge.when_matched_delete()


@pytest.mark.parametrize(
    ("source", "clauses"),
    [
        (pa.table({"id": pa.array([], pa.string()), "n": pa.array([], pa.int64())}), upsert),
        (pa.table({"id": ["absent"], "n": [1]}), only_deletes),
    ],
    ids=["empty source", "nothing matched or inserted"],
)
def test_a_merge_with_nothing_to_write_still_commits_its_batch_once(
    tmp_path: Path, source: pa.Table, clauses: Callable[[TableMerger], TableMerger]
) -> None:
    """delta-rs makes no commit for such a MERGE: the batch is committed with no data, its
    `txn` and metadata recorded like a MERGE's, so a replay is skipped."""
    commits = table_at(tmp_path / "t")
    commits.append("t", pa.table({"id": ["a"], "n": [1]}), app_id="app", version=0, metadata="")
    before = DeltaTable(tmp_path / "t").version()
    for metadata in ("m", "replayed"):
        commits.merge(
            "t", source, "t.id = s.id", clauses, app_id="app", version=1, metadata=metadata
        )
    table = DeltaTable(tmp_path / "t")
    assert table.version() == before + 1
    assert table.transaction_version("app") == 1
    assert table.history(1)[0]["userMetadata"] == "m"
    assert rows(tmp_path / "t") == [{"id": "a", "n": 1}]
