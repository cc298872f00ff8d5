"""The dispatcher core's settings: a frozen value built by the project's settings layer.

The core never reads files or environment variables; whoever constructs a `Dispatcher` passes
a `CoreConfig`. Field names match the `[dispatcher]` section of `conf/defaults.toml`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from dispatch.core.limits import Limit, LimitScope, check_target
from dispatch.core.retry import RetryPolicy
from dispatch.core.subjects import compile_pattern, match_tokens

T = TypeVar("T")
D = TypeVar("D")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")


def _check_positive_number(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreConfig:
    """Scheduling policy. Facts in the log never depend on it: replay needs no config."""

    default_cap: int = 100
    """Jobs one client may have running at once, unless `caps` names the client."""
    caps: Mapping[str, int] = field(default_factory=dict)
    """Per-client caps, client_id -> cap."""
    ack_timeout_s: float = 30.0
    """Ack deadline of attempt 1 for jobs that do not set their own `timeout_s`."""
    backoff_multiplier: float = 2.0
    """Attempt n waits timeout * multiplier ** (n - 1) ..."""
    max_ack_timeout_s: float = 600.0
    """... but never longer than this (or the job's own first timeout, if that is longer)."""
    max_attempts: int = 5
    """Attempts before the dead-letter queue, for jobs that do not set their own."""
    worker_expiry_s: float | None = 15.0
    """A worker silent this long is lost on the next tick; None: only explicit loss counts."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Delays between attempts of a job that sets no policy of its own and whose exec no
    `retry_by_exec` pattern matches. The default retries at once."""
    retry_by_exec: tuple[tuple[str, RetryPolicy], ...] = ()
    """(exec pattern, policy) pairs: the first pattern matching a job's exec (`*` one
    token, a final `>` one or more) gives its policy."""
    max_run_s: float | None = None
    """Hard time limit of each attempt of a job that sets none and whose exec no
    `max_run_by_exec` pattern matches; None: no limit (heartbeats keep a job forever)."""
    max_run_by_exec: tuple[tuple[str, float], ...] = ()
    """(exec pattern, seconds) pairs, matched as `retry_by_exec`."""
    cancel_grace_s: float = 30.0
    """How long a running job's worker has to stop after a cancel: the job ends `cancelled`
    when the worker confirms, or when this passes (whichever is first)."""
    limits: Mapping[str, Mapping[str, Limit]] = field(default_factory=dict)
    """Default runtime limits: scope (`client`, `exec`, `key`) -> target -> Limit. A
    runtime limit (`Dispatcher.set_limit`) on the same scope and target replaces one
    wholly; removing it brings this one back (see `dispatch.core.limits`)."""

    def __post_init__(self) -> None:
        _check_positive_int("default_cap", self.default_cap)
        if not isinstance(self.caps, Mapping):
            raise ValueError(f"caps: expected a mapping client_id -> cap, got {self.caps!r}")
        for client_id, cap in self.caps.items():
            if not isinstance(client_id, str) or not client_id:
                raise ValueError(f"caps: client ids must be non-empty strings, got {client_id!r}")
            _check_positive_int(f"caps[{client_id!r}]", cap)
        _check_positive_number("ack_timeout_s", self.ack_timeout_s)
        _check_positive_number("backoff_multiplier", self.backoff_multiplier)
        if self.backoff_multiplier < 1:
            raise ValueError(
                f"backoff_multiplier: expected a number >= 1, got {self.backoff_multiplier!r}"
            )
        _check_positive_number("max_ack_timeout_s", self.max_ack_timeout_s)
        if self.max_ack_timeout_s < self.ack_timeout_s:
            raise ValueError(
                "max_ack_timeout_s: must be at least ack_timeout_s "
                f"({self.max_ack_timeout_s!r} < {self.ack_timeout_s!r})"
            )
        _check_positive_int("max_attempts", self.max_attempts)
        if self.worker_expiry_s is not None:
            _check_positive_number("worker_expiry_s", self.worker_expiry_s)
        for name in ("ack_timeout_s", "backoff_multiplier", "max_ack_timeout_s"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.worker_expiry_s is not None:
            object.__setattr__(self, "worker_expiry_s", float(self.worker_expiry_s))
        # A read-only copy, so that a caller mutating its dict cannot change a running core.
        object.__setattr__(self, "caps", MappingProxyType(dict(self.caps)))
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError(f"retry: expected a RetryPolicy, got {self.retry!r}")
        compiled: list[tuple[tuple[str, ...], RetryPolicy]] = []
        for pair in self.retry_by_exec:
            pattern, policy = pair
            try:
                tokens = compile_pattern(pattern)
            except ValueError as error:
                raise ValueError(f"retry_by_exec[{pattern!r}]: {error}") from None
            if not isinstance(policy, RetryPolicy):
                raise ValueError(f"retry_by_exec[{pattern!r}]: expected a RetryPolicy")
            compiled.append((tokens, policy))
        object.__setattr__(self, "retry_by_exec", tuple(self.retry_by_exec))
        object.__setattr__(self, "_retry_patterns", tuple(compiled))
        if self.max_run_s is not None:
            _check_positive_number("max_run_s", self.max_run_s)
            object.__setattr__(self, "max_run_s", float(self.max_run_s))
        limits: list[tuple[tuple[str, ...], float]] = []
        for pattern, seconds in self.max_run_by_exec:
            try:
                tokens = compile_pattern(pattern)
            except ValueError as error:
                raise ValueError(f"max_run_by_exec[{pattern!r}]: {error}") from None
            _check_positive_number(f"max_run_by_exec[{pattern!r}]", seconds)
            limits.append((tokens, float(seconds)))
        object.__setattr__(self, "max_run_by_exec", tuple(self.max_run_by_exec))
        object.__setattr__(self, "_max_run_patterns", tuple(limits))
        _check_positive_number("cancel_grace_s", self.cancel_grace_s)
        object.__setattr__(self, "cancel_grace_s", float(self.cancel_grace_s))
        object.__setattr__(self, "limits", _checked_limits(self.limits))

    def retry_for(self, exec_name: str) -> RetryPolicy:
        """The default retry policy of jobs of `exec_name`."""
        return _first_match(self._retry_patterns, exec_name, self.retry)

    def max_run_for(self, exec_name: str) -> float | None:
        """The default hard time limit of attempts of jobs of `exec_name` (None: none)."""
        return _first_match(self._max_run_patterns, exec_name, self.max_run_s)

    _retry_patterns: tuple[tuple[tuple[str, ...], RetryPolicy], ...] = field(
        default=(), init=False, repr=False, compare=False
    )
    _max_run_patterns: tuple[tuple[tuple[str, ...], float], ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def cap_for(self, client_id: str) -> int:
        """The in-flight cap of one client."""
        return self.caps.get(client_id, self.default_cap)

    def ack_timeout(self, first_timeout_s: float, attempt: int) -> float:
        """The ack timeout of `attempt` (1-based) for a job whose attempt 1 waits `first_timeout_s`.

        Exponential backoff with a cap: first * multiplier ** (attempt - 1), at most
        max(max_ack_timeout_s, first_timeout_s), so a job that asks for a longer first timeout
        than the cap still gets it.
        """
        return ack_timeout(
            first_timeout_s, attempt, self.backoff_multiplier, self.max_ack_timeout_s
        )


def _checked_limits(
    limits: Mapping[str, Mapping[str, Limit]],
) -> Mapping[str, Mapping[str, Limit]]:
    """A read-only copy of valid default limits (ValueError naming the bad entry)."""
    if not isinstance(limits, Mapping):
        raise ValueError(f"limits: expected a mapping scope -> target -> limit, got {limits!r}")
    out: dict[str, Mapping[str, Limit]] = {}
    for scope_name, targets in limits.items():
        try:
            scope = LimitScope(scope_name)
        except ValueError:
            raise ValueError(
                f"limits: unknown scope {scope_name!r} (client, exec or key)"
            ) from None
        if not isinstance(targets, Mapping):
            raise ValueError(f"limits.{scope_name}: expected a mapping target -> limit")
        checked: dict[str, Limit] = {}
        for target, limit in targets.items():
            where = f"limits.{scope_name}[{target!r}]"
            try:
                name = check_target(scope, target, 255)
                if not isinstance(limit, Limit):
                    raise ValueError(f"expected a Limit, got {limit!r}")
                checked[name] = Limit.checked(limit.max_inflight, limit.rate, limit.burst)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
        out[scope.value] = MappingProxyType(checked)
    return MappingProxyType(out)


def _first_match(
    patterns: tuple[tuple[tuple[str, ...], T], ...], exec_name: str, default: D
) -> T | D:
    """The value of the first (pattern, value) pair whose pattern matches `exec_name`."""
    if patterns:
        tokens = tuple(exec_name.split("."))
        for pattern, value in patterns:
            if match_tokens(pattern, tokens):
                return value
    return default


def ack_timeout(first_timeout_s: float, attempt: int, multiplier: float, cap_s: float) -> float:
    """Backoff formula, shared by `CoreConfig.ack_timeout` and tests."""
    limit = cap_s if cap_s > first_timeout_s else first_timeout_s
    if attempt <= 1:
        return first_timeout_s
    # Grow step by step and stop at the cap: multiplier ** attempt could overflow a float.
    timeout = first_timeout_s
    for _ in range(attempt - 1):
        timeout *= multiplier
        if timeout >= limit:
            return limit
    return timeout
