"""JSON encoding of events for the log: one event, or an ordered batch in one record.

A batch is a JSON array of event objects, in log order (one `dispatch.events` record may
carry everything one transaction decided: docs/spec.md, *Amortise per-record cost*).
`decode_events` accepts either form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dispatch.core.events import Event, event_from_dict

_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode_event(event: Event) -> bytes:
    """One event as compact UTF-8 JSON."""
    return _DUMPS(event.to_dict()).encode()


def encode_events(events: Iterable[Event]) -> bytes:
    """An ordered batch of events as one compact UTF-8 JSON array."""
    return _DUMPS([event.to_dict() for event in events]).encode()


def decode_events(data: bytes | str) -> list[Event]:
    """Events from a JSON object (one event) or array (a batch), validated.

    Raises ValueError on bad JSON or a bad event; the message names the position and field,
    e.g. "event[3]: assigned.lease: missing required field".
    """
    try:
        parsed: Any = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"events: not valid UTF-8 JSON ({error})") from None
    if isinstance(parsed, dict):
        return [event_from_dict(parsed)]
    if not isinstance(parsed, list):
        raise ValueError(f"events: expected an object or an array, got {type(parsed).__name__}")
    events: list[Event] = []
    for index, item in enumerate(parsed):
        try:
            events.append(event_from_dict(item))
        except ValueError as error:
            raise ValueError(f"event[{index}]: {error}") from None
    return events
