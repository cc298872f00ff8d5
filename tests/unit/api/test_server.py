"""What the node's HTTP server does before the application: no query value in its logs, and
its limits."""

from __future__ import annotations

import logging

import pytest

from dispatch.api.server import ScrubQueryStrings, scrub_path, scrub_uvicorn_logs, ws_max_size
from dispatch.settings import Settings
from dispatch.submit_records import ENVELOPE_BYTES


@pytest.mark.parametrize(
    ("path", "scrubbed"),
    [
        ("/v1/stream?key=s3cr3t", "/v1/stream?key=***"),
        ("/v1/jobs/x?wait=5&key=abc", "/v1/jobs/x?wait=***&key=***"),
        ("/v1/queues", "/v1/queues"),
        ("/v1/x?flag", "/v1/x?flag"),
        ("/v1/x?key=", "/v1/x?key=***"),
    ],
)
def test_query_values_are_masked(path: str, scrubbed: str) -> None:
    assert scrub_path(path) == scrubbed


def test_the_filter_masks_the_path_argument_of_uvicorns_records() -> None:
    access = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", "/v1/stream?key=s3cr3t", "1.1", 101), None,
    )  # fmt: skip
    assert ScrubQueryStrings().filter(access) is True
    assert access.getMessage() == '127.0.0.1:5 - "GET /v1/stream?key=*** HTTP/1.1" 101'
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "a ? b %s", ("c?d",), None)
    ScrubQueryStrings().filter(plain)
    assert plain.getMessage() == "a ? b c?d"  # not a path: left alone


def test_uvicorns_loggers_get_the_filter_once() -> None:
    scrub_uvicorn_logs()
    scrub_uvicorn_logs()
    for name in ("uvicorn.access", "uvicorn.error"):
        filters = logging.getLogger(name).filters
        assert sum(isinstance(each, ScrubQueryStrings) for each in filters) == 1


def test_a_websocket_message_may_be_as_large_as_an_http_body(settings: Settings) -> None:
    assert ws_max_size(settings) == settings.api.max_payload_bytes + ENVELOPE_BYTES
