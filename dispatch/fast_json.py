"""JSON encoding for the hot paths: every event the leader commits, every submit record,
every assignment and settlement a worker is sent.

orjson encodes the small documents of these paths many times faster than the standard
library's encoder, and the leader's loop and the node's event loop share one GIL: under load,
the standard encoder took more than a quarter of the node's Python time (BENCHMARKS.md, *The
submit path*, second round).

Both produce compact JSON that any decoder reads alike (orjson writes non-ASCII characters as
UTF-8 where the standard encoder escapes them, `1e-5` where it writes `1e-05`). For the few
values orjson refuses and the standard encoder takes (an integer beyond 64 bits, which a
client's payload may hold), the standard encoder answers, so no document that encoded before
fails now.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """`value` as compact JSON bytes (UTF-8)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, separators=(",", ":")).encode()


def dumps_text(value: Any) -> str:
    """`value` as compact JSON text (a WebSocket text frame)."""
    return dumps(value).decode()
