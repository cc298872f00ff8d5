"""When each attempt gave its worker's slot back: read from the worker's credit.

A worker grants one credit each time a slot frees (the worker SDK's WebSocket transport does,
whether its answer was accepted or not), as a message of its own after its answer: it may
reach the leader an iteration after the answer, and the slot is only usable from then on. So
a worker's grant of one credit that follows one of its accepted answers (within `PAIR_S`)
returns that attempt's slot; one that follows no answer of its own returns the slot of an
attempt that had timed out (the log shows when an attempt timed out, not when its worker gave
up on it: the late answer is refused and not logged) and is matched to the worker's oldest
timed-out attempt still holding one. Either way the attempt held its slot from its start to
that grant.

A worker that grants otherwise (REST polls replace their credit; a reconnection's hello states
its free slots) shows no such grants, and its timed-out attempts are left unmatched: the
history then estimates them (`dispatch.replay.history`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

PAIR_S = 1.0
"""A settlement and the credit the worker sends after it reach the leader this close together
(one iteration apart at most, normally the same one)."""


class SlotReturns:
    """Fed a worker's settlements, timeouts and grants in log order; `holds` maps each matched
    attempt to (seconds it held its slot, the log position of the grant that returned it)."""

    def __init__(self) -> None:
        self._settled: dict[str, deque[tuple[Hashable, float, float]]] = {}
        self._holding: dict[str, deque[tuple[Hashable, float]]] = {}
        self.holds: dict[Hashable, tuple[float, int]] = {}

    def settled(self, worker_id: str, attempt: Hashable, started_at: float, at: float) -> None:
        """The worker's answer for `attempt` (started at `started_at`) was accepted at `at`."""
        self._settled.setdefault(worker_id, deque()).append((attempt, started_at, at))

    def timed_out(self, worker_id: str, attempt: Hashable, started_at: float) -> None:
        """`attempt`, started on the worker at `started_at`, timed out: it holds a slot there
        until the worker's late answer."""
        self._holding.setdefault(worker_id, deque()).append((attempt, started_at))

    def granted(
        self, worker_id: str, credits: int, replace: bool, at: float, position: int
    ) -> None:
        """The worker granted `credits` at `at` (log position `position`)."""
        if replace or credits != 1:
            return
        settled = self._settled.get(worker_id)
        while settled and settled[0][2] < at - PAIR_S:
            settled.popleft()  # its credit never came (the worker went away): forget it
        if settled:
            attempt, started_at, _ = settled.popleft()
        else:
            holding = self._holding.get(worker_id)
            if not holding:
                return
            attempt, started_at = holding.popleft()
        self.holds[attempt] = (max(0.0, at - started_at), position)

    def lost(self, worker_id: str) -> None:
        """The worker is gone: its slots come back with it no more."""
        self._settled.pop(worker_id, None)
        self._holding.pop(worker_id, None)
