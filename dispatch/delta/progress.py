"""What each table has absorbed: the Kafka positions written into its Delta commits.

Every commit the streaming application makes carries, in the commit's user metadata
(`commitInfo.userMetadata`), a `Progress`: the application and batch that made it, the next
Kafka offset of every partition of the three topics the batch covered, and (for `jobs`) each
dispatcher group's fence epoch after the batch. The commit and its metadata are one atomic
Delta commit, so a `jobs` version and the log positions it covers cannot drift apart. This is
the snapshot pointer of the leader's rebuild (`dispatch.delta.snapshot`) and the `processed` side of
the lag (`dispatch.delta.lag`).

Reading uses delta-rs (no JVM): the newest commits are walked back to the newest one with a
`Progress` of the wanted kind, skipping maintenance commits (OPTIMIZE, VACUUM).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from dispatch.warehouse import Warehouse

Offsets = dict[str, dict[int, int]]
"""topic -> partition -> next offset to read (the Kafka convention for a position)."""

FORMAT = 1
"""Value of the `dispatch_progress` key; a commit without it is not the application's."""

BATCH = "batch"
"""The kind of a table's per-batch commit (for `jobs`: the last commit of the batch)."""
PRUNE = "prune"
"""The kind of the extra `jobs` commit of a batch with `pruned` events (not a batch end)."""


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Progress:
    app_id: str
    batch_id: int
    kind: str
    offsets: Offsets
    """topic -> partition -> next offset: everything before is in the table."""
    topics: dict[str, str] = field(default_factory=dict)
    """role (submit, events, rejected) -> topic name."""
    fence: dict[str, int] = field(default_factory=dict)
    """dispatcher group -> fence epoch after the batch (`jobs` only)."""

    def to_json(self) -> str:
        document: dict[str, Any] = {
            "dispatch_progress": FORMAT,
            "kind": self.kind,
            "app": self.app_id,
            "batch": self.batch_id,
            "topics": self.topics,
            # JSON object keys are strings; partitions come back as ints in from_json.
            "offsets": {
                topic: {str(partition): offset for partition, offset in sorted(parts.items())}
                for topic, parts in sorted(self.offsets.items())
            },
            "fence": dict(sorted(self.fence.items())),
        }
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> Progress | None:
        """The progress in a commit's user metadata, or None if it holds none."""
        document = tagged_metadata(text, "dispatch_progress")
        if document is None:
            return None
        return cls(
            app_id=str(document["app"]),
            batch_id=int(document["batch"]),
            kind=str(document["kind"]),
            offsets={
                str(topic): {int(partition): int(offset) for partition, offset in parts.items()}
                for topic, parts in document.get("offsets", {}).items()
            },
            topics={str(role): str(name) for role, name in document.get("topics", {}).items()},
            fence={str(group): int(epoch) for group, epoch in document.get("fence", {}).items()},
        )


def tagged_metadata(text: str | None, tag: str) -> dict[str, Any] | None:
    """A commit's user metadata as a JSON object if it carries `tag` at this FORMAT, else None
    (other writers' commits, maintenance commits, or no metadata at all)."""
    if not text:
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(document, dict) or document.get(tag) != FORMAT:
        return None
    return document


@dataclass(frozen=True, slots=True)
class Committed:
    """A table version made by the application, with its progress."""

    version: int
    timestamp_ms: int
    progress: Progress


def latest_progress(
    warehouse: Warehouse, name: str, kind: str = BATCH, *, page: int = 32
) -> Committed | None:
    """The newest commit of table `name` whose progress is of `kind`, or None (no table, or
    no such commit yet). Reads the Delta log with delta-rs."""
    delta = warehouse.open_if_exists(name)
    return None if delta is None else latest_progress_of(delta, kind, page=page)


def latest_progress_of(delta: Any, kind: str = BATCH, *, page: int = 32) -> Committed | None:
    """As `latest_progress`, on an open delta-rs `DeltaTable`."""

    def accept(text: str | None) -> Progress | None:
        progress = Progress.from_json(text)
        return progress if progress is not None and progress.kind == kind else None

    found = newest_commit(delta, accept, page=page)
    if found is None:
        return None
    version, timestamp_ms, progress = found
    return Committed(version, timestamp_ms, progress)


def newest_commit(
    delta: Any, accept: Callable[[str | None], T | None], *, page: int = 32
) -> tuple[int, int, T] | None:
    """(version, timestamp in ms, parsed) of the newest commit whose user metadata `accept`
    parses (returns non-None), walking the history back a page at a time."""
    limit = page
    seen = 0
    while True:
        commits = delta.history(limit=limit)
        for commit in commits[seen:]:
            parsed = accept(commit.get("userMetadata"))
            if parsed is not None:
                return int(commit["version"]), int(commit["timestamp"]), parsed
        if len(commits) < limit:
            return None
        seen = len(commits)
        limit *= 4


ROLLUP_FORMAT = 1


def rollup_metadata(through: int) -> str:
    """The user metadata of a roll-up commit of `stats` (`dispatch.streaming.rollup`): the partial
    statistics up to `through` are in it."""
    return json.dumps({"dispatch_rollup": ROLLUP_FORMAT, "through": through}, separators=(",", ":"))


def parse_rollup(text: str | None) -> int | None:
    """The `through` of a roll-up commit's user metadata, or None for any other commit."""
    document = tagged_metadata(text, "dispatch_rollup")
    return None if document is None else int(document["through"])
