"""What a handler receives (`Assignment`), how it signals failure (`Retry`,
`PermanentError`), and how an attempt's end becomes an ack or a failure (`Outcome`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import PrivateAttr

from dispatch import wire
from dispatch.core.progress import check_progress


class Retry(Exception):
    """Fail this attempt as retryable: the job runs again (attempt + 1) if attempts remain,
    else it goes to the dead-letter queue. Any other exception does the same.

    The next attempt waits the job's retry delay (its retry policy), or `delay_s` seconds
    when given (`raise Retry("rate limited", delay_s=30)`: the handler knows best, e.g. from
    a Retry-After header)."""

    def __init__(self, *args: object, delay_s: float | None = None) -> None:
        super().__init__(*args)
        if delay_s is not None and not (isinstance(delay_s, int | float) and delay_s >= 0):
            raise ValueError(f"Retry(delay_s=...): expected a number >= 0, got {delay_s!r}")
        self.delay_s = None if delay_s is None else float(delay_s)


class PermanentError(Exception):
    """Fail the job for good: it goes to the dead-letter queue at once, however many
    attempts remain."""


class JobCancelled(Exception):
    """Raised by `Assignment.raise_if_cancelled()`: the attempt was told to stop. The
    worker settles it as `cancelled: <reason>`, whatever the handler raised."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cancelled: {reason}")
        self.reason = reason


class _StopSignal:
    """Whether an attempt was told to stop, and why: set from the worker's loop, read by a
    handler in any thread. Not part of an assignment's value: every signal equals every
    other, so equality (and what is serialised: only fields) ignores it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason: str | None = None

    def set(self, reason: str) -> bool:
        """Say stop (the first reason wins); False when it was said already."""
        if self.event.is_set():
            return False
        self.reason = reason
        self.event.set()
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _StopSignal)

    __hash__ = None  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict[int, Any]) -> _StopSignal:
        return _StopSignal()  # a copy is a new value: not told to stop (and Events do not copy)


class _Progress:
    """The latest progress report of an attempt: written by its handler (any thread), read
    by the worker's loop, which is woken (`listen`) when a report waits to be sent. Not part
    of an assignment's value, as `_StopSignal`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, Any] | None = None
        self._waiting = False
        self._notify: Callable[[], None] | None = None

    def put(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._latest = report
            wake = not self._waiting
            self._waiting = True
            notify = self._notify
        if wake and notify is not None:  # one wake-up per waiting report, however many come
            notify()

    def take(self, *, again: bool = False) -> dict[str, Any] | None:
        """The report waiting to be sent (None: none), no longer waiting; with `again`,
        the latest even when it was sent already."""
        with self._lock:
            if not (self._waiting or again):
                return None
            self._waiting = False
            return self._latest

    @property
    def waiting(self) -> bool:
        with self._lock:
            return self._waiting

    @property
    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._latest

    def listen(self, notify: Callable[[], None] | None) -> None:
        """Call `notify` (from the reporting thread) when a report starts waiting; at once
        when one waits already."""
        with self._lock:
            self._notify = notify
            waiting = self._waiting
        if waiting and notify is not None:
            notify()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Progress)

    __hash__ = None  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict[int, Any]) -> _Progress:
        return _Progress()


class Assignment(wire.Assignment):
    """One attempt at a job, as a handler receives it: the wire assignment (`id, exec,
    payload, attempt, deadline, lease`) and the id of the worker running it. `deadline` is
    the leader's clock (epoch seconds); heartbeats move it while the handler runs.

    `cancelled` turns true when the worker is told to stop this attempt (the job was
    cancelled, the attempt reached the job's `max_run_s`, or the leader took it back);
    `cancel_reason` says which (`cancel_requested`, `time_limit`, `ended`). A sync handler
    checks it (or `raise_if_cancelled()`, `wait_cancelled(timeout)`); an async handler's
    task is cancelled as well (`asyncio.CancelledError` at its current `await`).

    `progress(done, total, message)` reports how far the handler got: the worker sends the
    latest report with a heartbeat, at most about one a second (see `progress`)."""

    worker_id: str

    _stop: _StopSignal = PrivateAttr(default_factory=_StopSignal)
    _progress: _Progress = PrivateAttr(default_factory=_Progress)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress: `done` (a number >= 0) of `total` (a number >= 0, or None when
        unknown), with an optional `message` (at most 200 characters); a `ValueError` names
        a bad one. Cheap and safe from any thread: it only keeps the report. The worker
        sends the latest one with the attempt's next heartbeat, and sends a heartbeat early
        for it when at least a second passed since it last sent one (reports in between are
        replaced by later ones). Clients see it as the job's `progress`."""
        report = check_progress({"done": done, "total": total, "message": message})
        self._progress.put(report)

    @property
    def last_progress(self) -> dict[str, Any] | None:
        """The latest report (`{done, total, message}`), None before the first."""
        return self._progress.latest

    @property
    def cancelled(self) -> bool:
        """True once the worker was told to stop this attempt."""
        return self._stop.event.is_set()

    @property
    def cancel_reason(self) -> str | None:
        """Why it must stop (`cancel_requested`, `time_limit`, `ended`), None until then."""
        return self._stop.reason

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block (a sync handler's thread) until told to stop or `timeout` seconds passed;
        True when told to stop. Handy as an interruptible `time.sleep`."""
        return self._stop.event.wait(timeout)

    def raise_if_cancelled(self) -> None:
        """Raise `JobCancelled` once told to stop (the attempt then ends `cancelled`)."""
        reason = self._stop.reason
        if self._stop.event.is_set():
            raise JobCancelled(reason or "cancel_requested")

    def request_cancel(self, reason: str) -> bool:
        """Tell the handler to stop (the worker runtime calls it; the first reason wins).
        False when it was told already."""
        return self._stop.set(reason)

    @classmethod
    def from_message(cls, message: Mapping[str, Any], worker_id: str) -> Assignment:
        """Read an assignment as the leader sends it (REST poll, WebSocket `assign`);
        a `ValueError` (pydantic's `ValidationError`) names what is missing or malformed."""
        return cls.model_validate({**message, "worker_id": worker_id})


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: what is sent to the leader."""

    kind: Literal["ack", "fail"]
    result: Any = None
    error: str = ""
    retryable: bool = True
    retry_after_s: float | None = None
    """The worker's own delay before the next attempt (None: the job's retry policy)."""


def outcome_of_error(error: BaseException) -> Outcome:
    """`PermanentError` → a permanent failure; `Retry` and anything else → retryable."""
    if isinstance(error, PermanentError):
        return Outcome("fail", error=str(error) or "PermanentError", retryable=False)
    if isinstance(error, Retry):
        return Outcome(
            "fail", error=str(error) or "Retry", retryable=True, retry_after_s=error.delay_s
        )
    return Outcome("fail", error=f"{type(error).__name__}: {error}".rstrip(": "), retryable=True)


def outcome_of_result(result: Any) -> Outcome:
    """An ack with `result`, or a permanent failure when it cannot travel as JSON (running
    the same handler again would return the same)."""
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as error:
        return Outcome("fail", error=f"the result is not JSON: {error}", retryable=False)
    return Outcome("ack", result=result)


def stopped(reason: str) -> Outcome:
    """A handler that ended (raised, or its task was cancelled) after it was told to stop:
    not retryable (the leader decides: `cancelled` for a cancel, a refusal when the attempt
    is no longer this worker's)."""
    return Outcome("fail", error=f"cancelled: {reason}", retryable=False)


def released(worker_id: str) -> Outcome:
    # Nothing failed: the worker stopped. The job may run again at once, elsewhere.
    return Outcome(
        "fail", error=f"worker {worker_id} stopped before the job finished", retry_after_s=0.0
    )
