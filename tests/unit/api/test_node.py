"""The node's supervisor, with a stand-in for the leader term (no Kafka)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import api.node
from api.leader import collector_paused
from api.node import Node
from dispatch.settings import load_settings


class Cycle:
    """A term's state in miniature: it refers to itself, so only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collector_off() -> Iterator[None]:
    """Only explicit collections free cycles (none triggered by allocations)."""
    with collector_paused(freeze=False):
        yield


def test_a_terms_state_is_collected_before_the_next_term_starts(
    monkeypatch: pytest.MonkeyPatch, collector_off: None
) -> None:
    node = Node(load_settings(), "n1", "http://127.0.0.1:1")
    node.hub = SimpleNamespace()  # type: ignore[assignment]
    node.election.held.set()
    states: list[weakref.ref[Cycle]] = []
    alive_at_start: list[bool] = []

    class Term:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.core = SimpleNamespace(epoch=len(states) + 1)
            self.state = Cycle()
            states.append(weakref.ref(self.state))
            self.running = False  # the term ends as soon as it started

        def start(self) -> None:
            alive_at_start.append(any(state() is not None for state in states[:-1]))
            if len(states) == 3:
                node._stopping.set()

        def stop(self) -> None:
            pass

    monkeypatch.setattr(api.node, "Leader", Term)
    node._supervise()
    assert node.terms == 3
    assert alive_at_start == [False, False, False], "an earlier term's state was still held"
