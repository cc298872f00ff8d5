"""Field checks shared by the `from_dict` constructors: each names the bad field."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from dispatch.core.bounds import MAX_ID_LENGTH

_E = TypeVar("_E", bound=StrEnum)

_MISSING = object()

ID_PATTERN = r"^(\.?[A-Za-z0-9_:@-])+\.?$"
"""ID_RULE as a regular expression (no look-around, so any engine, OpenAPI's included, runs
it): every dot is followed by another allowed character or ends the id."""
_SUBMITTED_ID = re.compile(ID_PATTERN)
ID_RULE = f"1 to {MAX_ID_LENGTH} of A-Z a-z 0-9 . _ : @ -, without '..' and not '.'"
"""What a job id given at submission may be: safe as one URL path segment, as a Kafka key and
in a log line (no `/`, no `..`, no space or control character), so every route reaches it."""

_SHOWN_CHARS = 40


def show(value: Any) -> str:
    """A short, safe rendering of a bad value for an error message.

    Values come from anyone (a Kafka producer): repr of a 50,000-deep list raises
    RecursionError, of a 5,000-digit int ValueError, and of a 1 MiB string makes a 1 MiB
    message. Containers are named by their kind, long strings and ints are cut.
    """
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        return (
            repr(value)
            if abs(value) < 10**_SHOWN_CHARS
            else f"an integer of {value.bit_length()} bits"
        )
    if isinstance(value, str):
        return repr(value) if len(value) <= _SHOWN_CHARS else repr(value[:_SHOWN_CHARS]) + "..."
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def check_keys(data: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    """Refuse anything that is not a mapping with string keys among `allowed`."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(str(key)[:_SHOWN_CHARS] for key in data if key not in allowed)
    if unknown:
        # At most a few names: a hostile object may have thousands of keys.
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(f"{where}: unknown field(s) {unknown[:5]}{more}")


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
        raise ValueError(f"{label}: expected a non-empty string, got {show(value)}")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{label}: longer than {MAX_ID_LENGTH} characters")
    return value


def as_submitted_id(value: Any, label: str) -> str:
    """A job id as a submission may give it (ID_RULE). Ids read back from the log or a
    snapshot use `as_id`: they were accepted under older rules and must still replay."""
    text = as_id(value, label)
    if not _SUBMITTED_ID.fullmatch(text):
        raise ValueError(f"{label}: expected {ID_RULE}, got {show(text)}")
    return text


def as_printable_id(value: Any, label: str) -> str:
    """An id (`as_id`) without control characters, for ids named by configuration (a
    client id comes from an API key), which keep any other character they had."""
    text = as_id(value, label)
    if not text.isprintable():
        raise ValueError(f"{label}: control characters are not allowed, got {show(text)}")
    return text


def as_opt_id(value: Any, label: str) -> str | None:
    return None if value is None else as_id(value, label)


def as_str(value: Any, label: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{label}: expected a string, got {show(value)}")
    return value


def as_opt_str(value: Any, label: str) -> str | None:
    return None if value is None else as_str(value, label)


def as_int(value: Any, label: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{label}: expected an integer, got {show(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{label}: expected an integer >= {minimum}, got {show(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{label}: expected an integer <= {maximum}, got {show(value)}")
    return value


def as_opt_int(value: Any, label: str, minimum: int | None = None) -> int | None:
    return None if value is None else as_int(value, label, minimum)


def as_number(
    value: Any, label: str, *, positive: bool = False, non_negative: bool = False
) -> float:
    """A finite int or float, returned as float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{label}: expected a number, got {show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        raise ValueError(f"{label}: expected a finite number, got {show(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{label}: expected a finite number, got {show(value)}")
    if positive and number <= 0:
        raise ValueError(f"{label}: expected a number > 0, got {show(value)}")
    if non_negative and number < 0:
        raise ValueError(f"{label}: expected a number >= 0, got {show(value)}")
    return number


def as_opt_number(value: Any, label: str, *, positive: bool = False) -> float | None:
    return None if value is None else as_number(value, label, positive=positive)


def as_bool(value: Any, label: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{label}: expected true or false, got {show(value)}")
    return value


def as_enum(enum: type[_E], value: Any, label: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum)
        raise ValueError(f"{label}: expected one of {allowed}, got {show(value)}") from None


def as_opt_enum(enum: type[_E], value: Any, label: str) -> _E | None:
    return None if value is None else as_enum(enum, value, label)


def as_str_tuple(value: Any, label: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(f"{label}: expected a list of strings, got {show(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"{label}[{index}]: expected a string, got {show(item)}")
    return tuple(value)
