"""A real S3-compatible server on loopback for tests and benchmarks: S3Proxy, filesystem backend.

Why S3Proxy (docs/deployment.md, "Object storage"): its filesystem backend publishes a PUT
with `If-None-Match: *` by link(2), which fails when the key exists, so of any number of
concurrent creators of a key exactly one gets 200 and the rest 412: the guarantee delta-rs'
commits rely on. moto's server checks and then writes (not atomic under its threaded server)
and pins python-dateutil below 3 (this project pins 4); MinIO is AGPL.

The jar (`org.gaul:s3proxy:4.0.0:jar-with-dependencies`, Java 17) is the `s3proxy` set of
`dispatch.stack.jars` (stack/maven/s3proxy/pom.xml, pinned in stack/jars.lock, fetched by
scripts/bootstrap.sh). The server runs until `stop`, which ends it by the pid this module
started.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.settings import StorageSettings
from dispatch.stack.jars import jar_paths
from dispatch.stack.ports import free_port

BUCKET = "dispatch"
ACCESS_KEY = "dispatch-test"
SECRET_KEY = "dispatch-test-secret"
START_TIMEOUT_S = 60.0


class S3ServerError(Exception):
    """The S3 server could not be fetched or started; the message says why."""


class S3Server:
    """One S3Proxy process on 127.0.0.1 serving the bucket BUCKET from `folder`."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.data = folder / "data"
        self.log_file = folder / "s3proxy.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def settings(self, **changes: object) -> StorageSettings:
        """Storage settings that reach this server with its credentials."""
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
        (jar,) = jar_paths("s3proxy")
        java = shutil.which("java")
        if java is None:
            raise S3ServerError("java is not installed: scripts/bootstrap.sh installs it")
        # The filesystem backend's containers are directories: the bucket exists at start.
        (self.data / BUCKET).mkdir(parents=True, exist_ok=True)
        properties = self.folder / "s3proxy.conf"
        properties.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint={self.endpoint}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={ACCESS_KEY}",
                    f"s3proxy.credential={SECRET_KEY}",
                    # nio2: If-None-Match: * resolved by link(2) as the object is published.
                    "jclouds.provider=filesystem-nio2",
                    f"jclouds.filesystem.basedir={self.data}",
                    "",
                ]
            )
        )
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [java, "-Xmx256m", "-jar", str(jar), "--properties", str(properties)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its own session: a Ctrl-C meant for pytest does not reach it first.
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise S3ServerError(
                    f"s3proxy exited with {self._process.returncode}: see {self.log_file}"
                )
            try:
                with urllib.request.urlopen(self.endpoint, timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # an S3 error answer (403: unsigned request) is an answering server
            except OSError:
                time.sleep(0.1)
        raise S3ServerError(f"s3proxy did not answer on {self.endpoint} in {START_TIMEOUT_S:g} s")

    def stop(self) -> None:
        """End the server by its pid (SIGTERM, then SIGKILL after 10 s)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


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
