"""Run one API node with uvicorn (`dispatch serve`), and the limits its HTTP server enforces
before the application sees a request: header size, WebSocket message size, and no query
string (where a key may travel) in the logs."""

from __future__ import annotations

import faulthandler
import gc
import logging
import re
import signal
from typing import Any, TypeGuard

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from dispatch.api.app import create_app
from dispatch.api.node import Node
from dispatch.auth import KeyRing
from dispatch.settings import Settings
from dispatch.submit_records import ENVELOPE_BYTES

GC_THRESHOLDS = (10_000, 3, 100)
"""The node's cyclic-collector thresholds. A pause of the collector is a pause of every
request and of the leader's loop, so what matters is each pause's length, not their total:
a young generation of 10k objects is quick to scan, and so is the middle one, emptied every
third young collection. At (100_000, 50, 100), tuned for throughput, each young collection was
a pause every second or two under load, most of submit→assign's p99; at (10_000, 10, 100)
each middle one was long (the figures: BENCHMARKS.md, *End to end*).
CPython's defaults (700, 10, 10) rescan the long-lived jobs held in the old generation far
too often. The rebuild pauses the collector and freezes what it built
(`dispatch.api.leader.collector_paused`), whatever these are."""

MAX_HEADER_BYTES = 16 * 1024
"""The request line and headers of one request, together (Node.js's default). A key is 43
characters; a larger head is refused with 431 before anything reads it."""

_LOGGERS_WITH_PATHS = ("uvicorn.access", "uvicorn.error")
"""uvicorn logs request paths with their query string: HTTP requests on the access logger,
WebSocket handshakes on the error logger."""


def ws_max_size(settings: Settings) -> int:
    """The largest WebSocket message a node reads: what an HTTP body may be (a payload or
    a result of `api.max_payload_bytes`, plus the envelope around it). A larger message
    closes that socket with 1009 (message too big), and nothing else."""
    return settings.api.max_payload_bytes + ENVELOPE_BYTES


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a request whose line and headers exceed
    `MAX_HEADER_BYTES` with 431 (llhttp sets no limit of its own). Checked exactly once the
    head is parsed, and while it is still arriving (so a head that never ends is not
    buffered without bound: the count then includes the chunk's bytes after the head
    began, an overestimate by at most one read).

    After the 431 the connection is half-closed and what the client still sends is read
    and dropped for up to LINGER_S: closing at once, with its data unread, would reset the
    connection, and the client would likely never read the answer."""

    LINGER_S = 2.0
    _head_open = False
    _head_bytes = 0
    _head_too_large = False
    _refusing = False

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            return
        super().data_received(data)
        if self._head_open and not self._refusing and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_open = False
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > MAX_HEADER_BYTES:
            # httptools turns an error in a callback into a parser error, which uvicorn
            # answers with send_400_response: below, that answer becomes the 431.
            self._head_too_large = True
            raise _HeadTooLarge
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._head_too_large:
            self._refuse_head()
        else:
            super().send_400_response(msg)

    def _refuse_head(self) -> None:
        self._head_open = False
        self._refusing = True
        body = f"request line and headers over {MAX_HEADER_BYTES} bytes".encode()
        self.logger.warning("Refused a request: its headers are over %d bytes.", MAX_HEADER_BYTES)
        transport = self.transport
        transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n"
            b"connection: close\r\n\r\n" + body
        )
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(self.LINGER_S, transport.close)
        else:
            transport.close()


class _HeadTooLarge(Exception):
    pass


class LingeringWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, closing a socket that broke the protocol (a
    message over `ws_max_size`: 1009) as BoundedHeadProtocol closes a refused request: the
    close frame, a half-close, then what the client still sends is read and dropped for up
    to LINGER_S. uvicorn closed at once, with the rest of the oversized message unread, so
    the connection was reset and the client never saw the close code."""

    LINGER_S = 2.0
    _failed = False

    def data_received(self, data: bytes) -> None:
        if self._failed:
            return
        super().data_received(data)

    def handle_parser_exception(self) -> None:
        close = self.conn.close_sent
        assert close is not None
        self.queue.put_nowait(
            {"type": "websocket.disconnect", "code": close.code, "reason": close.reason}
        )
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self._failed = True
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(self.LINGER_S, transport.close)
        else:
            transport.close()


_QUERY_VALUE = re.compile(r"=[^&\s]*")


def scrub_path(path: str) -> str:
    """A logged path with every query value masked: `/v1/stream?key=abc` →
    `/v1/stream?key=***`. A key sent as a query parameter never reaches a log."""
    base, mark, query = path.partition("?")
    if not mark:
        return path
    return f"{base}?{_QUERY_VALUE.sub('=***', query)}"


class ScrubQueryStrings(logging.Filter):
    """Masks the query values of any path (a str argument starting with `/`) in a log
    record's arguments; uvicorn passes the path with its query string as one argument."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_is_path(arg) for arg in args):
            record.args = tuple(scrub_path(arg) if _is_path(arg) else arg for arg in args)
        return True


def _is_path(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and value.startswith("/") and "?" in value


def scrub_uvicorn_logs() -> None:
    """Install `ScrubQueryStrings` on uvicorn's loggers (once)."""
    for name in _LOGGERS_WITH_PATHS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, ScrubQueryStrings) for existing in logger.filters):
            logger.addFilter(ScrubQueryStrings())


def uvicorn_config(
    app: Any, settings: Settings, host: str, port: int, *, log_level: str = "info"
) -> uvicorn.Config:
    """How every node runs under uvicorn, with the limits above."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on",
        # A line per request was a large share of the submit path's CPU (BENCHMARKS.md, *The
        # submit path*): off unless `api.access_log` asks for it.
        access_log=settings.api.access_log,
        http=BoundedHeadProtocol, ws=LingeringWebSocketProtocol,
        ws_max_size=ws_max_size(settings),
        # Job messages are small JSON: compressing each costs more CPU than it saves on
        # loopback or a LAN.
        ws_per_message_deflate=False,
    )  # fmt: skip
    # After the Config: creating it (re)configures uvicorn's loggers.
    scrub_uvicorn_logs()
    return config


def serve(settings: Settings, port: int, node_id: str | None = None) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # kafka-python logs every connection at INFO: only its warnings matter here.
    logging.getLogger("kafka").setLevel(logging.WARNING)
    # `kill -USR1 <pid>` writes every thread's stack to the node's stderr (its log): what a
    # stalled loop is waiting on, without stopping the node.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    host = settings.api.host
    # What clients are sent to (307s, the lease row): set api.advertise_url when host:port is
    # not how others reach this node (0.0.0.0 in a container, a proxy).
    address = settings.api.advertise_url or f"http://{host}:{port}"
    node = Node(settings, node_id or f"node-{port}", address)
    app = create_app(settings, node, KeyRing.load(settings.auth.keys_file))
    uvicorn.Server(uvicorn_config(app, settings, host, port)).run()
