"""Validated inputs: what a client asks for when it submits a job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatch.core import _validate as v
from dispatch.core.bounds import check_json_value
from dispatch.core.job import PRIORITY_MAX, PRIORITY_MIN
from dispatch.core.limits import MAX_KEY_LENGTH, check_key
from dispatch.core.retry import RetryPolicy
from dispatch.core.subjects import validate_exec

DEFAULT_CLIENT_ID = "default"

# The bounds of a submission. Both edges (REST bodies, `dispatch.submit` records) build a
# SubmitRequest, so these are the one place the rules live; the REST models only repeat them
# for the OpenAPI document. Each keeps a value inside what every consumer stores (the Delta
# tables hold attempts and priority as int32, times as float64 and as timestamps).
MAX_ATTEMPTS_LIMIT = 1_000
"""Most attempts a job may ask for: far above any sane retry policy, far below int32."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""Longest ack timeout a job may ask for (a week; a longer job should heartbeat)."""
MAX_DELAY_S = 366 * 24 * 3600.0
"""Longest delay before a job may run (a year)."""
MAX_NOT_BEFORE = 253_402_300_799.0
"""Latest `not_before`: 9999-12-31T23:59:59Z, the last instant a timestamp column holds."""
__all__ = ["MAX_KEY_LENGTH", "SubmitRequest"]

MAX_EXEC_LENGTH = 255
"""Longest exec name (it is a subject, a metric label and a Delta partition value)."""

_FIELDS = frozenset(
    {
        "id",
        "exec",
        "payload",
        "client_id",
        "max_attempts",
        "timeout_s",
        "priority",
        "delay_s",
        "not_before",
        "retry",
        "expires_at",
        "ttl_s",
        "max_run_s",
        "key",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRequest:
    """One job submission, validated on construction (ValueError naming the field).

    `max_attempts` and `timeout_s` default to the dispatcher's `CoreConfig`. A job runs no
    earlier than `delay_s` seconds after it is accepted, or than the absolute unix time
    `not_before` (give at most one of the two).

    `retry` holds some or all of a retry policy's fields (`delay_s`, `multiplier`,
    `max_delay_s`, `jitter`); those it leaves out come from its exec's default when the job
    is enqueued. A job not started `ttl_s` seconds after it is accepted, or by the unix time
    `expires_at` (at most one of the two), ends `expired`.

    `max_run_s` is the hard time limit of each attempt (heartbeats cannot carry one past it);
    None: its exec's default (`CoreConfig.max_run_for`), decided when it is enqueued.

    `key` is the job's concurrency key (`"account:42"`): the key limits in force
    (`dispatch.core.limits`) count and hold the jobs that carry it.
    """

    id: str
    exec: str
    payload: Any
    client_id: str = DEFAULT_CLIENT_ID
    max_attempts: int | None = None
    timeout_s: float | None = None
    priority: int = 0
    delay_s: float = 0.0
    not_before: float | None = None
    retry: Mapping[str, Any] | None = None
    expires_at: float | None = None
    ttl_s: float | None = None
    max_run_s: float | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        v.as_submitted_id(self.id, "id")
        _check_exec(self.exec)
        v.as_printable_id(self.client_id, "client_id")
        if self.max_attempts is not None:
            v.as_int(self.max_attempts, "max_attempts", 1, MAX_ATTEMPTS_LIMIT)
        if self.timeout_s is not None:
            _at_most(
                v.as_number(self.timeout_s, "timeout_s", positive=True), MAX_TIMEOUT_S, "timeout_s"
            )
        v.as_int(self.priority, "priority", PRIORITY_MIN, PRIORITY_MAX)
        _at_most(v.as_number(self.delay_s, "delay_s", non_negative=True), MAX_DELAY_S, "delay_s")
        if self.not_before is not None:
            number = v.as_number(self.not_before, "not_before", non_negative=True)
            _at_most(number, MAX_NOT_BEFORE, "not_before")
        check_json_value(self.payload, label="payload")
        if self.delay_s and self.not_before is not None:
            raise ValueError("delay_s: give delay_s or not_before, not both")
        if self.retry is not None:
            # Each field checked on its own (the policy has no rule across fields).
            RetryPolicy().merged(self.retry)
            object.__setattr__(self, "retry", dict(self.retry))
        if self.expires_at is not None:
            number = v.as_number(self.expires_at, "expires_at", non_negative=True)
            _at_most(number, MAX_NOT_BEFORE, "expires_at")
        if self.ttl_s is not None:
            _at_most(v.as_number(self.ttl_s, "ttl_s", positive=True), MAX_DELAY_S, "ttl_s")
            if self.expires_at is not None:
                raise ValueError("ttl_s: give ttl_s or expires_at, not both")
        if self.max_run_s is not None:
            number = v.as_number(self.max_run_s, "max_run_s", positive=True)
            _at_most(number, MAX_DELAY_S, "max_run_s")
        if self.key is not None:
            check_key(self.key)
        # Times are floats in every event; normalise ints once here.
        for name in ("timeout_s", "delay_s", "not_before", "expires_at", "ttl_s", "max_run_s"):
            value = getattr(self, name)
            if type(value) is int:
                object.__setattr__(self, name, float(value))

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, default_client_id: str = DEFAULT_CLIENT_ID
    ) -> SubmitRequest:
        """Parse a submission (REST body or `dispatch.submit` record value)."""
        where = "submit"
        v.check_keys(data, _FIELDS, where)
        return cls(
            id=v.field_value(data, "id", where),
            exec=v.field_value(data, "exec", where),
            payload=v.field_value(data, "payload", where),
            client_id=v.field_value(data, "client_id", where, default_client_id),
            max_attempts=v.field_value(data, "max_attempts", where, None),
            timeout_s=v.field_value(data, "timeout_s", where, None),
            priority=v.field_value(data, "priority", where, 0),
            delay_s=v.field_value(data, "delay_s", where, 0.0),
            not_before=v.field_value(data, "not_before", where, None),
            retry=v.field_value(data, "retry", where, None),
            expires_at=v.field_value(data, "expires_at", where, None),
            ttl_s=v.field_value(data, "ttl_s", where, None),
            max_run_s=v.field_value(data, "max_run_s", where, None),
            key=v.field_value(data, "key", where, None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "exec": self.exec,
            "payload": self.payload,
            "client_id": self.client_id,
            "priority": self.priority,
        }
        if self.max_attempts is not None:
            out["max_attempts"] = self.max_attempts
        if self.timeout_s is not None:
            out["timeout_s"] = self.timeout_s
        if self.delay_s:
            out["delay_s"] = self.delay_s
        if self.not_before is not None:
            out["not_before"] = self.not_before
        for name in ("retry", "expires_at", "ttl_s", "max_run_s", "key"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def _check_exec(value: object) -> None:
    # Type and length first: the subject check echoes the whole value in its message.
    exec_name = v.as_str(value, "exec")
    if len(exec_name) > MAX_EXEC_LENGTH:
        raise ValueError(f"exec: longer than {MAX_EXEC_LENGTH} characters")
    if not exec_name.isprintable():
        raise ValueError(f"exec: control characters are not allowed, got {v.show(exec_name)}")
    validate_exec(exec_name)  # its messages start with "exec: "


def _at_most(number: float, limit: float, label: str) -> None:
    if number > limit:
        raise ValueError(f"{label}: expected a number <= {limit:g}, got {number:g}")
