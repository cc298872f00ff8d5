"""Field checks shared by the `from_dict` constructors: each names the bad field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

_E = TypeVar("_E", bound=StrEnum)

MAX_ID_LENGTH = 128
"""Longest job, client or worker id (matches the submit format in the README)."""

_MISSING = object()


def check_keys(data: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    """Refuse anything that is not a mapping with string keys among `allowed`."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(map(str, unknown))}")


def field_value(data: Mapping[str, Any], name: str, where: str, default: Any = _MISSING) -> Any:
    value = data.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ValueError(f"{where}.{name}: missing required field")
        return default
    return value


def as_id(value: Any, label: str) -> str:
    """A non-empty id string of at most MAX_ID_LENGTH characters."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{label}: expected a non-empty string, got {value!r}")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{label}: longer than {MAX_ID_LENGTH} characters")
    return value


def as_opt_id(value: Any, label: str) -> str | None:
    return None if value is None else as_id(value, label)


def as_str(value: Any, label: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{label}: expected a string, got {value!r}")
    return value


def as_opt_str(value: Any, label: str) -> str | None:
    return None if value is None else as_str(value, label)


def as_int(value: Any, label: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{label}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{label}: expected an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{label}: expected an integer <= {maximum}, got {value!r}")
    return value


def as_opt_int(value: Any, label: str, minimum: int | None = None) -> int | None:
    return None if value is None else as_int(value, label, minimum)


def as_number(
    value: Any, label: str, *, positive: bool = False, non_negative: bool = False
) -> float:
    """A finite int or float, returned as float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{label}: expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{label}: expected a finite number, got {value!r}")
    if positive and number <= 0:
        raise ValueError(f"{label}: expected a number > 0, got {value!r}")
    if non_negative and number < 0:
        raise ValueError(f"{label}: expected a number >= 0, got {value!r}")
    return number


def as_opt_number(value: Any, label: str, *, positive: bool = False) -> float | None:
    return None if value is None else as_number(value, label, positive=positive)


def as_bool(value: Any, label: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{label}: expected true or false, got {value!r}")
    return value


def as_enum(enum: type[_E], value: Any, label: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum)
        raise ValueError(f"{label}: expected one of {allowed}, got {value!r}") from None


def as_opt_enum(enum: type[_E], value: Any, label: str) -> _E | None:
    return None if value is None else as_enum(enum, value, label)


def as_str_tuple(value: Any, label: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"{label}: expected a list of strings, got {value!r}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"{label}[{index}]: expected a string, got {item!r}")
    return tuple(value)
