"""`WS /v1/stream`: the prototype's TCP protocol as JSON messages over one socket.

First message `hello`: `{"type": "hello", "role": "worker", "worker_id", "subjects"}` or
`{"type": "hello", "role": "client"}`.

A worker then sends `credit {credits}` (additive), `ack {id, attempt, lease, result}`,
`fail {id, attempt, lease, error, retryable}`, `heartbeat {id, attempt, lease}`, `ping`
(answered `pong`) and `acks {acks: [{id, attempt, lease, result}, ...]}` (many at once,
answered by one `settled_many {results: [{id, status} | {id, error, detail}]}`); it receives
`assign {id, exec, payload, attempt, deadline, lease}` and `settled {id, status}`. A worker
stays known while its socket is open (the node heartbeats for it) and is lost at once when
the socket closes: its jobs are requeued.

A client receives `result {...job}` for each of its jobs that ends. Errors come as
`error {error, detail}`. The key: `Authorization: Bearer` or `?key=` (browsers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from api.auth import KeyRing, Principal, Role
from api.deps import bearer_principal
from api.errors import ApiError
from api.leader import LeaderUnavailable
from api.node import Node
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import Rejected
from dispatch.core.events import Event

log = logging.getLogger(__name__)
router = APIRouter()

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013


def _job_status(core: Dispatcher, job_id: str) -> str | None:
    job = core.job_view(job_id)
    return job.status.value if job else None


class _Protocol(Exception):
    pass


def _field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _Protocol(f"{message.get('type')}.{name}: expected {getattr(kind, '__name__', kind)}")
    return value


@router.websocket("/v1/stream")
async def stream(socket: WebSocket) -> None:
    node: Node = socket.app.state.node
    keyring: KeyRing = socket.app.state.keyring
    authorization = socket.headers.get("authorization")
    if authorization is None and "key" in socket.query_params:
        authorization = f"Bearer {socket.query_params['key']}"
    await socket.accept()
    try:
        principal = bearer_principal(keyring, authorization)
        hello = await socket.receive_json()
        if not isinstance(hello, dict) or hello.get("type") != "hello":
            raise _Protocol("the first message must be hello")
        node.leader()
        if hello.get("role") == "worker":
            await _serve_worker(socket, node, principal, hello)
        elif hello.get("role") == "client":
            await _serve_client(socket, node, principal)
        else:
            raise _Protocol("hello.role: expected worker or client")
    except WebSocketDisconnect:
        return
    except ApiError as error:
        await _close(socket, POLICY_VIOLATION, error.error, error.detail)
    except _Protocol as error:
        await _close(socket, POLICY_VIOLATION, "invalid", str(error))
    except LeaderUnavailable as error:
        # A follower names the leader: the worker SDK reconnects there.
        await _close(socket, TRY_AGAIN_LATER, "unavailable", str(error), leader=error.leader)


async def _close(
    socket: WebSocket, code: int, error: str, detail: str, *, leader: str | None = None
) -> None:
    message = {"type": "error", "error": error, "detail": detail}
    if leader is not None:
        message["leader"] = leader
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await socket.send_json(message)
        await socket.close(code=code, reason=(f"leader {leader}" if leader else detail)[:120])


async def _serve_worker(
    socket: WebSocket, node: Node, principal: Principal, hello: dict[str, Any]
) -> None:
    if not principal.can(Role.WORKER):
        raise ApiError(403, f"role {principal.role.value} may not serve jobs")
    worker_id = _field(hello, "worker_id", str)
    subjects = _field(hello, "subjects", list)
    hub = node.hub
    assert hub is not None
    await node.call(lambda core, now: core.join(worker_id, subjects, now))
    outbox = hub.outbox(worker_id)
    await socket.send_json(
        {"type": "welcome", "node": node.address, "epoch": node.leader().core.epoch}
    )

    async def push_assignments() -> None:
        while True:
            await outbox.changed.wait()
            for assignment in hub.take(worker_id):
                await socket.send_json({"type": "assign", **assignment})
            if not outbox.items:
                outbox.changed.clear()

    async def handle(message: Any) -> None:
        try:
            await _worker_message(socket, node, worker_id, message)
        except Rejected as rejected:
            job_id = message.get("id") if isinstance(message, dict) else None
            error = {"type": "error", "error": rejected.code.value, "detail": rejected.detail}
            await socket.send_json({**error, "id": job_id})
        except _Protocol as error:
            await socket.send_json({"type": "error", "error": "invalid", "detail": str(error)})
        except (LeaderUnavailable, WebSocketDisconnect, RuntimeError):
            # The socket or the leader is gone; the reader below notices and cleans up.
            log.debug("worker %s: message not settled", worker_id, exc_info=True)

    async def keep_alive() -> None:
        # An open socket is a live worker: its loss is the socket closing, not silence. So
        # the node heartbeats for it, well inside the expiry that applies to REST pollers.
        interval = node.settings.dispatcher.worker_expiry_s / 3
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Rejected, LeaderUnavailable):
                await node.call(lambda core, now: core.worker_heartbeat(worker_id, now))

    pusher = asyncio.create_task(push_assignments())
    keeper = asyncio.create_task(keep_alive())
    handlers: set[asyncio.Task[None]] = set()
    try:
        while True:
            message = await socket.receive_json()
            # Not awaited one by one: many acks in flight share one leader commit, where
            # awaiting each would cost a whole Kafka transaction per ack.
            task = asyncio.create_task(handle(message))
            handlers.add(task)
            task.add_done_callback(handlers.discard)
    finally:
        pusher.cancel()
        keeper.cancel()
        for task in handlers:
            task.cancel()
        with contextlib.suppress(Rejected, LeaderUnavailable):
            await node.call(
                lambda core, now: core.lose_worker(worker_id, now, reason="socket closed")
            )


async def _worker_message(socket: WebSocket, node: Node, worker_id: str, message: Any) -> None:
    if not isinstance(message, dict):
        raise _Protocol("expected a JSON object")
    kind = message.get("type")
    if kind == "credit":
        credits = _field(message, "credits", int)
        await node.call(lambda core, now: core.grant_credit(worker_id, credits, now))
        return
    if kind == "ping":
        await node.call(lambda core, now: core.worker_heartbeat(worker_id, now))
        await socket.send_json({"type": "pong"})
        return
    if kind == "acks":
        await _acks(socket, node, worker_id, _field(message, "acks", list))
        return
    job_id = _field(message, "id", str)
    attempt = _field(message, "attempt", int)
    lease = _field(message, "lease", str)

    def decide(core: Dispatcher, now: float) -> list[Event]:
        if kind == "ack":
            return core.ack(
                job_id, attempt, lease, now, result=message.get("result"), worker_id=worker_id
            )
        if kind == "fail":
            return core.fail(
                job_id, attempt, lease, now, error=str(message.get("error", "")),
                retryable=bool(message.get("retryable", True)), worker_id=worker_id,
            )  # fmt: skip
        return core.heartbeat(job_id, attempt, lease, now, worker_id=worker_id)

    if kind not in ("ack", "fail", "heartbeat"):
        raise _Protocol(f"type: unknown message type {kind!r}")
    status = await node.call(decide, lambda core, _events: _job_status(core, job_id))
    await socket.send_json({"type": "settled", "id": job_id, "status": status, "of": kind})


async def _acks(socket: WebSocket, node: Node, worker_id: str, items: list[Any]) -> None:
    """`acks {acks: [{id, attempt, lease, result}]}`: many successes in one command."""
    acks = []
    for item in items:
        if not isinstance(item, dict):
            raise _Protocol("acks: expected a list of objects")
        acks.append(
            (_field(item, "id", str), _field(item, "attempt", int), _field(item, "lease", str),
             item.get("result"))
        )  # fmt: skip
    refused: dict[str, Rejected] = {}

    def decide(core: Dispatcher, now: float) -> list[Event]:
        events, rejections = core.ack_many(acks, now, worker_id=worker_id)
        refused.update({rejection.job_id or "": rejection for rejection in rejections})
        return events

    def answer(core: Dispatcher, _events: list[Event]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        for job_id, _attempt, _lease, _result in acks:
            rejection = refused.get(job_id)
            if rejection is None:
                results.append({"id": job_id, "status": _job_status(core, job_id)})
            else:
                results.append(
                    {"id": job_id, "error": rejection.code.value, "detail": rejection.detail}
                )
        return results

    results = await node.call(decide, answer)
    await socket.send_json({"type": "settled_many", "results": results})


async def _serve_client(socket: WebSocket, node: Node, principal: Principal) -> None:
    hub = node.hub
    assert hub is not None
    results = hub.subscribe(principal.client_id)
    await socket.send_json({"type": "welcome", "node": node.address})

    async def drain_socket() -> None:
        # A client sends nothing; reading is how a closed socket is noticed.
        while True:
            await socket.receive_text()

    reader = asyncio.create_task(drain_socket())
    try:
        while True:
            getter = asyncio.create_task(results.get())
            done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                getter.cancel()
                reader.result()
                return
            await socket.send_json(getter.result())
    finally:
        reader.cancel()
        hub.unsubscribe(principal.client_id, results)
