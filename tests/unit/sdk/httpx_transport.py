"""The SDK's transports (`dispatch.http_transport`) on an httpx transport, for the tests: an
`httpx.MockTransport` (a function answers) or an `httpx.ASGITransport` (an app in this
process answers, no sockets). httpx is a dev dependency, not the SDK's.

    client._transport = HttpxTransport(httpx.MockTransport(node))
    client._transport = AsyncHttpxTransport(httpx.ASGITransport(app=app))

httpx's errors become `TransportError`s as the SDK classified them when it was built on
httpx: a connect error, a connect or pool timeout and an unsupported protocol were not
sent; a connect error and an unsupported protocol were refused connections."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from dispatch.http_transport import Answer, Headers, TransportError

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
_REFUSED = (httpx.ConnectError, httpx.UnsupportedProtocol)


def transport_error(error: httpx.TransportError) -> TransportError:
    """The SDK's error for one of httpx's."""
    return TransportError(
        type(error).__name__,
        str(error),
        may_have_been_sent=not isinstance(error, _NOT_SENT),
        refused=isinstance(error, _REFUSED),
    )


def answer_of(response: httpx.Response) -> Answer:
    """The SDK's answer for one of httpx's (read in full)."""
    return Answer(response.status_code, Headers(response.headers.multi_items()), response.content)


class HttpxTransport:
    """`SyncHTTP` on an httpx transport."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self.http = httpx.Client(transport=transport, follow_redirects=False)

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        try:
            response = self.http.request(
                method, url, headers=dict(headers), content=body, timeout=timeout_s
            )
        except httpx.TransportError as error:
            raise transport_error(error) from error
        return answer_of(response)

    def close(self) -> None:
        self.http.close()


class AsyncHttpxTransport:
    """`AsyncHTTP` on an httpx async transport."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.http = httpx.AsyncClient(transport=transport, follow_redirects=False)

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        try:
            response = await self.http.request(
                method, url, headers=dict(headers), content=body, timeout=timeout_s
            )
        except httpx.TransportError as error:
            raise transport_error(error) from error
        return answer_of(response)

    async def aclose(self) -> None:
        await self.http.aclose()
