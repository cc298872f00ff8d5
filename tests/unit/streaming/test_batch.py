"""The checkpoint files the writer reads: the query id (the txn app id) and batch offsets."""

from __future__ import annotations

import json
from pathlib import Path

from streaming.batch import batch_end_offsets, query_id


def test_query_id_and_batch_offsets_come_from_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"id": "q-1"}) + "\n")
    assert query_id(tmp_path) == "q-1"
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text(
        "v1\n"
        + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
        + "\n"
        + json.dumps({"ev": {"0": 12}, "sub": {"0": 3, "1": 5}})
    )
    assert batch_end_offsets(tmp_path, 4) == {"ev": {0: 12}, "sub": {0: 3, 1: 5}}
    assert batch_end_offsets(tmp_path, 5) is None
