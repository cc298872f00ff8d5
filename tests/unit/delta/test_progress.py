"""The progress recorded in each commit's user metadata."""

from __future__ import annotations

from typing import Any

from dispatch.delta.progress import BATCH, PRUNE, Progress, latest_progress_of


def progress(batch: int, kind: str = BATCH) -> Progress:
    return Progress(
        app_id="app",
        batch_id=batch,
        kind=kind,
        offsets={"ev": {0: 10, 1: 4}, "sub": {0: 2}},
        topics={"events": "ev"},
        fence={"g": 3},
    )


def test_round_trip_and_foreign_metadata() -> None:
    original = progress(7)
    assert Progress.from_json(original.to_json()) == original
    for foreign in (None, "", "not json", "[1]", '{"batch": 1}', '{"dispatch_progress": 99}'):
        assert Progress.from_json(foreign) is None


class FakeTable:
    """delta-rs's `history(limit)`: newest commits first."""

    def __init__(self, metadata: list[str | None]) -> None:
        self.commits = [
            {"version": version, "timestamp": 1000 * version, "userMetadata": text}
            for version, text in enumerate(metadata)
        ]
        self.limits: list[int] = []

    def history(self, limit: int) -> list[dict[str, Any]]:
        self.limits.append(limit)
        return list(reversed(self.commits))[:limit]


def test_the_newest_commit_of_the_kind_is_found_past_maintenance_commits() -> None:
    metadata: list[str | None] = [None, progress(0).to_json(), progress(1).to_json()]
    metadata += [progress(2, PRUNE).to_json()] + [None] * 40
    table = FakeTable(metadata)
    found = latest_progress_of(table, BATCH, page=8)
    assert found is not None and found.version == 2 and found.progress.batch_id == 1
    assert table.limits == [8, 32, 128]
    pruned = latest_progress_of(table, PRUNE, page=8)
    assert pruned is not None and pruned.version == 3
    assert latest_progress_of(FakeTable([None, None]), BATCH) is None
