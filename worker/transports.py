"""How a worker talks to the leader: a WebSocket (`WS /v1/stream`, pushed assignments, the
default) or REST long-poll (`POST /v1/workers/{id}/poll`, then ack/fail/heartbeat calls).

Both carry out the same duties for the runtime in `dispatch.worker.sdk`: deliver assignments to
`runtime.accept`, keep the runtime's credit with the leader equal to its free slots, keep the
worker alive in the leader's eyes, settle attempts, send job heartbeats, pass on the leader's
orders to stop an attempt (`runtime.stop_attempt`: a WebSocket `cancel` message, a poll's
`cancel` list, a heartbeat answered with `cancel` or refused), and come back after
the node goes away (the node list and the leader a follower names come from `AsyncClient`).

Liveness: the leader forgets a worker it has not heard from for `dispatcher.worker_expiry_s`
(15 s by default). A REST worker polls at least every `keepalive_s`: the poll counts as its
heartbeat, rejoins a worker that was forgotten, and *replaces* the leader's credit for it with
the free slots. A WebSocket worker is kept known by its open socket (the node heartbeats for
it), and never polls over REST (the node refuses a poll for a worker served by a socket): its
credit is set by each hello and added to on the socket (see `WebSocketTransport`). Only a
message from the server counts as "heard": writes to a socket whose node stalled go nowhere.

No node reachable: a worker keeps trying for as long as it runs (it may start before the
stack), and says so at once, then every `OUTAGE_REMINDER_S` (`_Outage`); a connection attempt
fails fast when every node refuses it, so the first line comes at once, not after the client's
retry budget. Closing ends a connection attempt, a pause or an idle long-poll at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from dispatch import fast_json
from dispatch.client import (
    AsyncClient,
    Backoff,
    Conflict,
    DispatchError,
    NotFound,
    Unavailable,
    error_from_body,
)
from dispatch.worker.jobs import Assignment, Outcome

log = logging.getLogger("dispatch.worker")

SETTLEMENT_REFUSALS = frozenset({"stale_lease", "already_settled", "not_found", "invalid"})
"""Error codes that refuse an ack or fail for good: resending it cannot help."""
OUTAGE_REMINDER_S = 30.0
"""While no node answers, how often a worker says again that it is still trying."""
WITHDRAWN_POLL_WAIT_S = 1.0
"""How long a closing REST worker lets its last long-poll run once its credit was withdrawn:
the leader assigns nothing more, and what it assigned before wakes the poll at once."""
NOT_RUNNING_HINT = (
    "is the stack running? `dispatch up --detach` starts a local one; "
    "DISPATCH_URL (or --url) names other nodes"
)
T = TypeVar("T")


class Runtime(Protocol):
    """What a transport needs from the worker runtime."""

    worker_id: str
    subjects: list[str]
    keepalive_s: float

    @property
    def free_slots(self) -> int:
        """How many more jobs the worker can take now (0 while stopping)."""
        ...

    @property
    def stopping(self) -> bool: ...

    def accept(self, message: Mapping[str, Any]) -> None:
        """An assignment arrived: run it (or release it)."""
        ...

    def refused(self, job_id: str, code: str, attempt: int | None = None) -> None:
        """The leader refused a heartbeat or settlement of `job_id` (of `attempt`; None: the
        refusal did not say): it is no longer ours."""
        ...

    def stop_attempt(self, job_id: str, attempt: int | None, reason: str) -> None:
        """The leader says stop this attempt (`cancel_requested`, `time_limit`, `ended`)."""
        ...

    def held(self) -> list[Assignment]:
        """The attempts running now."""
        ...


class Transport(Protocol):
    async def run(self) -> None:
        """Take assignments until `close()`; raises only errors that retrying cannot fix
        (`Unauthorized`, `Forbidden`, `Invalid`)."""
        ...

    async def stop_taking(self) -> None:
        """Ask the leader for no more assignments (what is already on its way still comes)."""
        ...

    async def settle(self, held: Assignment, outcome: Outcome) -> None: ...

    async def heartbeat(
        self, held: Assignment, progress: Mapping[str, Any] | None = None
    ) -> float | None:
        """Extend the job's deadline, with a progress report (`{done, total, message}`) when
        given; the new deadline when the leader says it."""
        ...

    async def slot_freed(self) -> None:
        """A job ended: grant its credit again (unless stopping). Await it right after the
        runtime freed the slot: both must happen in one step of the event loop."""
        ...

    async def close(self, drain_s: float) -> None:
        """Deliver what is still unconfirmed (for up to `drain_s`), then disconnect."""
        ...


def _settlement(held: Assignment, outcome: Outcome) -> dict[str, Any]:
    message: dict[str, Any] = {
        "type": outcome.kind,
        "id": held.id,
        "attempt": held.attempt,
        "lease": held.lease,
    }
    if outcome.kind == "ack":
        message["result"] = outcome.result
    else:
        message["error"] = outcome.error
        message["retryable"] = outcome.retryable
        if outcome.retry_after_s is not None:
            message["retry_after_s"] = outcome.retry_after_s
    return message


def _stop(runtime: Runtime, message: Mapping[str, Any]) -> None:
    """A WebSocket `cancel` message or an entry of a poll's `cancel`: `{"id", "attempt",
    "reason"}`."""
    job_id, attempt, reason = message.get("id"), message.get("attempt"), message.get("reason")
    if not isinstance(job_id, str):
        log.error("worker %s: malformed cancel %r", runtime.worker_id, message)
        return
    runtime.stop_attempt(
        job_id,
        attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        reason if isinstance(reason, str) and reason else "cancel_requested",
    )


class _Outage:
    """Says that no node answers: at the first failure, then every `OUTAGE_REMINDER_S`
    while it lasts, and once when a node answers again (a worker retrying in silence looks
    hung; one line per retry buries everything else)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.since: float | None = None
        self.said_at = 0.0
        self.failures = 0

    def failed(self, error: DispatchError, retry_in_s: float) -> None:
        now = time.monotonic()
        self.failures += 1
        if self.since is None:
            self.since = now
        elif now - self.said_at < OUTAGE_REMINDER_S:
            log.debug("worker %s: still no node (%s)", self.worker_id, error.detail)
            return
        self.said_at = now
        if self.failures == 1:
            log.warning("worker %s: cannot reach a node: %s; %s; retrying until one answers",
                        self.worker_id, error.detail, NOT_RUNNING_HINT)  # fmt: skip
        else:
            log.warning("worker %s: still no node after %.0f s and %d tries (%s); retrying "
                        "in %.1f s", self.worker_id, now - self.since, self.failures,
                        error.detail, retry_in_s)  # fmt: skip

    def recovered(self, node: object) -> None:
        if self.since is not None:
            log.info("worker %s: reached %s after %.0f s without a node", self.worker_id, node,
                     time.monotonic() - self.since)  # fmt: skip
        self.since, self.failures = None, 0


async def _unless(
    event: asyncio.Event, work: Awaitable[T], *, grace_s: Callable[[], float] | None = None
) -> asyncio.Future[T] | None:
    """`work`, ended (its `result()` is its value or raises its error), or None when `event`
    was set first (`work` then got `grace_s()` more, asked when the event came, before it
    was cancelled)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and grace_s is not None:
            await asyncio.wait({task}, timeout=grace_s())
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return task
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


class _KeepAlive:
    """The REST poll both transports use to stay known to the leader (see the module doc)."""

    def __init__(self, client: AsyncClient, runtime: Runtime) -> None:
        self.client = client
        self.runtime = runtime
        self.last_heard = time.monotonic()
        self.epoch: int | None = None
        """The leader epoch of the last poll's answer (None before the first)."""

    def heard(self) -> None:
        """Something reached the leader on the worker's behalf just now."""
        self.last_heard = time.monotonic()

    @property
    def due_in_s(self) -> float:
        return self.last_heard + self.runtime.keepalive_s - time.monotonic()

    async def poll(self, credits: int, wait_s: float = 0.0, *, fail_fast: bool = False) -> None:
        runtime = self.runtime
        # Every poll says what the worker holds (running or settling) and the epoch of the
        # last answer: the first poll a new leader gets (a failover, or this worker's start)
        # requeues at once an assignment lost with the previous leader's answer, as a
        # socket's hello does; the other polls only carry it.
        held = [(job.id, job.attempt, job.lease) for job in runtime.held()]
        polled = await self.client.poll_term(
            runtime.worker_id, runtime.subjects, credits, wait_s,
            held=held, epoch=self.epoch, fail_fast=fail_fast,
        )  # fmt: skip
        self.heard()
        if polled.epoch is not None:
            self.epoch = polled.epoch
        for assignment in polled.assignments:
            runtime.accept(assignment)
        for stop in polled.cancel:
            _stop(runtime, stop)


class WebSocketTransport:
    """Assignments pushed over `WS /v1/stream`; credits, acks, failures and heartbeats
    sent on it. Acks and failures are kept until the leader confirms them (`settled`) and
    sent again on the next connection, which is safe: a settlement is keyed by attempt and
    lease, and a repeat answers the first outcome.

    Credit stays exact across connections: each hello says what the worker holds (running
    attempts and unconfirmed settlements) and its free slots, and the leader requeues what
    it has on the worker beyond that and sets its credit to those slots; on the socket, each
    freed slot adds one. Slots freed while no socket is open are granted once the next one
    is. The socket keeps the worker known (the node heartbeats for it); the worker pings
    when it has heard nothing for `keepalive_s` and reconnects when a ping goes unanswered,
    so a stalled or deposed node does not keep it. A close naming the leader (1013 after a
    term ended) moves it there, if that is one of the configured nodes."""

    def __init__(self, client: AsyncClient, runtime: Runtime, backoff: Backoff) -> None:
        self.client = client
        self.runtime = runtime
        self.backoff = backoff
        self.alive = _KeepAlive(client, runtime)
        self._socket: ClientConnection | None = None
        self._unconfirmed: dict[str, dict[str, Any]] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self._closing = False
        self._closed = asyncio.Event()  # set with _closing: ends a connection attempt at once
        self._outage = _Outage(runtime.worker_id)
        self._leader_hint: str | None = None
        self._freed_unsent = 0  # slots freed after the hello's count, granted once open
        self._background: set[asyncio.Task[None]] = set()

    def hello(self) -> dict[str, Any]:
        runtime = self.runtime
        held = [
            {"id": job.id, "attempt": job.attempt, "lease": job.lease} for job in runtime.held()
        ]
        held += [
            {"id": m["id"], "attempt": m["attempt"], "lease": m["lease"]}
            for m in self._unconfirmed.values()
        ]
        return {
            "type": "hello",
            "role": "worker",
            "worker_id": runtime.worker_id,
            "subjects": runtime.subjects,
            "credits": runtime.free_slots,
            "held": held,
            # Assignments committed together come as one `assign_many` message.
            "batch": True,
        }

    async def run(self) -> None:
        failures = 0
        while not self._closing:
            self._freed_unsent = 0
            try:
                # Fail fast when every node refuses: this loop retries for as long as the
                # worker runs, and says so at once (see _Outage).
                opening = await _unless(
                    self._closed, self.client.open_stream(self.hello(), fail_fast=True)
                )
                if opening is None:  # closed while connecting
                    return
                socket, welcome = opening.result()
            except Unavailable as error:
                delay = self.backoff.delay(failures)
                failures += 1
                self._outage.failed(error, delay)
                await _unless(self._closed, asyncio.sleep(delay))
                continue
            failures = 0
            self._outage.recovered(welcome.get("node"))
            log.info("worker %s: connected to %s", self.runtime.worker_id, welcome.get("node"))
            await self._serve(socket)

    async def _serve(self, socket: ClientConnection) -> None:
        self._socket = socket
        self.alive.heard()
        keeper = asyncio.create_task(self._keep_alive(socket))
        try:
            owed, self._freed_unsent = self._freed_unsent, 0
            if owed > 0 and not self.runtime.stopping:
                await self._send({"type": "credit", "credits": owed})
            for message in list(self._unconfirmed.values()):
                await self._send(message)
            async for raw in socket:
                self.alive.heard()  # only what the server says counts as heard
                self._on_message(orjson.loads(raw))
        except ConnectionClosed as closed:
            log.info("worker %s: connection closed (%s)", self.runtime.worker_id, closed)
        except ValueError as error:
            log.error("worker %s: unreadable message from the leader: %s",
                      self.runtime.worker_id, error)  # fmt: skip
        finally:
            self._socket = None
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await socket.close()
        if self._closing:
            return
        # The node went away or stepped down: prefer the leader it named (one of the
        # configured nodes), else the next node.
        hint, self._leader_hint = self._leader_hint, None
        router = self.client.router
        if hint and hint.rstrip("/") in router.urls:
            router.redirect(hint)
        else:
            router.failed(router.current)

    def _on_message(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "assign":
            self.runtime.accept(message)
        elif kind == "assign_many":
            for assignment in message.get("assignments") or []:
                if isinstance(assignment, dict):
                    self.runtime.accept(assignment)
        elif kind == "cancel":
            _stop(self.runtime, message)
        elif kind == "settled":
            if message.get("of") in ("ack", "fail"):
                self._confirmed(str(message.get("id")))
        elif kind == "error":
            self._on_error(message)

    def _on_error(self, message: dict[str, Any]) -> None:
        code = str(message.get("error"))
        job_id = message.get("id")
        if isinstance(message.get("leader"), str):
            self._leader_hint = message["leader"]
        if isinstance(job_id, str):
            log.warning("worker %s: job %s refused: %s (%s)", self.runtime.worker_id, job_id,
                        code, message.get("detail"))  # fmt: skip
            if code in SETTLEMENT_REFUSALS:
                # A refused settlement is of an attempt that ended here (not running any
                # more, and maybe followed by a newer attempt of the job on this worker,
                # which must run on); otherwise a refused heartbeat of a running one.
                settling = job_id in self._unconfirmed
                self._confirmed(job_id)
                if not settling:
                    self.runtime.refused(job_id, code)
        else:
            log.warning("worker %s: %s", self.runtime.worker_id, error_from_body(None, message))

    def _confirmed(self, job_id: str) -> None:
        self._unconfirmed.pop(job_id, None)
        if not self._unconfirmed:
            self._drained.set()

    async def _send(self, message: dict[str, Any]) -> bool:
        socket = self._socket  # read before any await: see slot_freed
        if socket is None:
            return False
        try:
            await socket.send(fast_json.dumps_text(message))
        except ConnectionClosed:
            return False
        return True

    async def _keep_alive(self, socket: ClientConnection) -> None:
        """Ping after `keepalive_s` of silence from the server; give up on a server silent
        for twice that (a stalled node), so that the worker moves on."""
        while True:
            await asyncio.sleep(max(0.05, self.alive.due_in_s))
            silent_s = self.runtime.keepalive_s - self.alive.due_in_s
            if silent_s >= 2 * self.runtime.keepalive_s:
                log.warning("worker %s: the node has been silent for %.1f s; reconnecting",
                            self.runtime.worker_id, silent_s)  # fmt: skip
                await socket.close()
                return
            if self.alive.due_in_s <= 0:
                await self._send({"type": "ping"})
                await asyncio.sleep(self.runtime.keepalive_s / 2)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop_taking(self) -> None:
        # What is on its way still comes (and is released while stopping).
        await self._send({"type": "withdraw"})

    async def settle(self, held: Assignment, outcome: Outcome) -> None:
        message = _settlement(held, outcome)
        self._unconfirmed[held.id] = message
        self._drained.clear()
        await self._send(message)

    async def heartbeat(
        self, held: Assignment, progress: Mapping[str, Any] | None = None
    ) -> float | None:
        message: dict[str, Any] = {
            "type": "heartbeat", "id": held.id, "attempt": held.attempt, "lease": held.lease,
        }  # fmt: skip
        if progress is not None:
            message["progress"] = dict(progress)
        await self._send(message)
        return None

    async def slot_freed(self) -> None:
        if self.runtime.stopping:
            return
        if not await self._send({"type": "credit", "credits": 1}):
            # No socket: the next hello counts this slot if it is built after now; if it
            # is already on its way, the slot is granted once that socket is open.
            self._freed_unsent += 1

    async def close(self, drain_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), drain_s)
        if self._unconfirmed:
            log.warning("worker %s: %d settlement(s) unconfirmed at exit",
                        self.runtime.worker_id, len(self._unconfirmed))  # fmt: skip
        self._closing = True
        self._closed.set()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        socket = self._socket
        if socket is not None:
            await socket.close()


class RestTransport:
    """REST long-poll: poll with the free slots as credit (the leader *replaces* the
    worker's credit with it), then one call per ack, failure or heartbeat, each retried on
    other nodes by the client (they are idempotent: keyed by attempt and lease)."""

    def __init__(self, client: AsyncClient, runtime: Runtime, backoff: Backoff) -> None:
        self.client = client
        self.runtime = runtime
        self.backoff = backoff
        self.alive = _KeepAlive(client, runtime)
        self._slot_freed = asyncio.Event()
        self._closing = asyncio.Event()
        self._withdrawn = False
        self._outage = _Outage(runtime.worker_id)

    async def run(self) -> None:
        failures = 0
        runtime = self.runtime
        # Polls go on while stopping (with no credit): jobs finishing in the grace period
        # need their worker to stay known, or the leader would requeue them under it.
        while not self._closing.is_set():
            credits = runtime.free_slots
            # With no room, a poll cannot wait (the server answers at once): it only keeps
            # the worker alive, so wait for a free slot or the next keep-alive instead.
            wait_s = runtime.keepalive_s if credits > 0 else 0.0
            self._slot_freed.clear()
            try:
                polled = await _unless(
                    self._closing,
                    self.alive.poll(credits, wait_s, fail_fast=True),
                    grace_s=functools.partial(self._closing_poll_wait_s, wait_s),
                )
                if polled is None:  # closed meanwhile
                    return
                polled.result()
            except Unavailable as error:
                delay = self.backoff.delay(failures)
                failures += 1
                self._outage.failed(error, delay)
                await self._pause(delay)
                continue
            failures = 0
            self._outage.recovered(self.client.router.current)
            if runtime.free_slots == 0:
                await self._pause(max(0.0, self.alive.due_in_s), wake_on_slot=True)

    def _closing_poll_wait_s(self, wait_s: float) -> float:
        # A long-poll out when the worker closes may still bring assignments (released at
        # once while stopping): once the credit was withdrawn the leader assigns nothing
        # more, and what it assigned before wakes the poll at once, so a short wait is
        # enough; otherwise the poll runs its course.
        return WITHDRAWN_POLL_WAIT_S if self._withdrawn else wait_s + 5.0

    async def _pause(self, seconds: float, *, wake_on_slot: bool = False) -> None:
        waits = [asyncio.create_task(self._closing.wait())]
        if wake_on_slot:
            waits.append(asyncio.create_task(self._slot_freed.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def stop_taking(self) -> None:
        try:
            await self.alive.poll(0)
            self._withdrawn = True
        except DispatchError as error:
            log.warning("worker %s: could not withdraw credit: %s", self.runtime.worker_id, error)

    async def settle(self, held: Assignment, outcome: Outcome) -> None:
        worker_id = self.runtime.worker_id
        try:
            if outcome.kind == "ack":
                await self.client.ack(held.id, held.attempt, held.lease, outcome.result, worker_id)
            else:
                await self.client.fail(
                    held.id, held.attempt, held.lease, outcome.error,
                    retryable=outcome.retryable, worker_id=worker_id,
                    retry_after_s=outcome.retry_after_s,
                )  # fmt: skip
        except (Conflict, NotFound) as refused:
            log.warning("worker %s: job %s refused: %s", worker_id, held.id, refused)
            self.runtime.refused(held.id, refused.error, held.attempt)
            return
        self.alive.heard()

    async def heartbeat(
        self, held: Assignment, progress: Mapping[str, Any] | None = None
    ) -> float | None:
        # A refusal (Conflict, NotFound) reaches the runtime, which stops the attempt.
        beat = await self.client.heartbeat_answer(
            held.id, held.attempt, held.lease, self.runtime.worker_id, progress=progress
        )
        self.alive.heard()
        if beat.cancel is not None:
            self.runtime.stop_attempt(held.id, held.attempt, beat.cancel)
        return beat.deadline

    async def slot_freed(self) -> None:
        self._slot_freed.set()

    async def close(self, drain_s: float) -> None:
        # Settlements are awaited calls: by now they are done or have failed for good.
        self._closing.set()
