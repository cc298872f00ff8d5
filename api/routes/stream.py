"""`WS /v1/stream`: the prototype's TCP protocol as JSON messages over one socket.

The key: the `Authorization: Bearer <key>` header of the handshake. A browser, which cannot
set that header on a WebSocket, puts it in the hello instead (`"key": "<key>"`). Never in the
URL: a query string ends up in access logs, so `?key=` is not read.

First message `hello`: `{"type": "hello", "role": "worker", "worker_id", "subjects",
"credits", "held", "batch"}` or `{"type": "hello", "role": "client"}`. A worker key serves jobs; a
client key (or admin) receives the results of its own client id only.

Worker hello: `credits` (default 0) is how many jobs it can take now, `held` (default []) the
attempts it holds as `[{id, attempt, lease}]` (running, or finished with the settlement not yet
confirmed), `batch` (default false) whether it reads `assign_many`. The join makes the leader's
view match (`dispatch.api.worker_sync`): jobs the leader has on the worker that it does not hold are
requeued, and the credit is set to `credits`. The worker id belongs to the key that registered
it: another key's hello is refused (`forbidden`, close 1008). One socket serves a worker id: a
newer socket of the same key replaces the older, which is closed (1008, `replaced`) and does
not lose the worker.

A worker then sends `credit {credits}` (additive), `withdraw` (credit to 0: no more
assignments), `ack {id, attempt, lease, result}`, `fail {id, attempt, lease, error,
retryable, retry_after_s}`, `heartbeat {id, attempt, lease, progress?}` (`progress {done,
total?, message?}`: the job keeps at most one report a second), `ping` (answered `pong`) and
`acks {acks: [{id, attempt, lease, result}, ...]}` (many at once, answered by one
`settled_many {results: [{id, status} | {id, error, detail}]}`); it receives `assign {id,
exec, payload, attempt, deadline, lease}`, `settled {id, status}` and `cancel {id, attempt,
reason}`: stop that attempt (`cancel_requested`: a client cancelled the job, fail the attempt
once stopped to confirm; `time_limit`: it reached its `max_run_s`; `ended`: it is no longer
this worker's). A cancel is sent when decided, and again right after the `welcome` for an
attempt the hello's `held` names. A worker whose hello
said `batch: true` receives `assign_many {assignments: [assign without its type, ...]}`
instead: whatever was committed for it at once, in one message (one frame, one write: per
message, the node spent more time in the WebSocket send path than the leader spent
deciding). A worker stays known while its socket is open (the node heartbeats for it) and is
lost at once when the socket closes: its jobs are requeued.

A client receives `result {...job}` for each of its jobs that ends, and `progress {id,
progress}` for each progress report one of its running jobs keeps. Errors come as
`error {error, detail}`.

A session belongs to the leadership term it was opened under. When that term ends (the node
lost its lease, or the term failed), the socket is closed with 1013 ("try again later") after
`{"type": "error", "error": "not_leader" | "unavailable", "leader": <url or null>}`, naming
the leader when it is known: the SDK reconnects there and joins again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, TypeVar

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from dispatch import fast_json
from dispatch.api.deps import bearer_principal, owner_of
from dispatch.api.errors import ApiError
from dispatch.api.hub import Hub, WorkerSession
from dispatch.api.leader import Command, Leader, LeaderUnavailable
from dispatch.api.loop_commands import (
    AckJob,
    AckMany,
    ExtendAttempt,
    FailJob,
    GrantCredit,
    JobView,
    LoopCommand,
    LoseWorker,
    RejoinWorker,
    WorkerAlive,
)
from dispatch.api.node import Node
from dispatch.api.worker_sync import Held
from dispatch.auth import KeyRing, Principal, Role
from dispatch.core.bounds import MAX_JSON_DEPTH, check_json_value
from dispatch.core.errors import Rejected
from dispatch.core.progress import check_progress
from dispatch.core.retry import check_retry_after

log = logging.getLogger(__name__)

T = TypeVar("T")
router = APIRouter()

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013

TERM_CHECK_S = 1.0
"""How often a session checks that its term still serves, besides being woken when it ends."""


class _Protocol(Exception):
    pass


class _Replaced(Exception):
    """A newer socket of the same worker took over."""


def _field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _Protocol(f"{message.get('type')}.{name}: expected {getattr(kind, '__name__', kind)}")
    return value


async def _receive(socket: WebSocket) -> dict[str, Any]:
    """The next message: a JSON object in a text frame, else `_Protocol`."""
    frame = await socket.receive()
    if frame["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(frame.get("code", 1000))
    text = frame.get("text")
    if text is None:
        raise _Protocol("expected a text frame holding a JSON object")
    try:
        message = json.loads(text)
    except ValueError:
        raise _Protocol("expected a JSON object") from None
    except RecursionError:
        # json recurses per level: a frame nested ~1,000 deep must not end in a traceback.
        raise _Protocol(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(message, dict):
        raise _Protocol("expected a JSON object")
    return message


ASSIGN_MANY_MAX_BYTES = 256 * 1024
"""An `assign_many` message holds assignments up to about this size (one larger assignment
goes alone): well under the 1 MiB a WebSocket client accepts by default."""


def assign_many_messages(assignments: list[dict[str, Any]]) -> list[str]:
    """`assign_many` messages carrying `assignments` in order, each of at most
    `ASSIGN_MANY_MAX_BYTES` unless a single assignment is larger."""
    messages: list[str] = []
    chunk: list[bytes] = []
    size = 0
    for assignment in assignments:
        encoded = fast_json.dumps(assignment)
        if chunk and size + len(encoded) > ASSIGN_MANY_MAX_BYTES:
            messages.append(_assign_many(chunk))
            chunk, size = [], 0
        chunk.append(encoded)
        size += len(encoded) + 1
    if chunk:
        messages.append(_assign_many(chunk))
    return messages


def _assign_many(encoded: list[bytes]) -> str:
    return (b'{"type":"assign_many","assignments":[' + b",".join(encoded) + b"]}").decode()


class _Term:
    """The leadership term a session was opened under: its calls go to that term alone, and
    it ends when the term does (even if this node leads again in a new term)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        hub = node.hub
        assert hub is not None
        self.hub: Hub = hub
        self.ended = hub.term_ended()
        self.leader: Leader = node.leader()
        self.welcomed = False
        """Whether the session was opened (before, a refusal is the hello's answer)."""

    def check(self) -> None:
        """LeaderUnavailable unless the term still serves."""
        current = self.node.leader()  # raises when this node serves no term
        if current is not self.leader or self.ended.is_set():
            raise LeaderUnavailable(
                "the leadership term of this session ended",
                leader=self.node.election.leader_address,
            )

    async def call(self, command: LoopCommand[T]) -> T:
        """`command` on this session's term alone (LeaderUnavailable once it ended)."""
        self.check()
        future = self.leader.submit(Command(command.decide, command.answer))
        answer: T = await asyncio.wrap_future(future)
        return answer

    async def watch(self) -> LeaderUnavailable:
        """Returns (the reason) once the term no longer serves."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), TERM_CHECK_S)
            try:
                self.check()
            except LeaderUnavailable as over:
                return over


@router.websocket("/v1/stream")
async def stream(socket: WebSocket) -> None:
    node: Node = socket.app.state.node
    keyring: KeyRing = socket.app.state.keyring
    authorization = socket.headers.get("authorization")
    await socket.accept()
    term: _Term | None = None
    try:
        # With the header, a bad key is refused before anything else is read.
        principal = bearer_principal(keyring, authorization) if authorization else None
        hello = await _receive(socket)
        if hello.get("type") != "hello":
            raise _Protocol("the first message must be hello")
        if principal is None:
            key = hello.get("key")
            principal = bearer_principal(keyring, f"Bearer {key}" if isinstance(key, str) else None)
        term = _Term(node)
        role = hello.get("role")
        if role == "worker":
            await _serve_worker(socket, term, principal, hello)
        elif role == "client":
            await _serve_client(socket, term, principal)
        else:
            raise _Protocol("hello.role: expected worker or client")
    except WebSocketDisconnect:
        return
    except ApiError as error:
        await _close(socket, POLICY_VIOLATION, error.error, error.detail)
    except _Protocol as error:
        await _close(socket, POLICY_VIOLATION, "invalid", str(error))
    except Rejected as rejected:
        await _close(socket, POLICY_VIOLATION, rejected.code.value, rejected.detail)
    except _Replaced:
        await _close(socket, POLICY_VIOLATION, "replaced", "a newer connection serves this worker")
    except LeaderUnavailable as error:
        await _close_for_leader(socket, node, error, opened=term is not None and term.welcomed)


async def _close_for_leader(
    socket: WebSocket, node: Node, error: LeaderUnavailable, *, opened: bool
) -> None:
    """1013 naming the leader when known: the SDK reconnects there. (A hello refused by a
    follower answers `unavailable`, which clients read as "try the named leader".)"""
    leader = error.leader or node.election.leader_address
    elsewhere = leader is not None and leader != node.address
    code = "not_leader" if opened and elsewhere else "unavailable"
    await _close(socket, TRY_AGAIN_LATER, code, str(error), leader=leader, name_leader=True)


async def _close(
    socket: WebSocket,
    code: int,
    error: str,
    detail: str,
    *,
    leader: str | None = None,
    name_leader: bool = False,
) -> None:
    message: dict[str, Any] = {"type": "error", "error": error, "detail": detail}
    if name_leader or leader is not None:
        message["leader"] = leader
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await socket.send_json(message)
        await socket.close(code=code, reason=(f"leader {leader}" if leader else detail)[:120])


def _held(hello: dict[str, Any]) -> list[Held]:
    items = hello.get("held", [])
    if not isinstance(items, list):
        raise _Protocol("hello.held: expected a list of {id, attempt, lease}")
    held: list[Held] = []
    for item in items:
        if not isinstance(item, dict):
            raise _Protocol("hello.held: expected a list of {id, attempt, lease}")
        held.append((_field(item, "id", str), _field(item, "attempt", int),
                     _field(item, "lease", str)))  # fmt: skip
    return held


async def _serve_worker(
    socket: WebSocket, term: _Term, principal: Principal, hello: dict[str, Any]
) -> None:
    if not principal.can(Role.WORKER):
        raise ApiError(403, f"role {principal.role.value} may not serve jobs")
    worker_id = _field(hello, "worker_id", str)
    subjects = _field(hello, "subjects", list)
    credits = hello.get("credits", 0)
    if isinstance(credits, bool) or not isinstance(credits, int):
        raise _Protocol("hello.credits: expected int")
    held = _held(hello)
    batch = hello.get("batch", False)
    if not isinstance(batch, bool):
        raise _Protocol("hello.batch: expected a boolean")
    owner = owner_of(principal)
    hub = term.hub
    session = WorkerSession(worker_id, owner, batch=batch)
    # Claimed before the join commits: the older socket takes nothing meant for this one.
    previous = hub.claim_worker(session)
    try:
        epoch, must_stop = await term.call(
            RejoinWorker(hub, worker_id, subjects, held, credits, owner)
        )
    except BaseException:
        hub.unclaim_worker(session, previous)
        raise
    if previous is not None:
        previous.replaced.set()
    try:
        await socket.send_json({"type": "welcome", "node": term.node.address, "epoch": epoch})
        term.welcomed = True
        # What the worker holds and must stop (cancelled, or ended while it was away).
        for order in must_stop:
            await socket.send_text(fast_json.dumps_text({"type": "cancel", **order}))
        await _worker_session(socket, term, session, owner)
    finally:
        if hub.release_worker(session):
            with contextlib.suppress(Rejected, LeaderUnavailable):
                await term.call(LoseWorker(worker_id, "socket closed"))


async def _worker_session(
    socket: WebSocket, term: _Term, session: WorkerSession, owner: str | None
) -> None:
    await _WorkerLoop(socket, term, session, owner).run()


class _WorkerLoop:
    """An open worker session: pushes its assignments, answers its messages, heartbeats for
    it, and ends with the socket, with its term, or when a newer socket replaces it."""

    def __init__(
        self, socket: WebSocket, term: _Term, session: WorkerSession, owner: str | None
    ) -> None:
        self.socket = socket
        self.term = term
        self.session = session
        self.owner = owner
        self.worker_id = session.worker_id
        self.over: asyncio.Future[LeaderUnavailable] = asyncio.get_running_loop().create_future()
        self.handlers: set[asyncio.Task[None]] = set()

    def term_over(self, error: LeaderUnavailable) -> None:
        if not self.over.done():
            self.over.set_result(error)

    async def run(self) -> None:
        reader = asyncio.create_task(self.read())
        replaced = asyncio.create_task(self.session.replaced.wait())
        tasks = [
            reader,
            replaced,
            asyncio.create_task(self.watch()),
            asyncio.create_task(self.push_assignments()),
            asyncio.create_task(self.keep_alive()),
        ]
        try:
            waits: set[asyncio.Future[Any]] = {reader, replaced, self.over}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # WebSocketDisconnect: the worker went away
            if self.session.replaced.is_set():
                raise _Replaced
            raise self.over.result()
        finally:
            for task in (*tasks, *self.handlers):
                task.cancel()
            await asyncio.gather(*tasks, *self.handlers, return_exceptions=True)

    async def watch(self) -> None:
        self.term_over(await self.term.watch())

    async def read(self) -> None:
        while True:
            try:
                message = await _receive(self.socket)
            except _Protocol as error:
                await self.socket.send_json(
                    {"type": "error", "error": "invalid", "detail": str(error)}
                )
                continue
            # Not awaited one by one: many acks in flight share one leader commit, where
            # awaiting each would cost a whole Kafka transaction per ack.
            task = asyncio.create_task(self.handle(message))
            self.handlers.add(task)
            task.add_done_callback(self.handlers.discard)

    async def push_assignments(self) -> None:
        hub = self.term.hub
        outbox = hub.outbox(self.worker_id)
        while True:
            await outbox.changed.wait()
            if outbox.stops and hub.worker_session(self.worker_id) is self.session:
                for order in outbox.take_stops():
                    await self.socket.send_text(fast_json.dumps_text({"type": "cancel", **order}))
            taken = hub.take(self.worker_id, session=self.session)
            if self.session.batch:
                for message in assign_many_messages(taken):
                    await self.socket.send_text(message)
            else:
                for assignment in taken:
                    single = {"type": "assign", **assignment}
                    await self.socket.send_text(fast_json.dumps_text(single))
            if not outbox.items:
                outbox.changed.clear()

    async def handle(self, message: dict[str, Any]) -> None:
        socket = self.socket
        try:
            await _worker_message(socket, self.term, self.worker_id, self.owner, message)
        except Rejected as rejected:
            error = {"type": "error", "error": rejected.code.value, "detail": rejected.detail}
            await socket.send_json({**error, "id": message.get("id")})
        except _Protocol as error:
            await socket.send_json(
                {"type": "error", "error": "invalid", "detail": str(error), "id": message.get("id")}
            )
        except LeaderUnavailable as error:
            # Not swallowed: the term is over, so is this session.
            self.term_over(error)
        except (WebSocketDisconnect, RuntimeError):
            # The socket is gone; the reader notices and cleans up.
            log.debug("worker %s: message not answered", self.worker_id, exc_info=True)

    async def keep_alive(self) -> None:
        # An open socket is a live worker: its loss is the socket closing, not silence. So
        # the node heartbeats for it, well inside the expiry that applies to REST pollers.
        interval = self.term.node.settings.dispatcher.worker_expiry_s / 3
        worker_id = self.worker_id
        while True:
            await asyncio.sleep(interval)
            try:
                await self.term.call(WorkerAlive(worker_id))
            except LeaderUnavailable as error:
                self.term_over(error)
            except Rejected:
                # Forgotten meanwhile: the worker joins again with a new hello.
                self.term_over(LeaderUnavailable("the leader forgot this worker: join again"))


async def _worker_message(
    socket: WebSocket, term: _Term, worker_id: str, owner: str | None, message: dict[str, Any]
) -> None:
    kind = message.get("type")
    if kind == "credit":
        credits = _field(message, "credits", int)
        await term.call(GrantCredit(worker_id, credits))
        return
    if kind == "withdraw":
        await term.call(GrantCredit(worker_id, 0, replace=True))
        await socket.send_json({"type": "withdrawn"})
        return
    if kind == "ping":
        await term.call(WorkerAlive(worker_id))
        await socket.send_json({"type": "pong"})
        return
    if kind == "acks":
        await _acks(socket, term, worker_id, owner, _field(message, "acks", list))
        return
    if kind not in ("ack", "fail", "heartbeat"):
        raise _Protocol(f"type: unknown message type {str(kind)[:64]!r}")
    job_id = _field(message, "id", str)
    attempt = _field(message, "attempt", int)
    lease = _field(message, "lease", str)
    result = message.get("result")
    error = message.get("error", "")
    try:
        check_json_value(result, label=f"{kind}.result")
        check_json_value(error, label=f"{kind}.error")
    except ValueError as problem:
        raise _Protocol(str(problem)) from None

    command: LoopCommand[JobView | None]
    if kind == "ack":
        command = AckJob(job_id, attempt, lease, result, worker_id, owner)
    elif kind == "fail":
        retryable = bool(message.get("retryable", True))
        try:
            retry_after_s = check_retry_after(message.get("retry_after_s"), "fail.retry_after_s")
        except ValueError as problem:
            raise _Protocol(str(problem)) from None
        command = FailJob(
            job_id, attempt, lease, str(error), retryable, worker_id, owner, retry_after_s
        )
    else:
        progress = message.get("progress")
        if progress is not None:
            try:
                progress = check_progress(progress, "heartbeat.progress")
            except ValueError as problem:
                raise _Protocol(str(problem)) from None
        command = ExtendAttempt(job_id, attempt, lease, worker_id, owner, progress)
    view = await term.call(command)
    status = None if view is None else view["status"]
    await socket.send_text(
        fast_json.dumps_text({"type": "settled", "id": job_id, "status": status, "of": kind})
    )


async def _acks(
    socket: WebSocket, term: _Term, worker_id: str, owner: str | None, items: list[Any]
) -> None:
    """`acks {acks: [{id, attempt, lease, result}]}`: many successes in one command."""
    acks = []
    for item in items:
        if not isinstance(item, dict):
            raise _Protocol("acks: expected a list of objects")
        result = item.get("result")
        try:
            check_json_value(result, label="acks.result")
        except ValueError as problem:
            raise _Protocol(str(problem)) from None
        acks.append(
            (_field(item, "id", str), _field(item, "attempt", int), _field(item, "lease", str),
             result)
        )  # fmt: skip
    outcomes = await term.call(AckMany([(worker_id, item) for item in acks], owner))
    results = [outcome.to_dict() for outcome in outcomes]
    await socket.send_text(fast_json.dumps_text({"type": "settled_many", "results": results}))


async def _serve_client(socket: WebSocket, term: _Term, principal: Principal) -> None:
    # Results name their client's jobs: only a client key (its own client id) or an admin
    # may listen, never a worker key.
    if not principal.can(Role.CLIENT):
        raise ApiError(403, f"role {principal.role.value} may not receive results")
    hub = term.hub
    results = hub.subscribe(principal.client_id)
    await socket.send_json({"type": "welcome", "node": term.node.address})
    term.welcomed = True

    async def drain_socket() -> None:
        # A client sends nothing; reading is how a closed socket is noticed.
        while True:
            await socket.receive_text()

    reader = asyncio.create_task(drain_socket())
    watcher = asyncio.create_task(term.watch())
    try:
        while True:
            getter = asyncio.create_task(results.get())
            done, _ = await asyncio.wait(
                {getter, reader, watcher}, return_when=asyncio.FIRST_COMPLETED
            )
            if getter not in done:
                getter.cancel()
                if watcher in done:
                    raise watcher.result()
                reader.result()
                return
            await socket.send_json(getter.result())
    finally:
        reader.cancel()
        watcher.cancel()
        hub.unsubscribe(principal.client_id, results)
