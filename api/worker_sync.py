"""A worker's (re)join over a new WebSocket session: one command that makes the leader's view
of the worker what the worker says it is, so that its credit stays exact.

A new session (a reconnection, a failover to another node, a new term on the same node) may
find the leader believing the worker holds jobs it never received: assignments committed and
pushed to a socket that was gone. The worker says in its hello which attempts it holds
(`held`: running, or finished and not yet confirmed) and how many more jobs it can take
(`credits`, its free slots). The join then, in one command:

1. sets the worker's credit to 0 (a known worker may still have credit from before, which
   the passes below would spend on a worker that cannot take it),
2. joins (subjects; the key that registered the id must be the one joining),
3. requeues every job the leader has on the worker that it does not hold (as a retryable
   failure of that attempt, like a lost worker's jobs),
4. grants exactly `credits`.

So the jobs the leader has on the worker are among those it holds, plus at most `credits`
new ones: never more than its slots. Everything that could refuse the command is checked
before the first change (a refusal after a change would leave the core ahead of the log).
"""

from __future__ import annotations

from collections.abc import Collection

from dispatch.core.bounds import MAX_ID_LENGTH
from dispatch.core.dispatcher import MAX_CREDITS, Dispatcher
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Event
from dispatch.core.subjects import validate_patterns

Held = tuple[str, int, str]
"""(job id, attempt, lease) of an attempt the worker holds."""

NOT_RECEIVED = "the worker did not receive this assignment (its connection was lost)"


def rejoin(
    core: Dispatcher,
    worker_id: str,
    subjects: list[str],
    now: float,
    *,
    held: Collection[Held],
    credits: int,
    owner: str | None,
) -> list[Event]:
    """The join of a worker's new session (see the module doc)."""
    if not isinstance(worker_id, str) or not 0 < len(worker_id) <= MAX_ID_LENGTH:
        raise Rejected(RejectCode.INVALID, f"worker_id: 1 to {MAX_ID_LENGTH} characters")
    try:
        validate_patterns(subjects)
    except ValueError as error:
        raise Rejected(RejectCode.INVALID, f"subjects: {error}") from None
    if isinstance(credits, bool) or not 0 <= credits <= MAX_CREDITS:
        raise Rejected(RejectCode.INVALID, f"credits: expected an integer in [0, {MAX_CREDITS}]")
    registered = core.worker_owner(worker_id)
    if owner is not None and registered is not None and registered != owner:
        raise Rejected(RejectCode.FORBIDDEN, f"worker id {worker_id!r} belongs to another key")
    events: list[Event] = []
    known = core.worker(worker_id)
    if known is not None and known.credit > 0:
        events += core.grant_credit(worker_id, 0, now, replace=True)
    events += core.join(worker_id, subjects, now, owner=owner)
    holding = set(held)
    record = core.worker(worker_id)
    for job_id in record.running if record is not None else ():
        job = core.job_view(job_id)
        if job is None or job.lease is None or (job.id, job.attempts, job.lease) in holding:
            continue
        events += core.fail(
            job.id, job.attempts, job.lease, now,
            error=NOT_RECEIVED, retryable=True, worker_id=worker_id,
            # Nothing failed: the assignment was lost on its way. Again at once, no delay.
            retry_after_s=0.0,
        )  # fmt: skip
    if credits:
        events += core.grant_credit(worker_id, credits, now, replace=True)
    return events
