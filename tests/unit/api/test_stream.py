from __future__ import annotations

import json

from dispatch.api.routes.stream import ASSIGN_MANY_MAX_BYTES, assign_many_messages


def _assignment(n: int, payload_bytes: int) -> dict[str, object]:
    return {"id": f"job-{n}", "exec": "a.b", "payload": "p" * payload_bytes, "attempt": 1,
            "deadline": 1.5, "lease": "L"}  # fmt: skip


def test_assignments_committed_together_go_in_one_message_in_order() -> None:
    assignments = [_assignment(n, 10) for n in range(5)]
    [message] = assign_many_messages(assignments)
    assert json.loads(message) == {"type": "assign_many", "assignments": assignments}


def test_many_large_assignments_are_split_under_the_bound_and_none_is_lost() -> None:
    assignments = [_assignment(n, 50_000) for n in range(20)]
    messages = assign_many_messages(assignments)
    assert len(messages) > 1
    assert all(len(message.encode()) <= ASSIGN_MANY_MAX_BYTES + 200 for message in messages)
    carried = [a for m in messages for a in json.loads(m)["assignments"]]
    assert carried == assignments


def test_one_assignment_larger_than_the_bound_goes_alone() -> None:
    big = _assignment(0, ASSIGN_MANY_MAX_BYTES * 2)
    messages = assign_many_messages([_assignment(1, 10), big, _assignment(2, 10)])
    assert [len(json.loads(m)["assignments"]) for m in messages] == [1, 1, 1]


def test_nothing_taken_sends_nothing() -> None:
    assert assign_many_messages([]) == []
