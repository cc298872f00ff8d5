"""A real S3-compatible server on loopback for tests and benchmarks: the stack's own object
store (dispatch/stack/object_store.py, S3Proxy; why S3Proxy is said there) in a folder of its
own, on a free port, with test credentials. The server runs until `stop`, which ends it by the
pid it started.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.settings import StorageSettings, load_settings
from dispatch.stack.object_store import ObjectStore
from dispatch.stack.ports import free_port

BUCKET = "dispatch"
ACCESS_KEY = "dispatch-test"
SECRET_KEY = "dispatch-test-secret"


class S3Server:
    """One S3Proxy process on 127.0.0.1 serving the bucket BUCKET, its state under `folder`
    (a stack's `var`: objects in `data`, the log in `logs/`, the pid file in `run/`)."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        served = self.settings(serve=True, bucket=BUCKET).model_dump()
        self.store = ObjectStore(load_settings(paths={"var": str(folder)}, storage=served))
        self.data = self.store.data
        """The folder holding `BUCKET/<key>` as files."""
        self.log_file = self.store.log_file

    @property
    def pid(self) -> int | None:
        return self.store.pid

    def settings(self, **changes: object) -> StorageSettings:
        """Storage settings that reach this server with its credentials (a client's: `serve`
        stays false, the server is not the client's to run)."""
        values: dict[str, object] = {
            "endpoint_url": self.endpoint,
            "region": "us-east-1",
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
        }
        return StorageSettings.model_validate({**values, **changes})

    def uri(self, *parts: str) -> str:
        """`s3://BUCKET/part/...`."""
        return "/".join([f"s3://{BUCKET}", *parts])

    def start(self) -> None:
        self.store.start()

    def stop(self) -> None:
        """End the server by its pid (SIGTERM, then SIGKILL if it lingers)."""
        self.store.stop()


@contextlib.contextmanager
def running(folder: Path) -> Iterator[S3Server]:
    """A started server, stopped (by its pid) when the block ends, even on an error."""
    server = S3Server(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The test session's S3 server (started on first use, stopped at the session's end),
    provided to every test by tests/conftest.py.

    One per session on purpose: Spark's Hadoop caches one S3AFileSystem per bucket with the
    endpoint it was built with, so a second server of the same bucket would not be reached."""
    with running(tmp_path_factory.mktemp("s3")) as server:
        yield server
