"""The SDK's HTTP seam: one request in, an `Answer` or a `TransportError` out.

`dispatch.client` decides what to send and what an answer means (retries, redirects,
failover); a transport only moves bytes. Two transports are the SDK's own:

- `SyncTransport` (for `Client`): a urllib3 `PoolManager`, thread-safe, `POOL_SIZE`
  connections kept per node, so one `Client` can be shared by many threads;
- `AsyncTransport` (for `AsyncClient`): an aiohttp `ClientSession` on a `TCPConnector` of
  `POOL_SIZE` connections, made on the first request (aiohttp sessions belong to the running
  event loop) and closed by `aclose`.

Anything with the same `request` method (`SyncHTTP`, `AsyncHTTP`) can stand in for them:
the tests run the SDK against an app in their own process through one.

A transport turns every failure to exchange a request into one `TransportError`, which says
the two things a retry decision needs: whether the request may have reached the server
(`may_have_been_sent`: false for a failed connect, a connect or pool timeout, an unusable
URL) and whether the node refused the connection (`refused`: nothing listens there, or no
such host). No redirect is followed and nothing is retried here: the client does both.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    import aiohttp

POOL_SIZE = 100
"""Connections kept per node by each client: a `Client` shared by 16 threads or an
`AsyncClient` running 64 calls at once gets a connection per call (httpx's limit, too). A
sync caller beyond it waits for a free connection within its request timeout (then a
not-sent `PoolTimeout`); an async one within its connect timeout."""
KEEPALIVE_S = 4.0
"""How long an idle connection is kept (async). Below uvicorn's 5 s, so the client drops
an idle connection before the node closes it under a request."""


class Headers(Mapping[str, str]):
    """An answer's headers, by name in any case; a repeated header's values joined by ", "."""

    __slots__ = ("_values",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        values: dict[str, str] = {}
        for name, value in items:
            key = name.lower()
            values[key] = f"{values[key]}, {value}" if key in values else value
        self._values = values

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Headers({self._values!r})"


class Answer:
    """A node's answer: `status`, `headers` (any case), the `body` bytes."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        status: int,
        headers: Headers | Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> None:
        self.status = status
        if isinstance(headers, Headers):
            self.headers = headers
        else:
            self.headers = Headers(headers.items() if isinstance(headers, Mapping) else headers)
        self.body = body

    @classmethod
    def of_json(
        cls, status: int, document: Any, headers: Mapping[str, str] | None = None
    ) -> Answer:
        """An answer whose body is `document` as JSON (what the tests' nodes answer)."""
        return cls(
            status,
            {"content-type": "application/json", **(headers or {})},
            orjson.dumps(document),
        )

    def json(self) -> Any:
        """The body as JSON; `ValueError` when it is not (orjson's error is one)."""
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"<Answer {self.status}, {len(self.body)} bytes>"


class TransportError(Exception):
    """No answer: the request could not be exchanged with the node.

    `kind` names the failure as httpx did (`ConnectError`, `ConnectTimeout`, `PoolTimeout`,
    `UnsupportedProtocol`, `ReadTimeout`, `ReadError`...); `may_have_been_sent` is false only
    when the server cannot have seen the request; `refused` is true when nothing listens
    there (a refused connection, an unknown host), as opposed to a node too slow to answer."""

    def __init__(
        self, kind: str, detail: str, *, may_have_been_sent: bool, refused: bool = False
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.may_have_been_sent = may_have_been_sent
        self.refused = refused

    @classmethod
    def connect_failed(cls, detail: str) -> TransportError:
        """The connection was refused, or the host is unknown: never sent."""
        return cls("ConnectError", detail, may_have_been_sent=False, refused=True)

    @classmethod
    def connect_timeout(cls, detail: str) -> TransportError:
        return cls("ConnectTimeout", detail, may_have_been_sent=False)

    @classmethod
    def pool_timeout(cls, detail: str) -> TransportError:
        return cls("PoolTimeout", detail, may_have_been_sent=False)

    @classmethod
    def unsupported(cls, detail: str) -> TransportError:
        return cls("UnsupportedProtocol", detail, may_have_been_sent=False, refused=True)

    @classmethod
    def read_timeout(cls, detail: str) -> TransportError:
        return cls("ReadTimeout", detail, may_have_been_sent=True)

    @classmethod
    def lost(cls, detail: str, kind: str = "ReadError") -> TransportError:
        """The connection failed once the request may have left: the answer is lost."""
        return cls(kind, detail, may_have_been_sent=True)


class SyncHTTP(Protocol):
    """What `Client` needs of a transport."""

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        """Send one request to the absolute `url`; `TransportError` when no answer came."""
        ...

    def close(self) -> None: ...


class AsyncHTTP(Protocol):
    """What `AsyncClient` needs of a transport."""

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        """Send one request to the absolute `url`; `TransportError` when no answer came."""
        ...

    async def aclose(self) -> None: ...


# --- urllib3, for `Client` --------------------------------------------------------------------


class SyncTransport:
    """`SyncHTTP` on a urllib3 `PoolManager` (thread-safe; `POOL_SIZE` connections a node,
    a caller beyond them waiting for one within its timeout)."""

    def __init__(self, pool_size: int = POOL_SIZE) -> None:
        # Imported here: `AsyncClient` alone never loads urllib3 (and `Client` never aiohttp).
        import urllib3

        self._urllib3 = urllib3
        self._pools = urllib3.PoolManager(
            maxsize=pool_size, block=True, retries=False, timeout=urllib3.Timeout(30.0)
        )

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        exceptions = self._urllib3.exceptions
        try:
            response = self._pools.urlopen(
                method, url, body=body, headers=dict(headers), redirect=False, retries=False,
                timeout=self._urllib3.Timeout(connect=timeout_s, read=timeout_s),
                pool_timeout=timeout_s, preload_content=True,
            )  # fmt: skip
        except exceptions.NewConnectionError as error:  # before ConnectTimeoutError, its base
            raise TransportError.connect_failed(str(error)) from error
        except exceptions.ConnectTimeoutError as error:
            raise TransportError.connect_timeout(str(error)) from error
        except exceptions.EmptyPoolError as error:
            raise TransportError.pool_timeout(str(error)) from error
        except exceptions.LocationValueError as error:
            raise TransportError.unsupported(str(error)) from error
        except exceptions.SSLError as error:  # the TLS handshake: httpx said ConnectError
            raise TransportError.connect_failed(str(error)) from error
        except exceptions.ReadTimeoutError as error:
            raise TransportError.read_timeout(str(error)) from error
        except (exceptions.HTTPError, OSError) as error:
            raise TransportError.lost(str(error), _lost_kind(error)) from error
        return Answer(response.status, Headers(response.headers.items()), response.data)

    def close(self) -> None:
        self._pools.clear()


def _lost_kind(error: BaseException) -> str:
    cause = error.args[1] if len(error.args) > 1 else error
    name = type(cause).__name__
    return "RemoteProtocolError" if "Disconnected" in name or "Protocol" in name else "ReadError"


# --- aiohttp, for `AsyncClient` ---------------------------------------------------------------


class AsyncTransport:
    """`AsyncHTTP` on an aiohttp `ClientSession`, made on the first request inside the
    running event loop (aiohttp sessions belong to one), closed by `aclose`."""

    def __init__(self, pool_size: int = POOL_SIZE) -> None:
        import aiohttp
        import yarl

        self._aiohttp = aiohttp
        self._yarl = yarl
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _open(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            aiohttp = self._aiohttp
            connector = aiohttp.TCPConnector(
                limit=self._pool_size, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
            )
            # No cookies (httpx kept them; no node sets one), no proxy from the environment.
            session = self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
            )
        return session

    def _timeout(self, timeout_s: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            if len(self._timeouts) > 64:  # `wait` makes one per long-poll step
                self._timeouts.clear()
            # As httpx's: each phase (the pool and the connect, each read) gets `timeout_s`.
            timeout = self._timeouts[timeout_s] = self._aiohttp.ClientTimeout(
                total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s
            )
        return timeout

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        aiohttp = self._aiohttp
        try:
            # Already encoded by the client: left as is, so an encoded `%2E%2E` path segment
            # (a job id or key `..`) is not turned back into `..` and resolved away.
            async with self._open().request(
                method, self._yarl.URL(url, encoded=True), data=body, headers=headers,
                allow_redirects=False,
                timeout=self._timeout(timeout_s),
            ) as response:  # fmt: skip
                data = await response.read()
                return Answer(response.status, Headers(response.headers.items()), data)
        except aiohttp.ClientConnectorError as error:  # refused, unknown host, TLS handshake
            raise TransportError.connect_failed(_connect_failure(error)) from error
        except aiohttp.ConnectionTimeoutError as error:  # the pool and the connect
            raise TransportError.connect_timeout(str(error) or "connect timeout") from error
        except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as error:
            raise TransportError.unsupported(str(error)) from error
        except TimeoutError as error:  # a read (aiohttp's SocketTimeoutError is one)
            raise TransportError.read_timeout(str(error) or "read timeout") from error
        except aiohttp.ServerDisconnectedError as error:
            raise TransportError.lost(str(error), "RemoteProtocolError") from error
        except (aiohttp.ClientError, OSError) as error:
            raise TransportError.lost(str(error) or type(error).__name__) from error

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _connect_failure(error: aiohttp.ClientConnectorError) -> str:
    """aiohttp's text for a refused connection names no refusal ("Connect call failed"):
    say it, as the other transports and websockets do."""
    text = str(error)
    if getattr(error, "errno", None) == errno.ECONNREFUSED and "refused" not in text.lower():
        text += " (connection refused)"
    return text


__all__ = [
    "POOL_SIZE",
    "Answer",
    "AsyncHTTP",
    "AsyncTransport",
    "Headers",
    "SyncHTTP",
    "SyncTransport",
    "TransportError",
]
