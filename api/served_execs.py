"""Which execs the connected workers serve, so a submission nobody serves is answered with a
warning instead of waiting in silence.

The leader's loop owns the workers; a submission is answered on the request's thread, often
without a loop command at all (the submit fast path). So the loop publishes, after each
commit in which a worker joined or was lost, the distinct subject patterns of the workers it
knows, as one immutable value; a request reads that reference (atomic) and asks whether one
pattern matches `job.assign.<exec>`. Answers are cached per exec with the patterns they were
computed from, so the common case is one dict lookup. A node that leads no term knows
nothing: it warns about nothing.
"""

from __future__ import annotations

from dispatch.core.subjects import assign_subject, match_tokens

MAX_CACHED_EXECS = 10_000
"""Exec names remembered per set of patterns. Exec names come from clients: the bound keeps a
stream of distinct names from growing the cache (past it, each is matched again)."""


def unserved_warning(exec_name: str) -> str:
    return f"no worker serves exec {exec_name!r} now: the job waits until one does"


class _View:
    __slots__ = ("answers", "patterns")

    def __init__(self, patterns: frozenset[tuple[str, ...]]) -> None:
        self.patterns = patterns
        self.answers: dict[str, bool] = {}


class ServedExecs:
    """Written by the leader loop (`refresh`, `forget`), read by any request thread."""

    def __init__(self) -> None:
        self._view: _View | None = None

    def refresh(self, patterns: frozenset[tuple[str, ...]]) -> None:
        """The workers' patterns now (loop thread). Unchanged patterns keep the cache."""
        view = self._view
        if view is None or view.patterns != patterns:
            self._view = _View(patterns)

    def forget(self) -> None:
        """The term ended: nothing is known until the next one commits."""
        self._view = None

    def serves(self, exec_name: str) -> bool | None:
        """Whether a connected worker's pattern matches the exec; None when unknown."""
        view = self._view  # one read: a refresh meanwhile replaces the view, not its dict
        if view is None:
            return None
        served = view.answers.get(exec_name)
        if served is None:
            subject = tuple(assign_subject(exec_name).split("."))
            served = any(match_tokens(pattern, subject) for pattern in view.patterns)
            if len(view.answers) < MAX_CACHED_EXECS:
                view.answers[exec_name] = served
        return served

    def warning(self, exec_name: str) -> str | None:
        """The submit answer's `warning` for a job of `exec_name`: set only when it is known
        that no worker serves it."""
        return unserved_warning(exec_name) if self.serves(exec_name) is False else None
