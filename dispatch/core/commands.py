"""Validated inputs: what a client asks for when it submits a job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatch.core import _validate as v
from dispatch.core.job import PRIORITY_MAX, PRIORITY_MIN
from dispatch.core.subjects import validate_exec

DEFAULT_CLIENT_ID = "default"

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
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRequest:
    """One job submission, validated on construction (ValueError naming the field).

    `max_attempts` and `timeout_s` default to the dispatcher's `CoreConfig`. A job runs no
    earlier than `delay_s` seconds after it is accepted, or than the absolute unix time
    `not_before` (give at most one of the two).
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

    def __post_init__(self) -> None:
        v.as_id(self.id, "id")
        try:
            validate_exec(self.exec)
        except ValueError as error:
            raise ValueError(f"exec: {error}") from None
        v.as_id(self.client_id, "client_id")
        v.as_opt_int(self.max_attempts, "max_attempts", minimum=1)
        v.as_opt_number(self.timeout_s, "timeout_s", positive=True)
        v.as_int(self.priority, "priority", PRIORITY_MIN, PRIORITY_MAX)
        v.as_number(self.delay_s, "delay_s", non_negative=True)
        v.as_opt_number(self.not_before, "not_before")
        if self.delay_s and self.not_before is not None:
            raise ValueError("delay_s: give delay_s or not_before, not both")
        # Times are floats in every event; normalise ints once here.
        for name in ("timeout_s", "delay_s", "not_before"):
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
        return out
