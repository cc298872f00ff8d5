"""Broker restart benchmark: `kill -9` the Kafka broker under a light load, start it again, and
time how long the API nodes take to serve once it answers.

    .venv/bin/python -m dispatch.bench.restart_bench                     # 3 rounds, broker down 3 s
    .venv/bin/python -m dispatch.bench.restart_bench --rounds 5 --down 10 --out out.json
    .venv/bin/python -m dispatch.bench.restart_bench --json          # only the JSON on stdout

A real local stack (`LocalStack`, `StackPlan(streaming=False, workers=0)`: the broker, its
topics and two `dispatch serve` processes sharing the lease table) in a temporary folder on
free ports. The load: one submitter thread that POSTs one job to `/v1/jobs` every
`--every` seconds (each request with a 2 s timeout, to whichever node answers, following a
307), and one REST worker thread that long-polls and acks every assignment at once, noting
when each ack was accepted.

Each round: the broker's process gets SIGKILL (by the pid its pid file records); after
`--down` seconds it is started again (`Broker.start`, which returns once a metadata request is
answered: "the broker answers"). Measured, from that moment: the first submission that a node
accepted (202) among those sent after the kill, and the first ack accepted (a job completed)
of a job submitted after the kill. The target: both within 2 s.

Output: a line per round on stderr as it ends, then the summary on stdout (as JSON with
`--json`); `--out FILE` also writes the JSON summary to a file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from dispatch.bench.failover_bench import stack_settings
from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.stack.local import LocalStack
from dispatch.stack.plan import StackPlan

EXEC = "bench.restart"
SUBJECTS = ["job.assign.>"]
REQUEST_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Submission:
    job_id: str
    sent_at: float
    answered_at: float
    status: int | None
    """The HTTP status, None when no node answered in time."""


class Load:
    """One submitter and one acking REST worker, each a thread, over every node's URL."""

    def __init__(self, urls: Sequence[str], keys: dict[str, str], every_s: float) -> None:
        self.urls, self.keys, self.every_s = list(urls), keys, every_s
        self.submissions: list[Submission] = []
        self.completed: dict[str, float] = {}
        """Job id -> when its ack was accepted."""
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._submit, name="restart-submitter", daemon=True),
            threading.Thread(target=self._work, name="restart-worker", daemon=True),
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)

    def _client(self, role: str) -> httpx.Client:
        return httpx.Client(
            headers={"Authorization": f"Bearer {self.keys[role]}"},
            timeout=REQUEST_TIMEOUT_S,
            follow_redirects=True,
        )

    def _submit(self) -> None:
        number = 0
        with self._client("client") as http:
            while not self.stop.is_set():
                job_id = f"rs-{number}"
                number += 1
                sent = time.monotonic()
                status: int | None = None
                for url in self.urls:
                    try:
                        answer = http.post(f"{url}/v1/jobs", json={"id": job_id, "exec": EXEC})
                    except httpx.TransportError:
                        continue
                    status = answer.status_code
                    if status == 202:
                        break
                with self._lock:
                    self.submissions.append(Submission(job_id, sent, time.monotonic(), status))
                self.stop.wait(max(0.0, sent + self.every_s - time.monotonic()))

    def _work(self) -> None:
        body = {"subjects": SUBJECTS, "credits": 10, "wait_s": 0.5}
        turn = 0
        with self._client("worker") as http:
            while not self.stop.is_set():
                url = self.urls[turn % len(self.urls)]
                try:
                    polled = http.post(f"{url}/v1/workers/restart-w1/poll", json=body)
                except httpx.TransportError:
                    polled = None
                if polled is None or polled.status_code != 200:
                    turn += 1
                    time.sleep(0.05)
                    continue
                assignments = polled.json()["assignments"]
                if assignments:
                    self._ack(http, url, assignments)

    def _ack(self, http: httpx.Client, url: str, assignments: list[dict[str, Any]]) -> None:
        acks = [{"id": a["id"], "attempt": a["attempt"], "lease": a["lease"]} for a in assignments]
        try:
            answer = http.post(f"{url}/v1/jobs:ack", json={"acks": acks})
        except httpx.TransportError:
            return  # requeued at its deadline
        if answer.status_code != 200:
            return
        now = time.monotonic()
        refused = {r["id"] for r in answer.json()["results"] if r.get("error")}
        with self._lock:
            for assignment in assignments:
                if assignment["id"] not in refused:
                    self.completed.setdefault(assignment["id"], now)

    def first_accepted(self, *, sent_after: float) -> float | None:
        with self._lock:
            times = [
                s.answered_at
                for s in self.submissions
                if s.sent_at > sent_after and s.status == 202
            ]
        return min(times, default=None)

    def first_completed(self, *, sent_after: float) -> float | None:
        with self._lock:
            after = {s.job_id for s in self.submissions if s.sent_at > sent_after}
            times = [at for job_id, at in self.completed.items() if job_id in after]
        return min(times, default=None)


@dataclass
class Round:
    down_s: float
    restart_to_answer_s: float
    """From starting the broker's process to its first answered metadata request (JVM start)."""
    answer_to_first_accepted_s: float
    answer_to_first_completed_s: float
    kill_to_first_accepted_s: float
    kill_to_first_completed_s: float


def kill_9_broker(stack: LocalStack) -> None:
    record = stack.broker.running()
    if record is None:
        raise RuntimeError("the broker is not running")
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while stack.broker.process.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_for(what: str, probe: Any, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return float(found)
        time.sleep(0.02)
    raise RuntimeError(f"no {what} within {timeout_s:.0f} s")


def restart_round(stack: LocalStack, load: Load, down_s: float, timeout_s: float) -> Round:
    kill_9_broker(stack)
    killed = time.monotonic()
    time.sleep(down_s)
    starting = time.monotonic()
    stack.broker.start()
    answered = time.monotonic()
    accepted = wait_for(
        "accepted submission", lambda: load.first_accepted(sent_after=killed), timeout_s
    )
    completed = wait_for(
        "completed job", lambda: load.first_completed(sent_after=killed), timeout_s
    )
    return Round(
        down_s=down_s,
        restart_to_answer_s=round(answered - starting, 3),
        answer_to_first_accepted_s=round(accepted - answered, 3),
        answer_to_first_completed_s=round(completed - answered, 3),
        kill_to_first_accepted_s=round(accepted - killed, 3),
        kill_to_first_completed_s=round(completed - killed, 3),
    )


@contextlib.contextmanager
def running_stack(scratch: Path) -> Iterator[LocalStack]:
    stack = LocalStack(stack_settings(scratch), StackPlan(streaming=False, workers=0))
    try:
        stack.up()
        yield stack
    finally:
        stack.down()


def run(rounds: int, *, down_s: float, every_s: float, settle_s: float) -> list[Round]:
    from dispatch.auth import ensure_dev_keys

    results: list[Round] = []
    with (
        tempfile.TemporaryDirectory(prefix="dispatch-restart-") as scratch,
        running_stack(Path(scratch)) as stack,
    ):
        keys = ensure_dev_keys(stack.settings.auth)
        with Load([node.url for node in stack.nodes], keys, every_s) as load:
            started = time.monotonic()
            wait_for("completed job", lambda: load.first_completed(sent_after=started), 60)
            time.sleep(settle_s)
            for number in range(rounds):
                result = restart_round(stack, load, down_s, timeout_s=120)
                # Progress on stderr: stdout is the summary alone (JSON with --json).
                print(f"round {number + 1}: {json.dumps(asdict(result))}", file=sys.stderr)
                results.append(result)
                time.sleep(settle_s)
    return results


@unwinds_on_sigterm
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.restart_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--down", type=float, default=3.0, help="seconds the broker stays dead")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between submissions")
    parser.add_argument("--settle", type=float, default=3.0, help="load between rounds (s)")
    parser.add_argument(
        "--json", action="store_true", help="print only the summary, as JSON on stdout"
    )
    parser.add_argument("--out", type=Path, help="also write the summary as JSON to this file")
    args = parser.parse_args(argv)
    results = run(args.rounds, down_s=args.down, every_s=args.every, settle_s=args.settle)
    summary = {
        "rounds": [asdict(r) for r in results],
        "max_answer_to_first_accepted_s": max(r.answer_to_first_accepted_s for r in results),
        "max_answer_to_first_completed_s": max(r.answer_to_first_completed_s for r in results),
        "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"{len(results)} rounds: the first submission accepted at most "
            f"{summary['max_answer_to_first_accepted_s']:.2f} s, the first job completed at "
            f"most {summary['max_answer_to_first_completed_s']:.2f} s after the broker answered"
        )
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
