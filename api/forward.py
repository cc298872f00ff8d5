"""A follower relays client calls to the leader: any node gives the leader's answer.

A node that does not lead forwards every REST client and operator call under `/v1` (submit,
read and wait, cancel, the DLQ, the admin views) to the leader named by the lease, over HTTP
with the caller's own headers (its `Authorization` among them) and body, and relays the
leader's status, headers and body unchanged. A plain HTTP client, curl or a load balancer
therefore works with any node, and a submission through a follower gets exactly the leader's
answer (202, `200 existing`, 409, 422...), never a 202 the leader would not give.

What is not forwarded, and why:
- the worker routes (poll, ack, fail, heartbeat, the WebSocket): a worker is a long-lived SDK
  client that follows the 307 once and then talks to the leader directly, so its hot path
  pays no extra hop; a WebSocket could not be relayed by a request/response hop anyway;
- `/healthz`, `/readyz`, `/metrics`, the dashboard's files: they are about this node.

When no leader is known (an election, a rebuild), a submission is answered 503 with
`Retry-After`: a follower writing it to Kafka itself could not know the leader's answer
(an id another client holds, a known id) and would promise what may never exist. The other
calls go on to the routes, which answer the same 503 (or, for `/v1/leader`, this node's view).

A failed relay is an error like any other (`{"error", "detail"}`): 503 with `Retry-After`
when the leader could not be reached (nothing was sent: retrying is safe), 502 when its
answer was lost or unreadable and 504 when it did not come in time (the call may have been
done: a submission is retried with the same id, which the leader answers by the existing
job). A forwarded call carries FORWARDED_HEADER, and a node receiving one that it cannot
serve answers 503 rather than forwarding again, so leadership moving never makes a loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Iterable
from urllib.parse import parse_qs

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from dispatch.api.errors import error_response, target_of
from dispatch.api.leader import LeaderUnavailable
from dispatch.api.metrics import Metrics
from dispatch.api.node import Node
from dispatch.api.routes.jobs import MAX_WAIT_S
from dispatch.api.submit_fast_path import read_body

log = logging.getLogger(__name__)

FORWARDED_HEADER = b"dispatch-forwarded-by"
"""Set on a forwarded call (the forwarding node's address): the receiver never forwards it."""

LEADER_HEADER = b"dispatch-leader"
"""Set on a relayed answer: the leader's address, so that a client that trusts it (the SDK,
`dispatch.client`) sends its next calls there and saves the hop through this node."""

CONNECT_S = 2.0
"""Time to reach the leader (and to get a connection from the pool): past it, a 503."""
ANSWER_S = 30.0
"""Time for the leader's answer to a call that does not wait (a Delta read for
`/v1/tenants` is the slowest)."""
WAIT_MARGIN_S = 10.0
"""Added to a `?wait=` long-poll's own wait: the leader answers at its end, not before."""

MAX_CONNECTIONS = 1000
"""Open connections to the leader at once: one per forwarded call in progress (a long-poll
holds one for its wait). Past it, a call waits up to CONNECT_S for one, then gets a 503."""
KEPT_LEADERS = 2
"""Leaders whose connection pools are kept: the current one and the one before it, whose
calls in progress may finish."""

_SUBMISSIONS = frozenset({"/v1/jobs", "/v1/jobs:batch"})
_HOP_BY_HOP = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
        b"trailer", b"transfer-encoding", b"upgrade", b"expect",
    }
)  # fmt: skip
_NOT_SENT_ON = _HOP_BY_HOP | {b"host", b"content-length", FORWARDED_HEADER}
_NOT_RELAYED = _HOP_BY_HOP | {b"content-length", b"date", b"server"}
"""uvicorn writes its own `date` and `server`; the length is that of the body relayed."""


class Forwarder:
    """The HTTP clients to the leader (one per leader address) and the forwarding itself."""

    def __init__(self, node: Node, metrics: Metrics) -> None:
        self.node = node
        self.metrics = metrics
        self._clients: OrderedDict[str, httpx.AsyncClient] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def client_for(self, leader: str) -> httpx.AsyncClient:
        client = self._clients.get(leader)
        if client is not None:
            self._clients.move_to_end(leader)
            return client
        client = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment between two nodes
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=100),
        )
        self._clients[leader] = client
        while len(self._clients) > KEPT_LEADERS:
            _, old = self._clients.popitem(last=False)
            closing = asyncio.get_running_loop().create_task(old.aclose())
            self._closing.add(closing)  # the loop keeps only a weak reference
            closing.add_done_callback(self._closing.discard)
        return client

    async def close(self) -> None:
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.aclose()

    async def exchange(
        self, scope: Scope, leader: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The leader's answer to the call (status, headers to relay, body), or the error
        answer of a relay that failed."""
        url = leader + _kept_dot_segments(target_of(scope))
        answer_s = max(ANSWER_S, _wait_of(scope) + WAIT_MARGIN_S)
        timeout = httpx.Timeout(answer_s, connect=CONNECT_S, pool=CONNECT_S, write=ANSWER_S)
        sent = [(name, value) for name, value in headers if name not in _NOT_SENT_ON]
        sent.append((FORWARDED_HEADER, self.node.address.encode("latin-1", "replace")))
        client = self.client_for(leader)
        try:
            request = client.build_request(
                scope["method"], url, headers=sent, content=body, timeout=timeout
            )
            response = await client.send(request, stream=True)
            try:
                # Raw: the bytes as the leader sent them, with their content-encoding.
                answer = b"".join([chunk async for chunk in response.aiter_raw()])
            finally:
                await response.aclose()
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as error:
            self.count("unreachable")
            return _failure(503, "unavailable", f"the leader {leader} does not answer: {error!r}")
        except httpx.TimeoutException:
            self.count("lost")
            return _failure(
                504, "gateway_timeout", f"the leader {leader} did not answer in time; " + _UNKNOWN
            )
        except Exception as error:
            # A closed connection, a malformed answer, a leader address httpx refuses: no
            # answer to relay, and no reason for a 500 either.
            if not isinstance(error, (httpx.HTTPError, httpx.InvalidURL)):
                log.warning("forwarding to %s failed", leader, exc_info=True)
            self.count("lost")
            detail = f"no readable answer from the leader {leader} ({type(error).__name__}); "
            return _failure(502, "bad_gateway", detail + _UNKNOWN)
        if response.status_code == 307:
            # The leader stopped leading while it held the call: its route did nothing.
            self.count("unreachable")
            return _failure(503, "unavailable", f"{leader} no longer leads; retry")
        self.count("relayed")
        relayed = [
            (name.lower(), value)
            for name, value in response.headers.raw
            if name.lower() not in _NOT_RELAYED
        ]
        relayed.append((b"content-length", str(len(answer)).encode()))
        return response.status_code, relayed, answer

    def count(self, outcome: str) -> None:
        self.metrics.forwarded.labels(outcome).inc()


_UNKNOWN = "the call may have been done (a submission: retry with the same id)"


class ForwardToLeader:
    """ASGI middleware: a follower's client calls go to the leader (see the module)."""

    def __init__(
        self, app: ASGIApp, forwarder: Forwarder, local: Iterable[re.Pattern[str]]
    ) -> None:
        self.app = app
        self.forwarder = forwarder
        self.node = forwarder.node
        self.local = tuple(local)
        """Paths under `/v1` this node always serves itself (the worker routes)."""

    def forwardable(self, path: str) -> bool:
        return path.startswith("/v1/") and not any(route.match(path) for route in self.local)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.forwardable(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            self.node.leader()
        except LeaderUnavailable as unavailable:
            leader, why = unavailable.leader, str(unavailable)
        else:
            await self.app(scope, receive, send)  # this node leads: its routes serve
            return
        headers = list(scope["headers"])
        forwarded = any(name == FORWARDED_HEADER for name, _ in headers)
        if leader is not None and not forwarded:
            await self._relay(scope, receive, send, leader, headers)
            return
        if not forwarded and scope["path"] not in _SUBMISSIONS:
            # The routes answer 503 themselves (and `/v1/leader` this node's view).
            await self.app(scope, receive, send)
            return
        self.forwarder.count("no_leader")
        if forwarded:
            why = "this node no longer leads (leadership moved)"
        response = error_response(503, "unavailable", why)
        response.headers["Retry-After"] = "1"
        await response(scope, receive, send)

    async def _relay(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        leader: str,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        # Read through the payload limit's counting `receive`: a body over it raises here,
        # before anything is sent, and is answered 413 as on the leader.
        body = await read_body(receive)
        if body is None:
            return  # the client went away mid-body: nobody to answer
        exchange = asyncio.ensure_future(self.forwarder.exchange(scope, leader, headers, body))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({exchange, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # The client left (or this request was cancelled): stop waiting on the leader.
            for task in (gone, exchange):
                if not task.done():
                    task.cancel()
        if gone.done() and not gone.cancelled() and gone.exception() is not None:
            log.debug("reading a forwarded call's connection failed", exc_info=gone.exception())
        if not exchange.done() or exchange.cancelled():
            return
        status, relayed, answer = exchange.result()
        relayed = [*relayed, (LEADER_HEADER, leader.encode("latin-1"))]
        await send({"type": "http.response.start", "status": status, "headers": relayed})
        await send({"type": "http.response.body", "body": answer})


def _failure(status: int, error: str, detail: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    response = error_response(status, error, detail)
    if status == 503:
        response.headers["Retry-After"] = "1"
    return status, list(response.raw_headers), bytes(response.body)


def _kept_dot_segments(target: str) -> str:
    """`target` with its `.` and `..` path segments percent-encoded: httpx resolves them (as a
    browser would), which would send the leader another path than the caller's (the job id
    `..`); encoded, the leader decodes them into the same path parameter."""
    path, mark, query = target.partition("?")
    segments = [{".": "%2E", "..": "%2E%2E"}.get(part, part) for part in path.split("/")]
    return "/".join(segments) + mark + query


def _wait_of(scope: Scope) -> float:
    """A read's `?wait=` (how long the leader may hold it), within the routes' bounds; 0 for
    any other call, or a wait the leader will refuse at once."""
    if scope["method"] != "GET" or not scope["path"].startswith("/v1/jobs/"):
        return 0.0
    query: bytes = scope.get("query_string") or b""
    values = parse_qs(query.decode("latin-1")).get("wait")
    try:
        wait = float(values[-1]) if values else 0.0
    except ValueError:
        return 0.0
    if not math.isfinite(wait):
        return 0.0
    return min(max(wait, 0.0), MAX_WAIT_S)


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone away (after its whole body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
