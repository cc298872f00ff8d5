"""The load of the fault benchmarks and the judgement of its outcome, written once for the
broker restart, broker kill and failover benchmarks (and the HA tests' workers,
`tests/integration/api/processes.Workers`); the stack and the faults are in
`dispatch.bench.harness`.

- `LoadThreads`: the threads of a load, started by `with` and stopped when it ends.
- `AckingWorkers`: REST workers that ack every assignment at once and note when each one
  arrived (`Receipt`: with its lease's epoch, so a failover shows which leader assigned it)
  and when its ack was accepted (the job completed: the leader answers an ack once its
  transaction committed).
- `Load`: one job POSTed at a time, every `every_s`, to whichever node accepts it (each
  `Submission` noted, answered or not), and one acking worker: the light load of the
  broker restart and broker kill benchmarks, whose figure is the first job accepted, and
  the first completed, among those submitted after a kill.
- `wait_all_succeeded`: the committed log replayed into an empty core until every accepted
  job is `succeeded` there (nothing lost), with the jobs completed twice counted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from string import hexdigits
from typing import Any, Self

import httpx

from dispatch.bench.harness import poll_until
from dispatch.settings import Settings

SUBJECTS = ["job.assign.>"]
WORKER_RETRY_S = 0.05
"""A worker's pause before trying the other node, when one did not answer."""


# --- threads -------------------------------------------------------------------------------------


class LoadThreads:
    """The threads of a load, which run until `stop` is set: started by `with`, and stopped
    and joined (each for up to `join_s`) when it ends, whatever happened, so that no load
    goes on against a stack being stopped. Daemons: one stuck in a request past `join_s`
    does not keep the benchmark's process alive."""

    join_s = 30.0

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def add_thread(self, target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.threads.append(thread)
        return thread

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.join_s)


# --- what a worker received ----------------------------------------------------------------------


def lease_epoch(token: str) -> int:
    """The epoch of a lease "{epoch}.{token}" (the leader that made the assignment; the
    token is random hex)."""
    epoch, dot, secret = token.partition(".")
    if not dot or not epoch.isdigit() or not secret or not all(c in hexdigits for c in secret):
        raise ValueError(f"not a lease token: {token!r}")
    return int(epoch)


@dataclass(frozen=True, slots=True)
class Receipt:
    at: float
    """time.monotonic() when the worker got the assignment."""
    epoch: int
    job_id: str


def first_receipt(receipts: Sequence[Receipt], *, after: float, epoch: int) -> Receipt | None:
    """The earliest assignment of `epoch` received at or after `after`."""
    matching = [r for r in receipts if r.epoch == epoch and r.at >= after]
    return min(matching, key=lambda receipt: receipt.at) if matching else None


# --- the workers ---------------------------------------------------------------------------------


class AckingWorkers(LoadThreads):
    """`count` REST worker threads that long-poll, ack every assignment at once and note when
    each arrived (`receipts`) and when its ack was accepted (`completions`).

    They follow 307s and move to the other node when one does not answer. An ack is retried
    on whichever node answers for up to `ack_retry_s` (0: one try; an unacked job is
    requeued at its deadline anyway). `name` makes the worker ids ("{name}-w{n}")."""

    def __init__(
        self, urls: Sequence[str], key: str, count: int, credits: int, *, name: str = "fo",
        timeout_s: float = 10.0, ack_retry_s: float = 20.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.urls, self.key, self.credits = list(urls), key, credits
        self.timeout_s, self.ack_retry_s = timeout_s, ack_retry_s
        self.receipts: list[Receipt] = []
        self._completed: dict[str, float] = {}
        """Job id -> time.monotonic() when its first ack was accepted."""
        self._lock = threading.Lock()
        for n in range(count):
            self.add_thread(self._work, f"{name}-worker-{n}", f"{name}-w{n}")

    def snapshot(self) -> list[Receipt]:
        with self._lock:
            return list(self.receipts)

    def completions(self) -> dict[str, float]:
        """Job id -> when its ack was accepted (a copy)."""
        with self._lock:
            return dict(self._completed)

    def _work(self, worker_id: str) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        turn = 0
        body = {"subjects": SUBJECTS, "credits": self.credits, "wait_s": 0.5}
        with httpx.Client(headers=headers, timeout=self.timeout_s, follow_redirects=True) as http:
            while not self.stop.is_set():
                url = self.urls[turn % len(self.urls)]
                try:
                    polled = http.post(f"{url}/v1/workers/{worker_id}/poll", json=body)
                except httpx.TransportError:
                    polled = None
                if polled is None or polled.status_code != 200:
                    turn += 1
                    time.sleep(WORKER_RETRY_S)
                    continue
                assignments = polled.json()["assignments"]
                if assignments:
                    self._note(assignments)
                    turn = self._ack(http, turn, assignments)

    def _note(self, assignments: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        with self._lock:
            self.receipts += [Receipt(now, lease_epoch(a["lease"]), a["id"]) for a in assignments]

    def _ack(self, http: httpx.Client, turn: int, assignments: list[dict[str, Any]]) -> int:
        """Ack on the node polled, then on whichever answers until `ack_retry_s` passed;
        returns the node turn to go on with."""
        acks = [{"id": a["id"], "attempt": a["attempt"], "lease": a["lease"]} for a in assignments]
        deadline = time.monotonic() + self.ack_retry_s
        while not self.stop.is_set():
            url = self.urls[turn % len(self.urls)]
            try:
                answer = http.post(f"{url}/v1/jobs:ack", json={"acks": acks})
                if answer.status_code == 200:
                    self._completed_now(assignments, answer.json()["results"])
                    return turn
                if 400 <= answer.status_code < 500:
                    return turn
            except httpx.TransportError:
                pass
            if time.monotonic() >= deadline:
                break
            turn += 1
            time.sleep(WORKER_RETRY_S)
        return turn

    def _completed_now(self, assignments: list[dict[str, Any]], results: list[Any]) -> None:
        now = time.monotonic()
        refused = {result["id"] for result in results if result.get("error")}
        with self._lock:
            for assignment in assignments:
                if assignment["id"] not in refused:
                    self._completed.setdefault(assignment["id"], now)


# --- one job at a time ---------------------------------------------------------------------------


LOAD_EXEC = "bench.restart"
REQUEST_TIMEOUT_S = 2.0
"""Each request of `Load`: short, so that a node that does not answer (no broker) costs one
submission, not the figure."""


@dataclass(frozen=True)
class Submission:
    job_id: str
    sent_at: float
    answered_at: float
    status: int | None
    """The HTTP status, None when no node answered in time."""


class Load(AckingWorkers):
    """One submitter thread that POSTs one job to `/v1/jobs` every `every_s` seconds (to
    whichever node answers, following a 307), and one acking worker thread (10 credits a
    poll, one try per ack), each request with a `REQUEST_TIMEOUT_S` timeout."""

    def __init__(self, urls: Sequence[str], keys: dict[str, str], every_s: float) -> None:
        super().__init__(
            urls, keys["worker"], 1, 10, name="restart", timeout_s=REQUEST_TIMEOUT_S,
            ack_retry_s=0.0,
        )  # fmt: skip
        self.keys, self.every_s = keys, every_s
        self.submissions: list[Submission] = []
        self.add_thread(self._submit, "restart-submitter")

    def _submit(self) -> None:
        number = 0
        headers = {"Authorization": f"Bearer {self.keys['client']}"}
        with httpx.Client(
            headers=headers, timeout=REQUEST_TIMEOUT_S, follow_redirects=True
        ) as http:
            while not self.stop.is_set():
                job_id = f"rs-{number}"
                number += 1
                sent = time.monotonic()
                status: int | None = None
                for url in self.urls:
                    try:
                        answer = http.post(f"{url}/v1/jobs", json={"id": job_id, "exec": LOAD_EXEC})
                    except httpx.TransportError:
                        continue
                    status = answer.status_code
                    if status == 202:
                        break
                with self._lock:
                    self.submissions.append(Submission(job_id, sent, time.monotonic(), status))
                self.stop.wait(max(0.0, sent + self.every_s - time.monotonic()))

    def first_accepted(self, *, sent_after: float) -> float | None:
        """When the first submission sent after `sent_after` was accepted (202)."""
        with self._lock:
            times = [
                s.answered_at
                for s in self.submissions
                if s.sent_at > sent_after and s.status == 202
            ]
        return min(times, default=None)

    def first_completed(self, *, sent_after: float) -> float | None:
        """When the first job submitted after `sent_after` completed (its ack accepted)."""
        with self._lock:
            after = {s.job_id for s in self.submissions if s.sent_at > sent_after}
        completed = self.completions()
        return min((at for job_id, at in completed.items() if job_id in after), default=None)

    def wait_first_after(self, moment: float, timeout_s: float) -> tuple[float, float]:
        """When the first submission sent after `moment` (a kill) was accepted, and when the
        first job submitted after it completed, waiting up to `timeout_s` for them: the times
        the events were noted at, not when this poll saw them. RuntimeError after that."""
        completed = poll_until(
            "completed job", lambda: self.first_completed(sent_after=moment), timeout_s
        )
        # No later than the completion: that job was accepted first.
        accepted = poll_until(
            "accepted submission", lambda: self.first_accepted(sent_after=moment), timeout_s
        )
        return accepted, completed


# --- none lost -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    accepted: int
    succeeded: int
    not_succeeded: list[str]
    completed_twice: int
    wait_s: float


def outcome_in_log(settings: Settings, accepted: Sequence[str]) -> Outcome:
    """The committed log replayed into an empty core (the fence applied, as a new leader
    does): how many accepted jobs are succeeded, and completions per job."""
    from dispatch.api.kafka_log import replay_events
    from dispatch.core.dispatcher import Dispatcher
    from dispatch.core.events import Completed

    core = Dispatcher(settings.dispatcher.core_config())
    completions: Counter[str] = Counter()
    for batch in replay_events(settings.kafka, client_id="failover-bench-audit"):
        if batch.group != settings.dispatcher.group:
            continue
        core.apply_all(batch.events)
        completions.update(e.job_id for e in batch.events if isinstance(e, Completed))
    missing = []
    for job_id in accepted:
        job = core.job(job_id)
        if job is None or job.status.value != "succeeded":
            missing.append(job_id)
    return Outcome(
        accepted=len(accepted),
        succeeded=len(accepted) - len(missing),
        not_succeeded=missing[:20],
        completed_twice=sum(1 for count in completions.values() if count > 1),
        wait_s=0.0,
    )


def wait_all_succeeded(settings: Settings, accepted: Sequence[str], timeout_s: float) -> Outcome:
    """`outcome_in_log` every 5 s until every accepted job succeeded or `timeout_s` passed
    (jobs a dead leader assigned but never delivered, or whose ack met a failed commit,
    wait for their ack deadline first)."""
    started = time.monotonic()
    while True:
        outcome = outcome_in_log(settings, accepted)
        outcome.wait_s = round(time.monotonic() - started, 1)
        if not outcome.not_succeeded or outcome.wait_s > timeout_s:
            return outcome
        time.sleep(5.0)
