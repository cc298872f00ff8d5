"""Single submits from concurrent callers, gathered into shared requests (the SDK's side).

Why: a request costs the node, the broker and the SDK the same whether it carries one job or
fifty (per-request work is most of a single job's cost: BENCHMARKS.md, *The leader's log on
librdkafka*), so 64 tasks each sending their own `POST /v1/jobs` spend most of the machine on
requests. Here, while `max_in_flight` submit requests of a client are already on their way, a
new single submit waits for one of them to come back and goes with the others that gathered
meanwhile, in one `POST /v1/jobs:batch`. A caller alone never waits (nothing is in flight:
its job goes at once, in a `POST /v1/jobs` as before), so a sequential loop is unchanged;
under concurrency, requests carry many jobs and each caller still gets its own answer.

How: the callers themselves send. A caller that finds room sends what has gathered (its own
job first); when its request is answered, it hands the turn to the first caller still
waiting, which sends what gathered by then. No thread or task of the client's own.

A batch is all or nothing on the server (a refusal of one job refuses the request): when a
gathered request is refused (4xx), each of its jobs is sent again alone, so every caller gets
the answer its own job would have had. A failure past the client's retries (the dispatcher
unreachable) is every gathered caller's failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

Answer = TypeVar("Answer")
Body = dict[str, Any]

MAX_GATHERED = 200
"""Jobs one gathered request carries at most (far below the server's batch and size limits
for ordinary payloads; a request refused as too large falls back to one job a request)."""


class _Slot(Generic[Answer]):
    """One caller's job and how it ends: an answer, an error, or the turn to send."""

    __slots__ = ("answer", "body", "error", "turn")

    def __init__(self, body: Body) -> None:
        self.body = body
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self.turn = False


class _Turns(Generic[Answer]):
    """The gathering's state, shared by the thread and the asyncio versions (no I/O here).

    A caller holding a turn (`_Slot.turn`) sends one request: its own job first, then the
    oldest gathered jobs of callers without one. `in_flight` counts the turns held; a turn
    whose request came back passes to the oldest caller without one, or ends."""

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.pending: list[_Slot[Answer]] = []
        self.in_flight = 0

    def arrive(self, slot: _Slot[Answer]) -> bool:
        """Queue `slot`; True when it holds a turn at once (its caller sends now)."""
        self.pending.append(slot)
        if self.in_flight < self.max_in_flight:
            self.in_flight += 1
            slot.turn = True
        return slot.turn

    def take(self, sender: _Slot[Answer]) -> list[_Slot[Answer]]:
        """What `sender` (holding a turn) sends: its own job, then the oldest of the callers
        holding none (each caller with a turn sends its own)."""
        taken = [sender]
        kept: list[_Slot[Answer]] = []
        for slot in self.pending:
            if slot is sender:
                continue
            if slot.turn or len(taken) >= MAX_GATHERED:
                kept.append(slot)
            else:
                taken.append(slot)
        self.pending = kept
        return taken

    def done(self) -> _Slot[Answer] | None:
        """A turn's request came back: the caller it passes to (to be woken), if any."""
        for slot in self.pending:
            if not slot.turn:
                slot.turn = True
                return slot
        self.in_flight -= 1
        return None


def _settle(
    slots: list[_Slot[Answer]], answers: list[Answer] | None, error: BaseException | None
) -> None:
    for index, slot in enumerate(slots):
        if error is not None:
            slot.error = error
        else:
            assert answers is not None
            slot.answer = answers[index]


def _refused(error: BaseException) -> bool:
    """A request the server refused as a whole (4xx), where one job's fault could be the
    reason: its jobs are sent again alone."""
    status = getattr(error, "status", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (401, 403)


def _settled(slot: _Slot[Answer]) -> bool:
    return slot.answer is not None or slot.error is not None


class ThreadGatherer(Generic[Answer]):
    """For `Client`, shared by the caller's threads."""

    def __init__(
        self,
        send_one: Callable[[Body], Answer],
        send_many: Callable[[list[Body]], list[Answer]],
        max_in_flight: int,
    ) -> None:
        self._send_one, self._send_many = send_one, send_many
        self._turns: _Turns[Answer] = _Turns(max_in_flight)
        self._changed = threading.Condition()

    def submit(self, body: Body) -> Answer:
        slot: _Slot[Answer] = _Slot(body)
        with self._changed:
            if not self._turns.arrive(slot):
                while not (slot.turn or _settled(slot)):
                    self._changed.wait()
                if _settled(slot):  # it went in another caller's request
                    return _answer(slot)
            taken = self._turns.take(slot)
        try:
            self._send(taken)
        finally:
            with self._changed:
                _give_back(self._turns, taken, slot)
                self._turns.done()
                self._changed.notify_all()
        return _answer(slot)

    def _send(self, slots: list[_Slot[Answer]]) -> None:
        if len(slots) == 1:
            try:
                _settle(slots, [self._send_one(slots[0].body)], None)
            except Exception as error:  # noqa: BLE001  (the caller's own error, raised there)
                _settle(slots, None, error)
            return
        try:
            _settle(slots, self._send_many([slot.body for slot in slots]), None)
        except Exception as error:  # noqa: BLE001  (each caller's, raised in its thread)
            if not _refused(error):
                _settle(slots, None, error)
                return
            for slot in slots:
                self._send([slot])


class AsyncGatherer(Generic[Answer]):
    """For `AsyncClient`, shared by the tasks of one event loop."""

    def __init__(
        self,
        send_one: Callable[[Body], Awaitable[Answer]],
        send_many: Callable[[list[Body]], Awaitable[list[Answer]]],
        max_in_flight: int,
    ) -> None:
        self._send_one, self._send_many = send_one, send_many
        self._turns: _Turns[Answer] = _Turns(max_in_flight)
        self._waiting: dict[int, asyncio.Future[None]] = {}

    async def submit(self, body: Body) -> Answer:
        slot: _Slot[Answer] = _Slot(body)
        if not self._turns.arrive(slot):
            woken = asyncio.get_running_loop().create_future()
            self._waiting[id(slot)] = woken
            try:
                await woken
            except BaseException:
                # Cancelled while waiting: out of the queue, and a turn it was handed goes
                # on to the next caller (else everyone behind it would wait forever).
                if slot in self._turns.pending:
                    self._turns.pending.remove(slot)
                if slot.turn:
                    self._pass_turn()
                raise
            finally:
                self._waiting.pop(id(slot), None)
            if _settled(slot):  # it went in another caller's request
                return _answer(slot)
        taken = self._turns.take(slot)
        try:
            await self._send(taken)
        finally:
            # Also when this task is cancelled mid-request: the others' jobs go back to the
            # queue for the next turn, and the turn is handed on.
            _give_back(self._turns, taken, slot)
            for other in taken:
                if _settled(other):
                    self._wake(other)
            self._pass_turn()
        return _answer(slot)

    def _pass_turn(self) -> None:
        following = self._turns.done()
        if following is not None:
            self._wake(following)

    def _wake(self, slot: _Slot[Answer]) -> None:
        woken = self._waiting.get(id(slot))
        if woken is not None and not woken.done():
            woken.set_result(None)

    async def _send(self, slots: list[_Slot[Answer]]) -> None:
        if len(slots) == 1:
            try:
                _settle(slots, [await self._send_one(slots[0].body)], None)
            except Exception as error:  # noqa: BLE001  (the caller's own error, raised there)
                _settle(slots, None, error)
            return
        try:
            _settle(slots, await self._send_many([slot.body for slot in slots]), None)
        except Exception as error:  # noqa: BLE001  (each caller's, raised in its task)
            if not _refused(error):
                _settle(slots, None, error)
                return
            for slot in slots:
                await self._send([slot])


def _give_back(turns: _Turns[Answer], taken: list[_Slot[Answer]], sender: _Slot[Answer]) -> None:
    """Put the jobs a sender took but did not settle (it stopped mid-request) back at the
    head of the queue, its own excepted."""
    unsettled = [slot for slot in taken if slot is not sender and not _settled(slot)]
    turns.pending[:0] = unsettled


def _answer(slot: _Slot[Answer]) -> Answer:
    if slot.error is not None:
        raise slot.error
    assert slot.answer is not None
    return slot.answer
