"""Worker state: subject patterns, credit, running jobs, liveness, and who owns the worker id."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatch.core import _validate as v
from dispatch.core.job import JobRecord
from dispatch.core.subjects import compile_pattern, match_tokens, validate_patterns


class WorkerState:
    """A joined worker, as the core tracks it (internal and mutable)."""

    __slots__ = ("credit", "last_seen", "owner", "patterns", "running", "subjects", "worker_id")

    def __init__(
        self,
        worker_id: str,
        subjects: tuple[str, ...],
        last_seen: float,
        owner: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.owner = owner
        """The API key (its name) that registered the worker id; None when unknown (joined
        by an admin, a placeholder after a restore, or a log older than owners)."""
        self.subjects = subjects
        self.patterns = tuple(compile_pattern(pattern) for pattern in subjects)
        self.credit = 0
        self.last_seen = last_seen
        self.running: dict[str, JobRecord] = {}
        """Jobs it holds, in assignment order."""

    def set_subjects(self, subjects: tuple[str, ...]) -> None:
        self.subjects = subjects
        self.patterns = tuple(compile_pattern(pattern) for pattern in subjects)

    def matches(self, subject: tuple[str, ...]) -> bool:
        """True when one of its patterns matches the tokenised subject."""
        return any(match_tokens(pattern, subject) for pattern in self.patterns)

    def record(self) -> WorkerRecord:
        return WorkerRecord(
            worker_id=self.worker_id,
            subjects=self.subjects,
            credit=self.credit,
            last_seen=self.last_seen,
            running=tuple(self.running),
            owner=self.owner,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """A worker as the outside sees it (`GET /v1/workers`, snapshots).

    `running` is informational: `Dispatcher.restore` derives running jobs from the job
    records, which are the source of truth.
    """

    worker_id: str
    subjects: tuple[str, ...]
    credit: int = 0
    last_seen: float = 0.0
    running: tuple[str, ...] = ()
    owner: str | None = None
    """The name of the API key that registered the worker id (None: unknown)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "subjects": list(self.subjects),
            "credit": self.credit,
            "last_seen": self.last_seen,
            "running": list(self.running),
            "owner": self.owner,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerRecord:
        where = "worker"
        v.check_keys(data, _WORKER_FIELDS, where)
        subjects = v.as_str_tuple(v.field_value(data, "subjects", where), "worker.subjects")
        try:
            # Unbounded: a snapshot written before the pattern limits must still load.
            subjects = validate_patterns(subjects, bounded=False)
        except ValueError as error:
            raise ValueError(f"worker.subjects: {error}") from None
        return cls(
            worker_id=v.as_id(v.field_value(data, "worker_id", where), "worker.worker_id"),
            subjects=subjects,
            credit=v.as_int(v.field_value(data, "credit", where, 0), "worker.credit", minimum=0),
            last_seen=v.as_number(v.field_value(data, "last_seen", where, 0.0), "worker.last_seen"),
            running=v.as_str_tuple(v.field_value(data, "running", where, []), "worker.running"),
            owner=v.as_opt_str(v.field_value(data, "owner", where, None), "worker.owner"),
        )


_WORKER_FIELDS = frozenset({"worker_id", "subjects", "credit", "last_seen", "running", "owner"})


def pick_worker(
    candidates: list[WorkerState], exclude: WorkerState | None = None
) -> WorkerState | None:
    """Among candidates with credit (except `exclude`): fewest running jobs, then most credit,
    then the smallest worker id (so the choice is deterministic)."""
    best: WorkerState | None = None
    best_running = 0
    best_credit = 0
    for worker in candidates:
        credit = worker.credit
        if credit <= 0 or worker is exclude:
            continue
        running = len(worker.running)
        if (
            best is None
            or running < best_running
            or (
                running == best_running
                and (
                    credit > best_credit
                    or (credit == best_credit and worker.worker_id < best.worker_id)
                )
            )
        ):
            best = worker
            best_running = running
            best_credit = credit
    return best
