"""Concurrency keys: what a job may carry as its `key` (see `dispatch.core.limits`).

Its own module because the job record checks a key and the limits hold jobs: each imports
this, not the other.
"""

from __future__ import annotations

from dispatch.core import _validate as v

MAX_KEY_LENGTH = 200
"""Longest concurrency key (or key pattern) a job or a limit may name."""


def check_key(value: object, label: str = "key") -> str:
    """A job's concurrency key: 1 to MAX_KEY_LENGTH printable characters, no `*`."""
    key = v.as_str(value, label)
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"{label}: expected 1 to {MAX_KEY_LENGTH} characters")
    if not key.isprintable():
        raise ValueError(f"{label}: control characters are not allowed")
    if "*" in key:
        raise ValueError(f"{label}: '*' is kept for key patterns")
    return key
