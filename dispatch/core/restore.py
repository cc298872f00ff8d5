"""Loading a snapshot (job records, optionally workers) into an empty dispatcher state.

A new leader restores a million jobs or more here while the group has no leader, so the work
per job is kept to a few attribute reads: the checks `check_record` makes are done inline for
succeeded and cancelled jobs (nearly all of a snapshot), orders come from sorts on plain keys,
and counts, the clock and the seq counters are computed over whole lists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from operator import attrgetter
from typing import NoReturn

from dispatch.core.job import JobRecord, JobStatus, check_record
from dispatch.core.state import DispatcherState
from dispatch.core.workers import WorkerRecord

_QUEUED = JobStatus.QUEUED
_RUNNING = JobStatus.RUNNING
_SUCCEEDED = JobStatus.SUCCEEDED
_CANCELLED = JobStatus.CANCELLED
_DEAD = JobStatus.DEAD
_EXPIRED = JobStatus.EXPIRED

_ID = attrgetter("id")
_SEQ = attrgetter("seq")
_UPDATED_AT = attrgetter("updated_at")
_EXEC = attrgetter("exec")
_CLIENT_ID = attrgetter("client_id")
_STATUS = attrgetter("status")


def load_snapshot(
    state: DispatcherState,
    jobs: Iterable[JobRecord],
    workers: Iterable[WorkerRecord] = (),
    *,
    owned: bool = False,
) -> None:
    """Fill an empty `state` with the records; indexes are rebuilt from them.

    The records are copied, unless `owned`: then the state takes the records themselves and
    mutates them from now on, so the caller must hand over records nothing else refers to
    (e.g. fresh from the snapshot reader) and not use them afterwards.

    The clock starts at the latest `updated_at` / `last_seen` in the snapshot. Queue order
    comes from each job's `seq`, so it is exactly the order the old leader had. ValueError
    names the first record (in the given order) that is not a JobRecord, repeats an id, or
    whose fields contradict its status; the state is then unchanged.
    """
    if state._jobs or state._workers:
        raise ValueError("restore: the dispatcher must be empty")
    given = list(jobs)
    if not _valid(given):
        _raise_first_error(given)
    records = given if owned else [job.copy() for job in given]

    # Finishing order (and assignment, dead-lettering order) is (updated_at, seq); queue and
    # creation order is seq, ties in the old order. Two stable sorts on plain keys give the
    # first at half the cost of one sort on (updated_at, seq) tuples; the seq order is then
    # a cheap pass over an almost sorted list.
    by_time = sorted(records, key=_SEQ)
    by_time.sort(key=_UPDATED_AT)
    by_seq = sorted(by_time, key=_SEQ)
    # Built once, in seq order (`jobs()` lists jobs by seq), and it finds repeated ids.
    by_id = dict(zip(map(_ID, by_seq), by_seq, strict=True))
    if len(by_id) != len(records):
        _raise_first_error(given)
    worker_records = list(workers)

    # by_time is sorted by updated_at: its last record holds the jobs' latest time.
    latest_job = by_time[-1].updated_at if by_time else 0.0
    clock = max([latest_job, *(worker.last_seen for worker in worker_records)])
    state._clock = clock
    for record in worker_records:
        if record.worker_id in state._workers:
            raise ValueError(f"restore: worker {record.worker_id!r} appears twice")
        worker = state._add_worker(
            record.worker_id, record.subjects, record.last_seen, record.owner
        )
        worker.credit = record.credit

    # Exec queues and clients are created in the order of their first job by seq, as the
    # old leader created them (queue creation order is the order `_wake` offers them), and
    # every job shares their one string object: it matters with a million jobs.
    exec_names = {name: state._queue(name).exec for name in dict.fromkeys(map(_EXEC, by_seq))}
    client_ids = {
        client_id: state._client(client_id).client_id
        for client_id in dict.fromkeys(map(_CLIENT_ID, by_seq))
    }
    queues = state._queues
    queued: list[JobRecord] = []
    for job in by_seq:
        job.exec = exec_names[job.exec]
        job.client_id = client_ids[job.client_id]
        if job.status is _QUEUED:
            queued.append(job)
    state._jobs.update(by_id)
    counts = state._counts
    for status, count in Counter(map(_STATUS, records)).items():
        counts[status.value] += count
    if by_seq:
        state._bump_seq(by_seq[0].seq)
        state._bump_seq(by_seq[-1].seq)
    _place_queued(state, queued)

    finished = state._finished
    running_count = counts[_RUNNING.value]
    for job in by_time:
        status = job.status
        if status is _SUCCEEDED or status is _CANCELLED or status is _EXPIRED:
            finished.append(job)
        elif status is _RUNNING:
            worker = state._worker_for(job.worker_id or "", clock)
            worker.running[job.id] = job
            queues[job.exec].running += 1
            state._clients[job.client_id].inflight += 1
            assert job.deadline is not None
            state._deadlines.push(job.deadline, job, running_count)
        elif status is _DEAD:
            state._dead[job.id] = job


def _place_queued(state: DispatcherState, queued: list[JobRecord]) -> None:
    """Queued jobs into their lanes or the delay heap, and those with an expiry into the
    job-expiry heap."""
    queues = state._queues
    job_expiry = state._job_expiry
    live = len(queued)
    for job in queued:
        state._place(job, queues[job.exec])
        if job.expires_at is not None:
            job_expiry.push(job, live)


def _valid(records: list[JobRecord]) -> bool:
    """Whether every record is a JobRecord that `check_record` accepts, with a JobStatus."""
    if not all(issubclass(kind, JobRecord) for kind in set(map(type, records))):
        return False
    for job in records:
        status = job.status
        if status is _SUCCEEDED or status is _CANCELLED:
            # Everything check_record requires of a succeeded or cancelled job, inline: a
            # call per job is a visible share of a million-job restore (BENCHMARKS.md,
            # *Rebuild with 1,000,000 jobs*), most of a snapshot being these.
            if (
                job.deadline is not None
                or job.dead_reason is not None
                or job.attempts > job.max_attempts
                or job.run_limit_at is not None
                or job.cancel_requested_at is not None
            ):
                return False
        elif type(status) is not JobStatus:
            return False
        else:
            try:
                check_record(job)
            except ValueError:
                return False
    return True


def _raise_first_error(records: list[JobRecord]) -> NoReturn:
    """The checks one record at a time, in the given order (the slow path, on bad input),
    so the error names the same record the one-by-one checks always named."""
    seen: set[str] = set()
    for job in records:
        if not isinstance(job, JobRecord):
            raise ValueError(f"restore: expected JobRecord, got {type(job).__name__}")
        if job.id in seen:
            raise ValueError(f"restore: job {job.id!r} appears twice")
        seen.add(job.id)
        if not isinstance(job.status, JobStatus):
            raise ValueError(f"job {job.id!r}.status: not a JobStatus: {job.status!r}")
        check_record(job)
    raise AssertionError("restore: the fast checks refused records the one-by-one checks accept")
