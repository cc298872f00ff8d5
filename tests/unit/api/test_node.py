"""The node's supervisor, with a stand-in for the leader term (no Kafka)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import dispatch.api.node
from dispatch.api.leader import collector_paused
from dispatch.api.node import Node
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

    monkeypatch.setattr(dispatch.api.node, "Leader", Term)
    node._supervise()
    assert node.terms == 3
    assert alive_at_start == [False, False, False], "an earlier term's state was still held"


def test_a_stalled_loop_gives_up_the_lease_and_the_node_is_not_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = Node(load_settings(), "n1", "http://127.0.0.1:1")
    node.hub = SimpleNamespace()  # type: ignore[assignment]
    node.election.held.set()
    given_up: list[str] = []
    seen_ready: list[str | None] = []

    def give_up(why: str) -> None:
        given_up.append(why)
        node.election.held.clear()
        node._stopping.set()

    monkeypatch.setattr(node.election, "give_up", give_up)

    class StalledTerm:
        stall_bound_s = 0.3

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.core = SimpleNamespace(epoch=1)
            self.ready = SimpleNamespace(is_set=lambda: True)
            self.error = None
            self.running = True
            self.started = 0.0

        def start(self) -> None:
            self.started = time.monotonic()

        def elapsed(self) -> float:
            # The loop completed its last iteration when the term started, never again.
            return time.monotonic() - self.started

        def stalled_s(self) -> float:
            seen_ready.append(node.not_ready_reason())
            return self.elapsed()

        def not_working(self) -> str | None:
            return "stalled" if self.elapsed() > self.stall_bound_s else None

        def stop(self) -> None:
            self.running = False

    monkeypatch.setattr(dispatch.api.node, "Leader", StalledTerm)
    node._supervise()
    assert given_up == ["the leader loop stalled"]
    assert seen_ready[0] is None and seen_ready[-1] == "stalled"
    assert not node.ready and node._leader is None


def test_a_refusal_to_lead_is_the_nodes_reason_not_to_be_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dispatch.api.kafka_log import SnapshotBehindLog
    from dispatch.api.leader import LogGap

    node = Node(load_settings(), "n1", "http://127.0.0.1:1")
    node.hub = SimpleNamespace()  # type: ignore[assignment]
    node.election.held.set()

    class RefusingTerm:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def start(self) -> None:
            node._stopping.set()
            raise LogGap(SnapshotBehindLog("dispatch.events", 0, 10, 500))

        def stop(self) -> None:
            pass

    monkeypatch.setattr(dispatch.api.node, "Leader", RefusingTerm)
    node._supervise()
    reason = node.not_ready_reason() or ""
    assert "dispatch.events[0] starts at 500, after the snapshot's offset 10" in reason
    assert not node.ready and node.terms == 0
