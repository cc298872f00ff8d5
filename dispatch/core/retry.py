"""Retry delays: how long a job waits before its next attempt after a failed one.

A `RetryPolicy` gives the delay before attempt n + 1 once attempt n failed (a retryable
failure, or an ack timeout): `delay_s * multiplier ** (n - 1)`, at most `max_delay_s`, less
up to `jitter` of it. The jitter is drawn from a hash of the job id and the attempt, not from
a random source: the same job and attempt always get the same delay, so a replay of the log
(or a what-if replay of a window) gives the same times. The delay decided is written into the
`requeued` event (`not_before`), so folding the log never computes one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatch.core import _validate as v

MAX_RETRY_DELAY_S = 366 * 24 * 3600.0
"""Longest delay a policy or a worker may ask for (a year, as a submission's `delay_s`)."""

_POLICY_FIELDS = frozenset({"delay_s", "multiplier", "max_delay_s", "jitter"})


def _bounded_delay(value: object, label: str) -> float:
    number = v.as_number(value, label, non_negative=True)
    if number > MAX_RETRY_DELAY_S:
        raise ValueError(f"{label}: expected a number <= {MAX_RETRY_DELAY_S:g}, got {number:g}")
    return float(number)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Delays between attempts. The defaults retry at once (no delay): the bare core's
    behaviour; the settings give every deployment its own defaults per exec pattern."""

    delay_s: float = 0.0
    """The delay after attempt 1 failed."""
    multiplier: float = 2.0
    """Each later delay is this many times the previous one (>= 1)."""
    max_delay_s: float = 300.0
    """No delay is longer than this."""
    jitter: float = 0.0
    """A fraction in [0, 1]: the delay is drawn in [d * (1 - jitter), d], so that jobs that
    failed together (a database outage) do not all come back at the same instant."""

    def __post_init__(self) -> None:
        _bounded_delay(self.delay_s, "retry.delay_s")
        multiplier = v.as_number(self.multiplier, "retry.multiplier")
        if multiplier < 1:
            raise ValueError(f"retry.multiplier: expected a number >= 1, got {multiplier:g}")
        _bounded_delay(self.max_delay_s, "retry.max_delay_s")
        jitter = v.as_number(self.jitter, "retry.jitter", non_negative=True)
        if jitter > 1:
            raise ValueError(f"retry.jitter: expected a number between 0 and 1, got {jitter:g}")
        for name in ("delay_s", "multiplier", "max_delay_s", "jitter"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def delay(self, job_id: str, failed_attempt: int) -> float:
        """Seconds to wait before the attempt after `failed_attempt` (1-based)."""
        base = self.delay_s
        if base <= 0:
            return 0.0
        # Grow step by step and stop at the cap: multiplier ** n could overflow a float.
        for _ in range(failed_attempt - 1):
            if base >= self.max_delay_s:
                break
            base *= self.multiplier
        base = min(base, self.max_delay_s)
        if self.jitter > 0:
            base *= 1.0 - self.jitter * _unit_hash(job_id, failed_attempt)
        return base

    def to_dict(self) -> dict[str, float]:
        return {
            "delay_s": self.delay_s,
            "multiplier": self.multiplier,
            "max_delay_s": self.max_delay_s,
            "jitter": self.jitter,
        }

    @classmethod
    def from_dict(cls, data: Any, label: str = "retry") -> RetryPolicy:
        """A full policy (a record's, an event's): every field present."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{label}: expected a JSON object, got {type(data).__name__}")
        v.check_keys(data, _POLICY_FIELDS, label)
        try:
            return cls(**{name: v.field_value(data, name, label) for name in _POLICY_FIELDS})
        except ValueError as error:
            raise ValueError(str(error).replace("retry.", f"{label}.", 1)) from None

    def merged(self, data: Any, label: str = "retry") -> RetryPolicy:
        """This policy with the fields `data` (a submission's `retry` object) gives. A first
        delay longer than the maximum it inherits raises that maximum to it: asking for 10
        minutes and getting the default's 5 would surprise."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{label}: expected a JSON object, got {type(data).__name__}")
        v.check_keys(data, _POLICY_FIELDS, label)
        values = self.to_dict()
        values.update({name: data[name] for name in _POLICY_FIELDS if name in data})
        policy = RetryPolicy(**values)
        if "max_delay_s" not in data and policy.delay_s > policy.max_delay_s:
            policy = RetryPolicy(**{**policy.to_dict(), "max_delay_s": policy.delay_s})
        return policy


def _unit_hash(job_id: str, attempt: int) -> float:
    """A number in [0, 1) fixed by (job id, attempt): the jitter's draw."""
    digest = hashlib.blake2b(f"{job_id}\x00{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def check_retry_after(value: object, label: str = "retry_after_s") -> float | None:
    """A worker's own delay (None: the policy decides)."""
    if value is None:
        return None
    return _bounded_delay(value, label)
