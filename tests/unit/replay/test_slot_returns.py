"""Matching a worker's credit to the attempts whose slots it gave back."""

from __future__ import annotations

from dispatch.replay.slot_returns import PAIR_S, SlotReturns


def test_a_credit_after_an_answer_returns_that_attempts_slot() -> None:
    returns = SlotReturns()
    returns.settled("w", "a", started_at=10.0, at=12.0)
    returns.granted("w", 1, False, 12.25, position=7)
    assert returns.holds == {"a": (2.25, 7)}


def test_a_credit_after_no_answer_returns_the_oldest_timed_out_attempts_slot() -> None:
    returns = SlotReturns()
    returns.timed_out("w", "first", started_at=10.0)
    returns.timed_out("w", "second", started_at=11.0)
    returns.granted("w", 1, False, 15.0, position=3)
    assert returns.holds == {"first": (5.0, 3)}


def test_grants_that_say_nothing_about_one_slot_are_ignored() -> None:
    returns = SlotReturns()
    returns.timed_out("w", "a", started_at=10.0)
    returns.granted("w", 4, False, 11.0, position=1)  # a join's or a hello's slots
    returns.granted("w", 1, True, 12.0, position=2)  # a REST poll replacing its credit
    returns.granted("other", 1, False, 13.0, position=3)  # another worker's
    assert returns.holds == {}


def test_an_answer_whose_credit_never_came_is_forgotten() -> None:
    returns = SlotReturns()
    returns.settled("w", "a", started_at=10.0, at=12.0)
    returns.timed_out("w", "b", started_at=11.0)
    returns.granted("w", 1, False, 12.0 + PAIR_S + 5.0, position=9)
    assert returns.holds == {"b": (PAIR_S + 6.0, 9)}


def test_a_lost_worker_returns_no_slots() -> None:
    returns = SlotReturns()
    returns.timed_out("w", "a", started_at=10.0)
    returns.lost("w")
    returns.granted("w", 1, False, 20.0, position=1)
    assert returns.holds == {}
