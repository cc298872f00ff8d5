"""The client SDK: `Client` (sync, on urllib3) and `AsyncClient` (asyncio, on aiohttp).

Both speak the REST contract (docs/spec.md, *REST*) and are ready for failover: a follower's `307`
is followed to the leader it names (and remembered), connection errors and `503` are
retried with exponential backoff and jitter across the node list, for at most
`retry_timeout_s` in total. A request is retried blindly only when that is safe: either the
server cannot have seen it (the connection was refused, a `503`, a `307`), or it is
idempotent (reads; submissions, whose id is made here before the first try; settlements,
keyed by attempt and lease).

Configuration, highest first: arguments, the environment (`DISPATCH_URL`, comma-separated
node URLs, and `DISPATCH_API_KEY`), then the local stack (`http://127.0.0.1:8000` and the
*client* key of `dispatch keys`: the least a client needs; the worker SDK takes the worker
key, and admin calls need an admin key given explicitly).

`fail_fast=True` (the CLI's choice) raises `Unreachable` at once when every configured node
refused the connection and none answered during the call: nothing is running there, and
waiting for the retry budget only delays saying so. A node that answered (a `503` or a `307`
during an election) keeps the call retrying for the whole budget. The SDK's default is to
retry for the budget in every case, so that a long-running program rides out a stack that
restarts as a whole.

HTTP goes through `dispatch.http_transport`: a transport sends one request and gives back an
`Answer` or a `TransportError` saying whether the request may have been sent and whether the
connection was refused; every decision above is made here, from those. urllib3 and aiohttp
replaced httpx, whose async client got slower as calls ran concurrently (docs/sdk.md,
*What the SDK is built on*).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Self, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from dispatch import fast_json, wire
from dispatch.core.job import TERMINAL_STATUSES as _CORE_TERMINAL_STATUSES
from dispatch.http_transport import (
    Answer,
    AsyncHTTP,
    AsyncTransport,
    SyncHTTP,
    SyncTransport,
    TransportError,
)
from dispatch.submit_gathering import AsyncGatherer, ThreadGatherer

# The answers about jobs are the server's own classes (`dispatch.wire`), under the SDK's names.
Job = wire.JobView
"""A job as the API shows it: its fields, and `terminal`."""
Accepted = wire.Accepted
"""A submission Kafka holds (`existing` false), or the existing job of a known id."""

DEFAULT_URL = "http://127.0.0.1:8000"
MAX_BATCH = 1000
"""Jobs per `POST /v1/jobs:batch` request sent by `submit_many`."""
DEFAULT_SUBMITS_IN_FLIGHT = 1
"""`submit` requests a client has on their way before concurrent single submits gather into
shared batch requests (`dispatch.submit_gathering`); a caller alone is never delayed."""
MAX_WAIT_PER_REQUEST_S = 60.0
"""The server's cap on `?wait=`; longer waits are made of several long-polls."""
TERMINAL_STATUSES: frozenset[str] = frozenset(status.value for status in _CORE_TERMINAL_STATUSES)
"""The core's terminal statuses, as the strings `Job.status` holds."""
MAX_KEY_LENGTH = 200
"""The longest concurrency key (`key` of a submission; the server's bound)."""
STREAM_PATH = "/v1/stream"
STREAM_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""The largest message the SDK reads from `WS /v1/stream`. websockets' default (1 MiB) is less
than an assignment whose payload is at a node's default limit (1 MiB) plus its envelope: such a
socket closed with 1009 at every delivery, and the job died of its attempts. 32 MiB is twice
what a Kafka record of the dispatcher's topics may hold, so every payload the log can carry
fits."""

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


# --- errors ---------------------------------------------------------------------------------


class DispatchError(Exception):
    """A request failed. `status` is the HTTP status (None when no node answered), `error`
    the API's error code (`not_found`, `stale_lease`...), `detail` its explanation."""

    def __init__(self, detail: str, *, error: str = "error", status: int | None = None) -> None:
        super().__init__(f"{error}: {detail}")
        self.detail = detail
        self.error = error
        self.status = status


class BadRequest(DispatchError):
    """400: the request is malformed."""


class Unauthorized(DispatchError):
    """401: no API key, or an unknown one."""


class Forbidden(DispatchError):
    """403: the key's role may not do this."""


class NotFound(DispatchError):
    """404: no such job (another client's job also answers this)."""


class Conflict(DispatchError):
    """409: the job is not in a state that allows this (`not_cancellable`, `not_dead`,
    `stale_lease`, `already_settled`...); `error` says which."""


class TooLarge(DispatchError):
    """413: the request body is over the server's limit."""


class Invalid(DispatchError):
    """422: a field is invalid; `detail` names it."""


class Unavailable(DispatchError):
    """No node could serve the request within the retry budget (down, no leader, 503)."""


class Unreachable(Unavailable):
    """Every configured node refused the connection (raised at once with `fail_fast`):
    nothing listens at the configured URLs."""


class ServerError(DispatchError):
    """Any other error status (a 5xx other than 503 is a server bug)."""


class UntrustedRedirect(DispatchError):
    """A node redirected to a leader on a host none of the configured nodes is on (or from
    https to http). Its key is never sent there: list every node in `urls`/`DISPATCH_URL`,
    or set `api.advertise_url` so nodes name each other as clients know them."""


class WaitTimeout(DispatchError, TimeoutError):
    """`wait` ran out of time before the job ended; `job` is its last known state."""

    def __init__(self, job: Job, timeout_s: float) -> None:
        super().__init__(
            f"job {job.id!r} is still {job.status} after {timeout_s:g} s", error="timeout"
        )
        self.job = job


LEADER_HINT_HEADER = "dispatch-leader"
"""On an answer a follower relayed: the leader's base URL (`dispatch.api.forward`)."""
_LEADER_ANSWER_LOST = frozenset({502, 504})
"""What a relaying follower answers when the leader's answer was lost or late."""

_BY_STATUS: dict[int, type[DispatchError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
    503: Unavailable,
}
_BY_CODE: dict[str, type[DispatchError]] = {
    "bad_request": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "unknown_worker": NotFound,
    "conflict": Conflict,
    "stale_lease": Conflict,
    "already_settled": Conflict,
    "not_cancellable": Conflict,
    "not_dead": Conflict,
    "stale_epoch": Conflict,
    "too_large": TooLarge,
    "invalid": Invalid,
    "unavailable": Unavailable,
    # A WebSocket session whose term ended mid-session: try again (on the leader it names).
    "not_leader": Unavailable,
}


def error_from_body(status: int | None, body: Any, text: str = "") -> DispatchError:
    """The typed error for an error answer: by HTTP status when there is one (the contract's
    statuses are stable), else by the body's `error` code (WebSocket errors have no status)."""
    if isinstance(body, Mapping) and isinstance(body.get("error"), str):
        code = str(body["error"])
        detail = str(body.get("detail", ""))
    else:
        code = f"http_{status}" if status is not None else "error"
        detail = text.strip()[:300] or "no detail"
    if status is not None:
        kind = _BY_STATUS.get(status, ServerError if status >= 500 else DispatchError)
    else:
        kind = _BY_CODE.get(code, DispatchError)
    return kind(detail, error=code, status=status)


def error_from_response(response: Answer) -> DispatchError:
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    return error_from_body(response.status, body, response.text)


# --- configuration --------------------------------------------------------------------------


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """Node base URLs from a comma-separated string or a list, without trailing slashes."""
    parts = urls.split(",") if isinstance(urls, str) else list(urls)
    cleaned = [part.strip().rstrip("/") for part in parts if part.strip()]
    for url in cleaned:
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ValueError(f"expected a node URL such as {DEFAULT_URL}, got {url!r}")
    if not cleaned:
        raise ValueError("at least one node URL is needed")
    return cleaned


def default_urls() -> list[str]:
    """`DISPATCH_URL` (comma-separated), else the local stack's first node."""
    return parse_urls(os.environ.get("DISPATCH_URL") or DEFAULT_URL)


DEV_KEY_ROLES = ("client", "worker", "admin")
"""The roles of the local stack's development keys (`dispatch keys`)."""


def default_api_key(role: str = "client") -> str | None:
    """`DISPATCH_API_KEY`, else the local stack's development key of `role` (if any): the
    client key by default, never more than a caller asked for."""
    if role not in DEV_KEY_ROLES:
        raise ValueError(f"role: expected one of {', '.join(DEV_KEY_ROLES)}, got {role!r}")
    key = os.environ.get("DISPATCH_API_KEY")
    if key:
        return key
    # Imported here: the settings pull in pydantic-settings and read conf/, which a client
    # given its key and URLs never needs, and which the light install does not have (it
    # runs no local stack whose keys it could read).
    try:
        from dispatch.settings import ConfigError, load_settings
    except ImportError:
        return None

    try:
        dev_keys_file = load_settings().auth.dev_keys_file
    except ConfigError:
        return None
    try:
        keys = json.loads(dev_keys_file.read_text())
    except (OSError, ValueError):
        return None
    key = keys.get(role) if isinstance(keys, dict) else None
    return key if isinstance(key, str) and key else None


# --- retries --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: try n (from 0) waits between
    `(1 - jitter) * c` and `c`, where `c = min(max_s, initial_s * multiplier**n)`.
    Jitter spreads clients that all lost the same leader at the same moment."""

    initial_s: float = 0.1
    multiplier: float = 2.0
    max_s: float = 2.0
    """A failover takes a few seconds: with a 5 s cap, clients and workers came back up to
    5 s after the new leader was ready (a canary's client saw its job seconds after the log
    did, and a worker killed shortly after a leader kill had not reconnected to deliver its
    ack, so its job ran again: BENCHMARKS.md, *`dispatch chaos`*). A retry is one cheap
    request."""
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.multiplier < 1 or self.max_s < self.initial_s:
            raise ValueError(f"invalid backoff {self}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be in [0, 1], got {self.jitter}")

    def ceiling(self, attempt: int) -> float:
        """The longest pause before retry number `attempt` (0-based)."""
        # Capped exponent: multiplier**attempt would overflow a float after ~1000 tries.
        return min(self.max_s, self.initial_s * self.multiplier ** min(attempt, 64))

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """The pause before retry number `attempt`; `draw` returns a number in [0, 1)."""
        ceiling = self.ceiling(attempt)
        return ceiling * (1 - self.jitter * draw())


class NodeRouter:
    """Which node to call: the one that last answered, the leader a follower named, or,
    after a failure, the next one in the list. Shared by REST calls and streams.

    A redirect is followed only to a trusted node: one on the host of a configured node
    (any port: the nodes of one machine, as `dispatch up` runs them, are found from one
    URL), with the same scheme or http upgraded to https. Anything else raises
    `UntrustedRedirect`: a node (or whatever answers in its place) cannot send the client,
    and its key, to another origin."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls = parse_urls(urls)
        self._trusted_hosts = {_host_of(url) for url in self._urls}
        self._index = 0
        self._lock = threading.Lock()

    def trusts(self, url: str) -> bool:
        """True when a redirect to the base URL `url` may be followed (see the class)."""
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            return False
        host = _host_of(url)
        if host in self._trusted_hosts:
            return True
        return host[0] == "https" and ("http", host[1]) in self._trusted_hosts

    @property
    def urls(self) -> list[str]:
        with self._lock:
            return list(self._urls)

    @property
    def current(self) -> str:
        with self._lock:
            return self._urls[self._index]

    def failed(self, url: str) -> None:
        """`url` did not serve: move on, unless another caller already did."""
        with self._lock:
            if self._urls[self._index] == url:
                self._index = (self._index + 1) % len(self._urls)

    def redirect(self, leader: str) -> None:
        """A follower named the leader: use it from now on (added if it is new). Raises
        `UntrustedRedirect` when it is not a trusted node."""
        try:
            [url] = parse_urls([leader])
        except ValueError:
            raise UntrustedRedirect(
                f"a node named the leader {leader[:200]!r}, not a node URL",
                error="untrusted_redirect",
            ) from None
        if not self.trusts(url):
            raise UntrustedRedirect(
                f"a node named the leader {url[:200]}, which is on none of the configured "
                f"nodes' hosts ({', '.join(sorted(f'{s}://{h}' for s, h in self._trusted_hosts))})"
                ": not following it with this client's key (add it to DISPATCH_URL)",
                error="untrusted_redirect",
            )
        with self._lock:
            if url not in self._urls:
                self._urls.append(url)
            self._index = self._urls.index(url)


def _host_of(url: str) -> tuple[str, str]:
    """(scheme, host name) of a URL, lower case; the port is left out."""
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower()


def leader_from_redirect(response: Answer) -> str | None:
    """The leader's base URL from a 307: the body's `leader`, else the Location's origin."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping) and isinstance(body.get("leader"), str) and body["leader"]:
        return str(body["leader"])
    return _origin(response.headers.get("location"))


def _origin(location: str | None) -> str | None:
    if not location:
        return None
    parts = urlsplit(location)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def _retry_after_s(response: Answer) -> float:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return 0.0


# A `TransportError` says whether the request may have left this machine (not after a failed
# connect, a connect or pool timeout, an unusable URL: the server cannot have acted on it), and
# whether the node refused the connection ("nothing listens there": refused, no such host, as
# opposed to a timeout: a host that does not answer may be busy, one that refuses is not
# running a node).
MAX_REDIRECTS_IN_A_ROW = 5


@dataclass
class _Call(Generic[T]):
    """One logical request; `parse` turns a 2xx answer into the method's value."""

    method: str
    path: str
    parse: Callable[[Answer], T]
    body: Any = None
    params: dict[str, Any] | None = None
    idempotent: bool = True
    timeout_s: float | None = None


@dataclass
class _Done(Generic[T]):
    value: T


@dataclass
class _Tries:
    """The retry state of one call: how many tries, redirects in a row, and the budget."""

    backoff: Backoff
    budget_s: float
    fail_fast: bool = False
    started: float = field(default_factory=time.monotonic)
    retries: int = 0
    redirects: int = 0
    answered: bool = False
    """A node answered during this call (even a 503): something runs, so keep retrying."""
    refused: dict[str, str] = field(default_factory=dict)
    """The nodes that refused the connection in this call, with the reason."""

    def unreachable(self, url: str, reason: str, urls: Sequence[str]) -> None:
        """`url` refused the connection: with `fail_fast`, raise `Unreachable` once every
        node of `urls` did and none answered."""
        if "refused" in reason.lower() or "errno 111" in reason.lower():
            reason = "connection refused"  # one wording for the transports' and websockets' texts
        self.refused[url] = reason
        if self.fail_fast and not self.answered and set(urls) <= set(self.refused):
            where = ", ".join(urls)
            raise Unreachable(f"no node answers at {where} ({reason})", error="unreachable")

    def pause(self, error: DispatchError, at_least_s: float = 0.0) -> float:
        """The pause before the next try, or raise `error` once the budget is spent."""
        delay = max(self.backoff.delay(self.retries), min(at_least_s, self.backoff.max_s))
        self.retries += 1
        if time.monotonic() + delay - self.started > self.budget_s:
            raise error
        return delay


def _unavailable(url: str, cause: BaseException | str) -> Unavailable:
    if isinstance(cause, str):
        reason = cause
    else:
        kind = cause.kind if isinstance(cause, TransportError) else type(cause).__name__
        reason = f"{kind}: {cause}"
    return Unavailable(f"{url}: {reason}".rstrip(": "), error="unavailable")


class _Base:
    """Configuration, request building and the retry decisions shared by both clients."""

    def __init__(
        self,
        urls: str | Sequence[str] | None,
        api_key: str | None,
        request_timeout_s: float,
        retry_timeout_s: float,
        backoff: Backoff | None,
        fail_fast: bool = False,
    ) -> None:
        self.router = NodeRouter(parse_urls(urls) if urls is not None else default_urls())
        self.api_key = api_key if api_key is not None else default_api_key()
        self.request_timeout_s = request_timeout_s
        self.retry_timeout_s = retry_timeout_s
        self.backoff = backoff or Backoff()
        self.fail_fast = fail_fast
        # The key is read once, here (the headers of every REST call; streams read `headers`).
        self._plain_headers = self.headers
        self._json_headers = {**self._plain_headers, "Content-Type": "application/json"}

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _request(self, call: _Call[Any], url: str) -> tuple[str, dict[str, str], bytes | None]:
        """The absolute URL, the headers and the body of one try of `call` at node `url`."""
        target = url + call.path
        if call.params:
            target += "?" + urlencode(
                {name: _query_value(value) for name, value in call.params.items()},
                quote_via=quote,
            )
        if call.body is None:
            return target, self._plain_headers, None
        return target, self._json_headers, fast_json.dumps(call.body)

    def _tries(self, fail_fast: bool | None = None) -> _Tries:
        chosen = self.fail_fast if fail_fast is None else fail_fast
        return _Tries(self.backoff, self.retry_timeout_s, chosen)

    def _outcome(
        self, call: _Call[T], url: str, tries: _Tries, answer: Answer | TransportError
    ) -> _Done[T] | float:
        """What to do after one try: done (a value), or the pause before the next try.
        Raises the typed error when the call failed for good."""
        if isinstance(answer, TransportError):
            error = _unavailable(url, answer)
            if answer.may_have_been_sent and not call.idempotent:
                raise error from answer
            if answer.refused:
                tries.unreachable(url, str(answer) or answer.kind, self.router.urls)
            self.router.failed(url)
            return tries.pause(error)
        tries.answered = True
        status = answer.status
        if status == 307:
            leader = leader_from_redirect(answer)
            tries.redirects += 1
            if leader is not None and tries.redirects <= MAX_REDIRECTS_IN_A_ROW:
                self.router.redirect(leader)
                return 0.0
            # A follower that does not know the leader yet (an election): wait and retry.
            self.router.failed(url)
            return tries.pause(_unavailable(url, "redirected, but no leader is known"))
        tries.redirects = 0
        if status == 503:
            self.router.failed(url)
            return tries.pause(error_from_response(answer), _retry_after_s(answer))
        if status in _LEADER_ANSWER_LOST and call.idempotent:
            # A follower relaying the call lost the leader's answer (502) or waited too long
            # for it (504): the leader may have acted, so only a call safe to repeat is.
            self.router.failed(url)
            return tries.pause(error_from_response(answer))
        self._follow_leader_hint(answer)
        if status >= 400:
            refused = error_from_response(answer)
            if isinstance(refused, Unauthorized) and not self.api_key:
                refused.detail += " (no API key: set DISPATCH_API_KEY or run `dispatch keys`)"
                refused.args = (f"{refused.error}: {refused.detail}",)
            raise refused
        try:
            return _Done(call.parse(answer))
        except (ValueError, ValidationError) as problem:
            raise ServerError(
                f"unexpected answer from {url}: {problem}", error="bad_answer", status=status
            ) from problem

    def _follow_leader_hint(self, answer: Answer) -> None:
        """A follower relayed this answer and named the leader: go there directly from the
        next call on, when it is a trusted node (as a 307 would be followed); else stay."""
        leader = answer.headers.get(LEADER_HINT_HEADER)
        if leader is not None:
            with contextlib.suppress(UntrustedRedirect):
                self.router.redirect(leader)

    def _timeout(self, call: _Call[Any]) -> float:
        return call.timeout_s if call.timeout_s is not None else self.request_timeout_s


def _query_value(value: Any) -> str:
    """A query parameter's text, as httpx wrote it (`true`, `false`, empty for None)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


# --- what the API answers -------------------------------------------------------------------
# `Job` and `Accepted` (top of the module) are `dispatch.wire`'s, shared with the server.


class _Answer(BaseModel):
    # Fields a newer server adds must not break an older SDK.
    model_config = ConfigDict(extra="ignore", frozen=True)


class JobProgress(_Answer):
    """A running job's progress, as its worker reported it (`Assignment.progress`) and the
    leader kept it (`at`: when, the leader's clock): pushed on the results stream
    (`AsyncClient.results(on_progress=...)`); `Job.progress` holds the same fields."""

    id: str
    done: float
    total: float | None = None
    message: str | None = None
    at: float | None = None

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> JobProgress:
        """Read a stream's `{"type": "progress", "id", "progress": {...}}` message."""
        report = message.get("progress")
        return cls.model_validate({**(report if isinstance(report, dict) else {}),
                                   "id": message.get("id")})  # fmt: skip


ProgressCallback = Callable[[JobProgress], Awaitable[None] | None]
"""Called with each progress report on a results stream: a function or a coroutine
function (awaited before the stream reads on)."""


class QueueStats(_Answer):
    exec: str
    ready: int
    delayed: int
    running: int
    paused: bool = False
    """An exec pause holds it: nothing new starts."""


class Pause(_Answer):
    """A pause in force: nothing new of `target` (an exec pattern, or a client id, per
    `scope`) starts until it is resumed."""

    scope: str
    target: str
    at: float
    by: str | None = None
    reason: str = ""


class Limit(_Answer):
    """A limit in force (`GET /v1/limits`): at most `max_inflight` jobs of `target` running
    at once and/or at most `rate` starts a second (a token bucket of `burst`). `scope`:
    `client` (a client id), `exec` (an exec pattern, one budget for all it matches) or `key`
    (a concurrency key, or a key pattern ending in `*`: a budget per key). `source`:
    `runtime` (set through the API, by `by`) or `settings`. `inflight`: the jobs it counts
    running now (None for a key pattern); `held`: the queued jobs it holds back now."""

    scope: str
    target: str
    max_inflight: int | None = None
    rate: float | None = None
    burst: int | None = None
    source: str = "runtime"
    by: str | None = None
    reason: str = ""
    at: float | None = None
    inflight: int | None = None
    held: int = 0


class RemovedLimit(_Answer):
    """The answer of `remove_limit`: whether a runtime limit was removed, and the limit that
    applies now (the settings' one of the same scope and target), if any."""

    removed: bool
    limit: Limit | None = None


class WorkerInfo(_Answer):
    worker_id: str
    subjects: list[str]
    credit: int
    last_seen: float
    running: list[str]


class LeaderInfo(_Answer):
    leader: str | None
    node: str
    is_leader: bool
    epoch: int | None


class Submission(BaseModel):
    """One job to submit; unknown fields are refused here, before anything is sent."""

    model_config = ConfigDict(extra="forbid")

    exec: str
    payload: Any = None
    id: str | None = None
    max_attempts: int | None = Field(None, ge=1)
    timeout_s: float | None = Field(None, gt=0)
    priority: int = 0
    delay_s: float = Field(0.0, ge=0)
    client_id: str | None = None
    retry: dict[str, float] | None = None
    """The job's own retry policy, some or all of `delay_s`, `multiplier`, `max_delay_s`,
    `jitter` (the rest: its exec's default)."""
    expires_at: float | None = Field(None, ge=0)
    """Unix time: not started by then, the job ends `expired`."""
    ttl_s: float | None = Field(None, gt=0)
    """As `expires_at`, in seconds after the job is accepted."""
    max_run_s: float | None = Field(None, gt=0)
    """Hard time limit of each attempt, heartbeats or not: past it the attempt is stopped
    and the job retried (`dead` with `time_limit` after its last attempt)."""
    key: str | None = Field(None, min_length=1, max_length=MAX_KEY_LENGTH)
    """A concurrency key (`account:42`): the key limits in force bound how many jobs of one
    key run at once and how fast they start."""

    def to_body(self) -> dict[str, Any]:
        """The JSON body, with an id made here when absent: a retried submit stays one job."""
        body = self.model_dump(exclude_none=True)
        body.setdefault("id", new_job_id())
        body["payload"] = self.payload
        return body


def new_job_id() -> str:
    return uuid.uuid4().hex


def _model(kind: type[M]) -> Callable[[Answer], M]:
    def parse(response: Answer) -> M:
        return kind.model_validate(response.json())

    return parse


@dataclass(frozen=True)
class Polled:
    """A poll's answer: the assignments, the leader epoch that gave them, and the held
    attempts the worker must stop (`{"id", "attempt", "reason"}`: `cancel_requested`,
    `time_limit`, `ended`)."""

    assignments: list[dict[str, Any]]
    epoch: int | None
    cancel: list[dict[str, Any]] = field(default_factory=list)


def _polled(response: Answer) -> Polled:
    answer = response.json()
    epoch = answer.get("epoch")
    cancel = [stop for stop in answer.get("cancel") or [] if isinstance(stop, dict)]
    return Polled(list(answer["assignments"]), epoch if isinstance(epoch, int) else None, cancel)


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat's answer: the attempt's new deadline (the leader's clock), and why the
    worker must stop it (`cancel_requested`), None to carry on."""

    deadline: float
    cancel: str | None = None


def _heartbeat(response: Answer) -> Heartbeat:
    answer = response.json()
    cancel = answer.get("cancel")
    return Heartbeat(float(answer["deadline"]), cancel if isinstance(cancel, str) else None)


CANCEL_STATUSES = ("queued", "running", "any")
"""Which jobs `cancel_many` cancels: queued ones (at once), running ones (told to stop), or
both."""


def _cancel_many_body(
    exec_pattern: str | None,
    client_id: str | None,
    status: str,
    limit: int | None,
    reason: str | None,
) -> dict[str, Any]:
    if status not in CANCEL_STATUSES:
        raise ValueError(f"status must be 'queued', 'running' or 'any', got {status!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    body: dict[str, Any] = {"exec": exec_pattern, "client_id": client_id, "status": status,
                            "limit": limit, "reason": reason}  # fmt: skip
    return {name: value for name, value in body.items() if value is not None}


def _accepted_batch(response: Answer) -> list[Accepted]:
    return list(wire.AcceptedBatch.model_validate(response.json()).jobs)


def _job_list(response: Answer) -> list[Job]:
    return list(wire.JobList.model_validate(response.json()).jobs)


def _models(kind: type[M], key: str) -> Callable[[Answer], list[M]]:
    def parse(response: Answer) -> list[M]:
        return [kind.model_validate(item) for item in response.json()[key]]

    return parse


def submission_of(job: Submission | Mapping[str, Any], where: str = "job") -> Submission:
    """A checked submission, or `Invalid` naming the bad field (nothing is sent)."""
    if isinstance(job, Submission):
        return job
    try:
        return Submission.model_validate(job)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join([where, *(str(part) for part in problem['loc'])])}: {problem['msg']}"
            for problem in error.errors()
        )
        raise Invalid(problems, error="invalid") from None


def _submission(jobs: Iterable[Submission | Mapping[str, Any]]) -> Iterable[dict[str, Any]]:
    for index, job in enumerate(jobs):
        yield submission_of(job, f"jobs[{index}]").to_body()


def _chunks(bodies: Iterable[dict[str, Any]], size: int) -> Iterable[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for body in bodies:
        chunk.append(body)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Calls:
    """The REST contract as `_Call`s (one place for paths, bodies and parsing)."""

    @staticmethod
    def submit(body: dict[str, Any]) -> _Call[Accepted]:
        return _Call("POST", "/v1/jobs", _model(Accepted), body=body)

    @staticmethod
    def submit_batch(bodies: list[dict[str, Any]]) -> _Call[list[Accepted]]:
        return _Call("POST", "/v1/jobs:batch", _accepted_batch, body={"jobs": bodies})

    @staticmethod
    def get(job_id: str, wait_s: float = 0.0, timeout_s: float | None = None) -> _Call[Job]:
        params = {"wait": round(wait_s, 3)} if wait_s > 0 else None
        return _Call("GET", f"/v1/jobs/{_quote(job_id)}", _model(Job), params=params,
                     timeout_s=timeout_s)  # fmt: skip

    @staticmethod
    def cancel(job_id: str, reason: str | None = None) -> _Call[Job]:
        # Not idempotent: a repeat after a lost answer would say 409 not_cancellable.
        body = None if reason is None else {"reason": reason}
        return _Call("POST", f"/v1/jobs/{_quote(job_id)}/cancel", _model(Job), body=body,
                     idempotent=False)  # fmt: skip

    @staticmethod
    def cancel_many(body: dict[str, Any]) -> _Call[dict[str, int]]:
        # Not idempotent: a repeat would count again (and cancel what matches by then).
        return _Call("POST", "/v1/jobs/cancel", lambda response: dict(response.json()),
                     body=body, idempotent=False)  # fmt: skip

    @staticmethod
    def pauses() -> _Call[list[Pause]]:
        return _Call("GET", "/v1/pauses", _models(Pause, "pauses"))

    @staticmethod
    def pause(scope: str, target: str, reason: str | None) -> _Call[list[Pause]]:
        # Idempotent: pausing what is paused keeps the first pause.
        body = None if reason is None else {"reason": reason}
        path = f"/v1/pauses/{_quote(scope)}/{_quote(target)}"
        return _Call("PUT", path, _models(Pause, "pauses"), body=body)

    @staticmethod
    def resume(scope: str, target: str) -> _Call[list[Pause]]:
        path = f"/v1/pauses/{_quote(scope)}/{_quote(target)}"
        return _Call("DELETE", path, _models(Pause, "pauses"))

    @staticmethod
    def limits() -> _Call[list[Limit]]:
        return _Call("GET", "/v1/limits", _models(Limit, "limits"))

    @staticmethod
    def limit(scope: str, target: str) -> _Call[Limit]:
        return _Call("GET", _limit_path(scope, target), _model(Limit))

    @staticmethod
    def set_limit(scope: str, target: str, body: dict[str, Any]) -> _Call[Limit]:
        # Idempotent: setting the limit in force again changes nothing.
        return _Call("PUT", _limit_path(scope, target), _model(Limit), body=body)

    @staticmethod
    def remove_limit(scope: str, target: str) -> _Call[RemovedLimit]:
        # A repeat after a lost answer says `removed: false`, and changes nothing.
        return _Call("DELETE", _limit_path(scope, target), _model(RemovedLimit))

    @staticmethod
    def dlq(exec_name: str | None, limit: int) -> _Call[list[Job]]:
        params: dict[str, Any] = {"limit": limit}
        if exec_name is not None:
            params["exec"] = exec_name
        return _Call("GET", "/v1/dlq", _job_list, params=params)

    @staticmethod
    def redrive(job_id: str) -> _Call[Job]:
        return _Call("POST", f"/v1/dlq/{_quote(job_id)}/redrive", _model(Job), idempotent=False)

    @staticmethod
    def queues() -> _Call[list[QueueStats]]:
        return _Call("GET", "/v1/queues", _models(QueueStats, "queues"))

    @staticmethod
    def workers() -> _Call[list[WorkerInfo]]:
        return _Call("GET", "/v1/workers", _models(WorkerInfo, "workers"))

    @staticmethod
    def leader() -> _Call[LeaderInfo]:
        return _Call("GET", "/v1/leader", _model(LeaderInfo))


def _limit_path(scope: str, target: str) -> str:
    # The target is the path's rest: a key may hold `/`, encoded as any other character; a
    # key `.` or `..` is encoded too, or the URL's dot segments would be resolved away.
    quoted = _quote(target)
    if quoted in (".", ".."):
        quoted = quoted.replace(".", "%2E")
    return f"/v1/limits/{_quote(scope)}/{quoted}"


def _limit_body(
    max_inflight: int | None, rate: float | None, burst: int | None, reason: str
) -> dict[str, Any]:
    body: dict[str, Any] = {"max_inflight": max_inflight, "rate": rate, "burst": burst}
    body = {name: value for name, value in body.items() if value is not None}
    if not body:
        raise ValueError("give max_inflight, rate, or both")
    if reason:
        body["reason"] = reason
    return body


def _quote(job_id: str) -> str:
    # Ids are free text: a `/` or `?` in one must not change the path.
    return quote(job_id, safe="")


def _check_batch_size(batch_size: int) -> None:
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch_size must be in [1, {MAX_BATCH}], got {batch_size}")


VISIBILITY_GRACE_S = 5.0
"""How long `wait` treats an unknown id as "accepted, not consumed by the leader yet"."""


class _Waiting:
    """The long-poll steps of one `wait`."""

    def __init__(self, job_id: str, timeout_s: float | None, poll_s: float) -> None:
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.deadline = None if timeout_s is None else self.started + timeout_s
        self.poll_s = max(0.0, min(poll_s, MAX_WAIT_PER_REQUEST_S))

    def step(self) -> float:
        """How long the next request long-polls."""
        if self.deadline is None:
            return self.poll_s
        return max(0.0, min(self.poll_s, self.deadline - time.monotonic()))

    def finished(self, job: Job) -> bool:
        """True when `job` is terminal; raises WaitTimeout once the time is up."""
        if job.terminal:
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise WaitTimeout(job, self.timeout_s or 0.0)
        return False

    def not_found(self, missing: NotFound) -> float:
        """The pause before asking again about a job not visible yet, or raise `missing`."""
        now = time.monotonic()
        if now - self.started >= VISIBILITY_GRACE_S or (
            self.deadline is not None and now >= self.deadline
        ):
            raise missing
        return 0.05


# --- the sync client ------------------------------------------------------------------------


class Client(_Base):
    """The synchronous client. Use as a context manager, or call `close()`.

    `urls`: node base URLs (a list or a comma-separated string); `api_key`: a bearer key;
    `request_timeout_s`: one HTTP request; `retry_timeout_s`: the total time one call may
    spend retrying on other nodes or waiting for a leader; `fail_fast`: raise `Unreachable`
    at once when every node refuses the connection (see the module's doc);
    `max_submits_in_flight`: with this many `submit` requests on their way, the next
    concurrent `submit` calls share one batch request (each still gets its own answer;
    None: one request a call)."""

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        api_key: str | None = None,
        *,
        request_timeout_s: float = 30.0,
        retry_timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        fail_fast: bool = False,
        max_submits_in_flight: int | None = DEFAULT_SUBMITS_IN_FLIGHT,
    ) -> None:
        super().__init__(urls, api_key, request_timeout_s, retry_timeout_s, backoff, fail_fast)
        self._transport: SyncHTTP = SyncTransport()
        self._gathered: ThreadGatherer[Accepted] | None = None
        if max_submits_in_flight is not None:
            self._gathered = ThreadGatherer(
                lambda body: self._run(_Calls.submit(body)),
                lambda bodies: self._run(_Calls.submit_batch(bodies)),
                max_submits_in_flight,
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    def _run(self, call: _Call[T]) -> T:
        tries = self._tries()
        while True:
            url = self.router.current
            target, headers, body = self._request(call, url)
            answer: Answer | TransportError
            try:
                answer = self._transport.request(
                    call.method, target, headers=headers, body=body, timeout_s=self._timeout(call)
                )
            except TransportError as error:
                answer = error
            outcome = self._outcome(call, url, tries, answer)
            if isinstance(outcome, _Done):
                return outcome.value
            time.sleep(outcome)

    def submit(
        self,
        exec: str,
        payload: Any = None,
        *,
        id: str | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
        delay_s: float = 0.0,
        client_id: str | None = None,
        retry: Mapping[str, float] | None = None,
        expires_at: float | None = None,
        ttl_s: float | None = None,
        max_run_s: float | None = None,
        key: str | None = None,
    ) -> Accepted:
        """Submit one job; answered once the dispatcher's log holds it. The same `id` again
        answers the existing job (`existing=True`). `retry` sets the job's own delays
        between attempts (`{"delay_s": 5, "multiplier": 2, "max_delay_s": 600, "jitter":
        0.2}`, any of them); `ttl_s` or `expires_at` the time after which it must not start
        (it ends `expired`); `max_run_s` the hard time limit of each attempt (stopped past
        it, heartbeats or not); `key` its concurrency key (`account:42`), which the key
        limits in force apply to."""
        submission = submission_of(
            {"exec": exec, "payload": payload, "id": id, "max_attempts": max_attempts,
             "timeout_s": timeout_s, "priority": priority, "delay_s": delay_s,
             "client_id": client_id, "retry": None if retry is None else dict(retry),
             "expires_at": expires_at, "ttl_s": ttl_s, "max_run_s": max_run_s, "key": key}
        )  # fmt: skip
        if self._gathered is not None:
            return self._gathered.submit(submission.to_body())
        return self._run(_Calls.submit(submission.to_body()))

    def submit_many(
        self,
        jobs: Iterable[Submission | Mapping[str, Any]],
        *,
        batch_size: int = MAX_BATCH,
        on_batch: Callable[[list[Accepted]], None] | None = None,
    ) -> list[Accepted]:
        """Submit many jobs in `POST /v1/jobs:batch` requests of at most `batch_size`;
        `on_batch` is told each batch's answers as they come (progress bars)."""
        _check_batch_size(batch_size)
        accepted: list[Accepted] = []
        for chunk in _chunks(_submission(jobs), batch_size):
            answers = self._run(_Calls.submit_batch(chunk))
            accepted += answers
            if on_batch is not None:
                on_batch(answers)
        return accepted

    def get(self, id: str) -> Job:
        return self._run(_Calls.get(id))

    def wait(self, id: str, timeout_s: float | None = None, *, poll_s: float = 30.0) -> Job:
        """Long-poll until the job is terminal; `WaitTimeout` (with the last state) after
        `timeout_s` (None: no limit). A job accepted a moment ago may not be visible yet
        (the leader consumes submissions from Kafka): `NotFound` is raised only if the id
        stays unknown for `VISIBILITY_GRACE_S`."""
        waiting = _Waiting(id, timeout_s, poll_s)
        while True:
            step = waiting.step()
            try:
                job = self._run(_Calls.get(id, step, timeout_s=step + self.request_timeout_s))
            except NotFound as missing:
                time.sleep(waiting.not_found(missing))
                continue
            if waiting.finished(job):
                return job

    def cancel(self, id: str, *, reason: str | None = None) -> Job:
        """Cancel a job: a queued one ends `cancelled` at once; a running one is `cancelling`
        (its worker is told to stop; `cancelled` once it did, or after the leader's grace).
        `Conflict` `not_cancellable` once it ended. `reason` becomes the job's `error`."""
        return self._run(_Calls.cancel(id, reason))

    def cancel_many(
        self,
        *,
        exec: str | None = None,
        client_id: str | None = None,
        status: str = "queued",
        limit: int | None = None,
        reason: str | None = None,
    ) -> dict[str, int]:
        """Cancel every job matching `exec` (a pattern, `image.*`), `client_id` and `status`
        (`queued`, `running` or `any`), at most `limit` (admin). Answers
        `{"cancelled": n, "cancelling": m}` (running jobs told to stop)."""
        body = _cancel_many_body(exec, client_id, status, limit, reason)
        return self._run(_Calls.cancel_many(body))

    def pauses(self) -> list[Pause]:
        """The pauses in force, oldest first (admin)."""
        return self._run(_Calls.pauses())

    def pause(self, scope: str, target: str, *, reason: str | None = None) -> list[Pause]:
        """Pause an exec pattern (`scope="exec"`, `image.*`) or a client (`"client"`):
        nothing new of theirs starts until `resume`; running jobs go on (admin). Answers the
        pauses in force."""
        return self._run(_Calls.pause(scope, target, reason))

    def resume(self, scope: str, target: str) -> list[Pause]:
        """End exactly that pause; what it held starts at once (admin)."""
        return self._run(_Calls.resume(scope, target))

    def limits(self) -> list[Limit]:
        """Every limit in force, runtime and settings' ones, with what each counts running
        and holds back now (admin)."""
        return self._run(_Calls.limits())

    def limit(self, scope: str, target: str) -> Limit:
        """The limit in force for exactly this scope and target (admin; `NotFound` if
        none)."""
        return self._run(_Calls.limit(scope, target))

    def set_limit(
        self,
        scope: str,
        target: str,
        *,
        max_inflight: int | None = None,
        rate: float | None = None,
        burst: int | None = None,
        reason: str = "",
    ) -> Limit:
        """Limit a client (`scope="client"`, a client id), an exec pattern (`"exec"`,
        `image.>`: one budget for every exec it matches) or a concurrency key (`"key"`,
        `account:42`, or `account:*`: a budget for each key) to `max_inflight` jobs running
        at once and/or `rate` starts a second (a bucket of `burst`). It replaces the limit of
        the same scope and target, the settings' one too (admin). Answers the limit in
        force; `Invalid` names a refused field."""
        body = _limit_body(max_inflight, rate, burst, reason)
        return self._run(_Calls.set_limit(scope, target, body))

    def remove_limit(self, scope: str, target: str) -> RemovedLimit:
        """Remove the runtime limit of this scope and target; the settings' one applies
        again (`RemovedLimit.limit`), and what it held starts (admin)."""
        return self._run(_Calls.remove_limit(scope, target))

    def dlq(self, exec: str | None = None, limit: int = 100) -> list[Job]:
        """Dead-lettered jobs, oldest first (admin)."""
        return self._run(_Calls.dlq(exec, limit))

    def redrive(self, id: str) -> Job:
        """Requeue a dead job with its attempts reset (admin; `Conflict` `not_dead`)."""
        return self._run(_Calls.redrive(id))

    def queues(self) -> list[QueueStats]:
        return self._run(_Calls.queues())

    def workers(self) -> list[WorkerInfo]:
        return self._run(_Calls.workers())

    def leader(self) -> LeaderInfo:
        return self._run(_Calls.leader())


# --- the async client -----------------------------------------------------------------------


class AsyncClient(_Base):
    """The asyncio client: the same calls as `Client`, awaited, plus the pushed results
    stream (`results()`) and the worker calls the worker SDK uses (`poll`, `ack`, `fail`,
    `heartbeat`, `open_stream`)."""

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        api_key: str | None = None,
        *,
        request_timeout_s: float = 30.0,
        retry_timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        fail_fast: bool = False,
        max_submits_in_flight: int | None = DEFAULT_SUBMITS_IN_FLIGHT,
    ) -> None:
        super().__init__(urls, api_key, request_timeout_s, retry_timeout_s, backoff, fail_fast)
        # aiohttp's session is made on the first request, inside the running loop.
        self._transport: AsyncHTTP = AsyncTransport()
        self._gathered: AsyncGatherer[Accepted] | None = None
        if max_submits_in_flight is not None:
            self._gathered = AsyncGatherer(
                lambda body: self._run(_Calls.submit(body)),
                lambda bodies: self._run(_Calls.submit_batch(bodies)),
                max_submits_in_flight,
            )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def _run(self, call: _Call[T], tries: _Tries | None = None) -> T:
        tries = tries or self._tries()
        while True:
            url = self.router.current
            target, headers, body = self._request(call, url)
            answer: Answer | TransportError
            try:
                answer = await self._transport.request(
                    call.method, target, headers=headers, body=body, timeout_s=self._timeout(call)
                )
            except TransportError as error:
                answer = error
            outcome = self._outcome(call, url, tries, answer)
            if isinstance(outcome, _Done):
                return outcome.value
            await asyncio.sleep(outcome)

    async def submit(
        self,
        exec: str,
        payload: Any = None,
        *,
        id: str | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
        delay_s: float = 0.0,
        client_id: str | None = None,
        retry: Mapping[str, float] | None = None,
        expires_at: float | None = None,
        ttl_s: float | None = None,
        max_run_s: float | None = None,
        key: str | None = None,
    ) -> Accepted:
        """Submit one job (see `Client.submit`)."""
        submission = submission_of(
            {"exec": exec, "payload": payload, "id": id, "max_attempts": max_attempts,
             "timeout_s": timeout_s, "priority": priority, "delay_s": delay_s,
             "client_id": client_id, "retry": None if retry is None else dict(retry),
             "expires_at": expires_at, "ttl_s": ttl_s, "max_run_s": max_run_s, "key": key}
        )  # fmt: skip
        if self._gathered is not None:
            return await self._gathered.submit(submission.to_body())
        return await self._run(_Calls.submit(submission.to_body()))

    async def submit_many(
        self,
        jobs: Iterable[Submission | Mapping[str, Any]],
        *,
        batch_size: int = MAX_BATCH,
        on_batch: Callable[[list[Accepted]], None] | None = None,
    ) -> list[Accepted]:
        """Submit many jobs in batches (see `Client.submit_many`)."""
        _check_batch_size(batch_size)
        accepted: list[Accepted] = []
        for chunk in _chunks(_submission(jobs), batch_size):
            answers = await self._run(_Calls.submit_batch(chunk))
            accepted += answers
            if on_batch is not None:
                on_batch(answers)
        return accepted

    async def get(self, id: str) -> Job:
        return await self._run(_Calls.get(id))

    async def wait(self, id: str, timeout_s: float | None = None, *, poll_s: float = 30.0) -> Job:
        """Long-poll until the job is terminal (see `Client.wait`)."""
        waiting = _Waiting(id, timeout_s, poll_s)
        while True:
            step = waiting.step()
            try:
                job = await self._run(_Calls.get(id, step, timeout_s=step + self.request_timeout_s))
            except NotFound as missing:
                await asyncio.sleep(waiting.not_found(missing))
                continue
            if waiting.finished(job):
                return job

    async def cancel(self, id: str, *, reason: str | None = None) -> Job:
        """Cancel a job (see `Client.cancel`)."""
        return await self._run(_Calls.cancel(id, reason))

    async def cancel_many(
        self,
        *,
        exec: str | None = None,
        client_id: str | None = None,
        status: str = "queued",
        limit: int | None = None,
        reason: str | None = None,
    ) -> dict[str, int]:
        """Cancel matching jobs (admin; see `Client.cancel_many`)."""
        body = _cancel_many_body(exec, client_id, status, limit, reason)
        return await self._run(_Calls.cancel_many(body))

    async def pauses(self) -> list[Pause]:
        return await self._run(_Calls.pauses())

    async def pause(self, scope: str, target: str, *, reason: str | None = None) -> list[Pause]:
        """Pause an exec pattern or a client (admin; see `Client.pause`)."""
        return await self._run(_Calls.pause(scope, target, reason))

    async def resume(self, scope: str, target: str) -> list[Pause]:
        return await self._run(_Calls.resume(scope, target))

    async def limits(self) -> list[Limit]:
        """Every limit in force (admin; see `Client.limits`)."""
        return await self._run(_Calls.limits())

    async def limit(self, scope: str, target: str) -> Limit:
        return await self._run(_Calls.limit(scope, target))

    async def set_limit(
        self,
        scope: str,
        target: str,
        *,
        max_inflight: int | None = None,
        rate: float | None = None,
        burst: int | None = None,
        reason: str = "",
    ) -> Limit:
        """Set a runtime limit (admin; see `Client.set_limit`)."""
        body = _limit_body(max_inflight, rate, burst, reason)
        return await self._run(_Calls.set_limit(scope, target, body))

    async def remove_limit(self, scope: str, target: str) -> RemovedLimit:
        return await self._run(_Calls.remove_limit(scope, target))

    async def dlq(self, exec: str | None = None, limit: int = 100) -> list[Job]:
        return await self._run(_Calls.dlq(exec, limit))

    async def redrive(self, id: str) -> Job:
        return await self._run(_Calls.redrive(id))

    async def queues(self) -> list[QueueStats]:
        return await self._run(_Calls.queues())

    async def workers(self) -> list[WorkerInfo]:
        return await self._run(_Calls.workers())

    async def leader(self) -> LeaderInfo:
        return await self._run(_Calls.leader())

    def results(self, *, on_progress: ProgressCallback | None = None) -> ResultStream:
        """The results of this client's jobs, pushed as they end (`WS /v1/stream`).

        Use `async with client.results() as results:` (connected on entry, so no result
        of a job submitted inside the block is missed), then `async for job in results`.
        The stream reconnects after a lost connection, but results that end meanwhile are
        not replayed: `get` or `wait` is the reliable way to learn one job's outcome.

        `on_progress` is called (awaited, if it returns an awaitable) with each progress
        report of a running job (`JobProgress`) the stream brings while it is iterated;
        without it, reports are skipped."""
        return ResultStream(self, on_progress)

    # --- worker calls (REST transport of the worker SDK) --------------------------------------

    async def poll(
        self,
        worker_id: str,
        subjects: Sequence[str],
        credits: int,
        wait_s: float,
        *,
        fail_fast: bool | None = None,
    ) -> list[dict[str, Any]]:
        """`POST /v1/workers/{id}/poll`: say "room for `credits`", get assignments.
        `fail_fast` overrides the client's for this call."""
        polled = await self.poll_term(worker_id, subjects, credits, wait_s, fail_fast=fail_fast)
        return polled.assignments

    async def poll_term(
        self,
        worker_id: str,
        subjects: Sequence[str],
        credits: int,
        wait_s: float,
        *,
        held: Sequence[tuple[str, int, str]] | None = None,
        epoch: int | None = None,
        fail_fast: bool | None = None,
    ) -> Polled:
        """`poll`, saying which attempts the worker holds (`held`: id, attempt, lease) and
        the leader epoch of its previous poll's answer: a leader of another epoch (a new
        term, or the worker's first poll) requeues at once what the worker does not hold.
        The answer carries the epoch to send next time."""
        body: dict[str, Any] = {"subjects": list(subjects), "credits": credits, "wait_s": wait_s}
        if held is not None:
            body["held"] = [{"id": i, "attempt": a, "lease": lease} for i, a, lease in held]
            body["epoch"] = epoch
        call: _Call[Polled] = _Call(
            "POST", f"/v1/workers/{_quote(worker_id)}/poll", _polled, body=body,
            timeout_s=wait_s + self.request_timeout_s,
        )  # fmt: skip
        return await self._run(call, self._tries(fail_fast))

    async def ack(
        self, job_id: str, attempt: int, lease: str, result: Any, worker_id: str | None = None
    ) -> str | None:
        """Settle an attempt as succeeded; the job's status. A repeat answers the same."""
        body = {"attempt": attempt, "lease": lease, "result": result, "worker_id": worker_id}
        return await self._settle("ack", job_id, body)

    async def fail(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        error: str,
        *,
        retryable: bool = True,
        worker_id: str | None = None,
        retry_after_s: float | None = None,
    ) -> str | None:
        """Settle an attempt as failed: retried later if `retryable` (after `retry_after_s`
        when given, else the job's retry delay), else dead at once."""
        body: dict[str, Any] = {"attempt": attempt, "lease": lease, "error": error,
                                "retryable": retryable, "worker_id": worker_id}  # fmt: skip
        if retry_after_s is not None:
            body["retry_after_s"] = retry_after_s
        return await self._settle("fail", job_id, body)

    async def heartbeat(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        worker_id: str | None = None,
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> float:
        """Still working: the new deadline (the server's clock, epoch seconds). `progress`
        (`{done, total?, message?}`) reports how far the attempt got; the leader keeps at
        most one report a second per job (a sooner one is dropped, the heartbeat applies)."""
        beat = await self.heartbeat_answer(job_id, attempt, lease, worker_id, progress=progress)
        return beat.deadline

    async def heartbeat_answer(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        worker_id: str | None = None,
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> Heartbeat:
        """`heartbeat`, answering also whether the worker must stop the attempt (its job
        was cancelled: `cancel == "cancel_requested"`). A `Conflict` or `NotFound` says the
        attempt is no longer the worker's."""
        body: dict[str, Any] = {"attempt": attempt, "lease": lease, "worker_id": worker_id}
        if progress is not None:  # left out otherwise: an older server refuses the field
            body["progress"] = dict(progress)
        call: _Call[Heartbeat] = _Call(
            "POST", f"/v1/jobs/{_quote(job_id)}/heartbeat", _heartbeat, body=body
        )
        return await self._run(call)

    async def _settle(self, kind: str, job_id: str, body: dict[str, Any]) -> str | None:
        call: _Call[str | None] = _Call(
            "POST", f"/v1/jobs/{_quote(job_id)}/{kind}",
            lambda response: response.json().get("status"), body=body,
        )  # fmt: skip
        return await self._run(call)

    async def open_stream(
        self, hello: dict[str, Any], *, open_timeout_s: float = 10.0, fail_fast: bool | None = None
    ) -> tuple[ClientConnection, dict[str, Any]]:
        """Open `WS /v1/stream` on the leader, say `hello`, and return the socket and the
        server's `welcome`. Fails over like REST calls (a 307 at the handshake, or a close
        with 1013 "try again later", moves on); an `error` answer to the hello raises its
        typed error (`Unauthorized`, `Forbidden`, `Invalid`). `fail_fast` overrides the
        client's for this call."""
        tries = self._tries(fail_fast)
        while True:
            url = self.router.current
            outcome = await self._try_stream(url, hello, open_timeout_s, tries)
            if isinstance(outcome, _Done):
                return outcome.value
            await asyncio.sleep(outcome)

    async def _try_stream(
        self, url: str, hello: dict[str, Any], open_timeout_s: float, tries: _Tries
    ) -> _Done[tuple[ClientConnection, dict[str, Any]]] | float:
        try:
            socket = await _ConnectWithoutRedirects(
                stream_url(url), additional_headers=self.headers, proxy=None,
                open_timeout=open_timeout_s, max_queue=None, compression=None,
                max_size=STREAM_MAX_MESSAGE_BYTES,
            )  # fmt: skip
        except InvalidStatus as refused:
            tries.answered = True
            response = refused.response
            leader = None
            if response.status_code == 307:
                leader = _origin(response.headers.get("Location")) or _leader_in(response.body)
            if leader is not None and tries.redirects < MAX_REDIRECTS_IN_A_ROW:
                tries.redirects += 1
                self.router.redirect(leader)
                return 0.0
            if response.status_code in (307, 503):
                self.router.failed(url)
                return tries.pause(_unavailable(url, f"HTTP {response.status_code}"))
            body = _json_or_none(response.body)
            raise error_from_body(response.status_code, body, _text(response.body)) from refused
        except InvalidURI as error:
            raise BadRequest(str(error), error="invalid_url") from error
        except (OSError, TimeoutError, InvalidHandshake) as error:
            # TimeoutError is an OSError: a node too slow to answer is not a refusal.
            if isinstance(error, OSError) and not isinstance(error, TimeoutError):
                tries.unreachable(url, str(error) or type(error).__name__, self.router.urls)
            self.router.failed(url)
            return tries.pause(_unavailable(url, error))
        tries.answered = True
        try:
            await socket.send(json.dumps(hello))
            first = json.loads(await asyncio.wait_for(socket.recv(), open_timeout_s))
        except (ConnectionClosed, TimeoutError, ValueError) as error:
            await socket.close()
            self.router.failed(url)
            return tries.pause(_unavailable(url, error))
        if isinstance(first, dict) and first.get("type") == "welcome":
            return _Done((socket, first))
        await socket.close()
        answer = error_from_body(None, first)
        if isinstance(answer, Unavailable):
            leader = first.get("leader") if isinstance(first, dict) else None
            if isinstance(leader, str) and leader and tries.redirects < MAX_REDIRECTS_IN_A_ROW:
                tries.redirects += 1
                self.router.redirect(leader)
                return 0.0
            self.router.failed(url)
            return tries.pause(answer)
        raise answer


class _ConnectWithoutRedirects(connect):
    """websockets' `connect`, leaving redirects to `open_stream`: it would follow a 307 to
    an `http://` Location (which it refuses), and the router must learn the leader anyway."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def stream_url(base_url: str) -> str:
    """`http://host:port` → `ws://host:port/v1/stream` (https → wss)."""
    scheme, _, rest = base_url.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{STREAM_PATH}"


def _json_or_none(body: bytes | bytearray | None) -> Any:
    try:
        return json.loads(body or b"")
    except ValueError:
        return None


def _text(body: bytes | bytearray | None) -> str:
    return bytes(body or b"").decode("utf-8", "replace")


def _leader_in(body: bytes | bytearray | None) -> str | None:
    data = _json_or_none(body)
    leader = data.get("leader") if isinstance(data, dict) else None
    return leader if isinstance(leader, str) and leader else None


class ResultStream:
    """Results of the client's jobs, pushed over `WS /v1/stream` (see `AsyncClient.results`)."""

    def __init__(self, client: AsyncClient, on_progress: ProgressCallback | None = None) -> None:
        self._client = client
        self._on_progress = on_progress
        self._socket: ClientConnection | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Job]:
        return self

    async def connect(self) -> None:
        """Connect now (the first `__anext__` does it otherwise)."""
        if self._socket is None:
            self._socket, _ = await self._client.open_stream({"type": "hello", "role": "client"})

    async def __anext__(self) -> Job:
        while not self._closed:
            await self.connect()
            assert self._socket is not None
            try:
                message = json.loads(await self._socket.recv())
            except ConnectionClosed:
                # The node went away: reconnect (the router moves on), within the budget.
                self._client.router.failed(self._client.router.current)
                self._socket = None
                continue
            if isinstance(message, dict) and message.get("type") == "result":
                return Job.model_validate(message)
            if isinstance(message, dict) and message.get("type") == "progress":
                await self._progress(message)
                continue
            if isinstance(message, dict) and message.get("type") == "error":
                raise error_from_body(None, message)
        raise StopAsyncIteration

    async def _progress(self, message: dict[str, Any]) -> None:
        if self._on_progress is None:
            return
        try:
            report = JobProgress.from_message(message)
        except ValidationError:
            return  # not a report this SDK can read: skipped, as any unknown message
        called = self._on_progress(report)
        if inspect.isawaitable(called):
            await called

    async def aclose(self) -> None:
        self._closed = True
        if self._socket is not None:
            await self._socket.close()
            self._socket = None
