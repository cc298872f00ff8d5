"""Which handler runs a job: handlers are registered by exec pattern (`image.*`), which is
the subject pattern `job.assign.image.*` in NATS style (`*` one token, `>` one or more).

Matching reuses the core's matcher, so a worker and the dispatcher cannot disagree about
what a pattern means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from dispatch.core.subjects import ASSIGN_PREFIX, compile_pattern, match_tokens

H = TypeVar("H")


def subject_of(exec_pattern: str) -> str:
    """The subject pattern a worker registers for an exec pattern: `image.*` →
    `job.assign.image.*`. Raises ValueError for a malformed pattern."""
    compile_pattern(exec_pattern)
    return ASSIGN_PREFIX + exec_pattern


def exec_pattern_of(subject: str) -> str:
    """The exec pattern inside a subject pattern: `job.assign.image.*` → `image.*`."""
    if not subject.startswith(ASSIGN_PREFIX) or len(subject) == len(ASSIGN_PREFIX):
        raise ValueError(
            f"expected a subject pattern such as {ASSIGN_PREFIX}image.*, got {subject!r}"
        )
    pattern = subject[len(ASSIGN_PREFIX) :]
    compile_pattern(pattern)
    return pattern


def covers(general: Sequence[str], specific: Sequence[str]) -> bool:
    """True when every subject `specific` matches is also matched by `general` (both are
    compiled patterns). Used to check a worker's subscription against its handlers."""
    for index, token in enumerate(general):
        if token == ">":
            return index < len(specific)
        if index >= len(specific) or specific[index] == ">":
            return False
        if token != "*" and token != specific[index]:
            return False
    return len(general) == len(specific)


def _specificity(tokens: Sequence[str]) -> tuple[int, int]:
    literals = sum(1 for token in tokens if token not in ("*", ">"))
    return literals, 0 if tokens and tokens[-1] == ">" else 1


@dataclass(frozen=True)
class Route(Generic[H]):
    pattern: str
    tokens: tuple[str, ...]
    handler: H
    order: int


class HandlerTable(Generic[H]):
    """Exec patterns → handlers. When several patterns match an exec, the most specific one
    wins: the most literal tokens, then `*` over `>`, then the one registered first."""

    def __init__(self) -> None:
        self._routes: list[Route[H]] = []

    def add(self, pattern: str, handler: H) -> None:
        tokens = compile_pattern(pattern)
        if any(route.pattern == pattern for route in self._routes):
            raise ValueError(f"a handler for {pattern!r} is already registered")
        self._routes.append(Route(pattern, tokens, handler, len(self._routes)))

    @property
    def patterns(self) -> list[str]:
        return [route.pattern for route in self._routes]

    @property
    def subjects(self) -> list[str]:
        """The subject patterns that cover every handler (what the worker registers)."""
        return [ASSIGN_PREFIX + route.pattern for route in self._routes]

    def route(self, exec_name: str) -> Route[H] | None:
        """The route of the handler for a job of `exec_name`, or None."""
        subject = tuple(exec_name.split("."))
        matching = [route for route in self._routes if match_tokens(route.tokens, subject)]
        if not matching:
            return None
        return max(matching, key=lambda route: (*_specificity(route.tokens), -route.order))

    def uncovered(self, subjects: Iterable[str]) -> list[str]:
        """The subject patterns no single handler pattern covers (a worker subscribing to
        them could be sent jobs it has no handler for)."""
        missing = []
        for subject in subjects:
            tokens = compile_pattern(exec_pattern_of(subject))
            if not any(covers(route.tokens, tokens) for route in self._routes):
                missing.append(subject)
        return missing

    def __len__(self) -> int:
        return len(self._routes)
