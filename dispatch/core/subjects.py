"""NATS-style subject matching for worker routing.

A job of exec `image.resize` is offered on the subject `job.assign.image.resize`; a worker
pattern matches it token by token, where `*` matches exactly one token and `>` (last token
only) matches one or more remaining tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

ASSIGN_PREFIX = "job.assign."
_FORBIDDEN_CHARS = frozenset(" \t\r\n")
MAX_PATTERNS = 100
"""Subject patterns one worker may register. Matching a queue against a worker tries each
pattern, and every join is checked against every exec queue: the bound keeps both small (a
worker taking many kinds of job uses wildcards, `job.assign.image.>`)."""
MAX_PATTERN_CHARS = 256
"""Characters in one subject pattern (`job.assign.` plus an exec pattern)."""


def _tokens(text: str, what: str) -> list[str]:
    if not isinstance(text, str) or not text:
        raise ValueError(f"{what}: expected a non-empty string, got {text!r}")
    if any(ch in _FORBIDDEN_CHARS for ch in text):
        raise ValueError(f"{what}: whitespace is not allowed, got {text!r}")
    tokens = text.split(".")
    if any(not token for token in tokens):
        raise ValueError(f"{what}: empty token (leading, trailing or double dot) in {text!r}")
    return tokens


def validate_exec(exec_name: str) -> str:
    """Check an exec name (dotted tokens, no wildcards) and return it."""
    for token in _tokens(exec_name, "exec"):
        if "*" in token or ">" in token:
            raise ValueError(f"exec: wildcards are not allowed in an exec name, got {exec_name!r}")
    return exec_name


def compile_pattern(pattern: str) -> tuple[str, ...]:
    """Validate a subject pattern and return its tokens."""
    tokens = _tokens(pattern, "subject pattern")
    for index, token in enumerate(tokens):
        if token == ">":
            if index != len(tokens) - 1:
                raise ValueError(f"subject pattern: '>' must be the last token in {pattern!r}")
        elif "*" in token and token != "*":
            raise ValueError(f"subject pattern: '*' must be a whole token in {pattern!r}")
        elif ">" in token:
            raise ValueError(f"subject pattern: '>' must be a whole token in {pattern!r}")
    return tuple(tokens)


def validate_patterns(patterns: Iterable[str], *, bounded: bool = True) -> tuple[str, ...]:
    """Validate a worker's patterns: at least one, each well formed, duplicates dropped, in
    linear time. `bounded`: at most MAX_PATTERNS distinct patterns of at most
    MAX_PATTERN_CHARS characters each (pass False only to read back what an older version
    logged)."""
    if isinstance(patterns, str):
        raise ValueError(f"subjects: expected a list of patterns, got the string {patterns!r}")
    # A dict, not a list: `in` on a list made 30,000 patterns take seconds (quadratic).
    result: dict[str, None] = {}
    for pattern in patterns:
        if bounded and isinstance(pattern, str) and len(pattern) > MAX_PATTERN_CHARS:
            raise ValueError(
                f"subject pattern: at most {MAX_PATTERN_CHARS} characters, got {len(pattern)}"
            )
        compile_pattern(pattern)
        result[pattern] = None
        if bounded and len(result) > MAX_PATTERNS:
            raise ValueError(
                f"subjects: at most {MAX_PATTERNS} patterns per worker "
                "(use wildcards such as job.assign.image.>)"
            )
    if not result:
        raise ValueError("subjects: at least one subject pattern is required")
    return tuple(result)


def match_tokens(pattern: tuple[str, ...], subject: tuple[str, ...]) -> bool:
    """True when the compiled pattern matches the tokenised subject."""
    n_subject = len(subject)
    for index, token in enumerate(pattern):
        if token == ">":
            # '>' needs at least one token to swallow.
            return index < n_subject
        if index >= n_subject:
            return False
        if token != "*" and token != subject[index]:
            return False
    return len(pattern) == n_subject


def subject_matches(pattern: str, subject: str) -> bool:
    """True when `pattern` matches the concrete `subject` (both dotted strings)."""
    return match_tokens(compile_pattern(pattern), tuple(subject.split(".")))


def assign_subject(exec_name: str) -> str:
    """The subject on which jobs of `exec_name` are offered."""
    return ASSIGN_PREFIX + exec_name


def any_pattern_matches_exec(patterns: Iterable[tuple[str, ...]], exec_name: str) -> bool:
    """True when one of the compiled patterns matches `job.assign.<exec_name>`."""
    subject = tuple(assign_subject(exec_name).split("."))
    return any(match_tokens(pattern, subject) for pattern in patterns)
