"""The local stack's own S3-compatible server: S3Proxy with its filesystem backend, serving
`storage.bucket` at `storage.endpoint_url` from `<var>/object-store` (`storage.serve`).

Why S3Proxy (docs/deployment.md, "Object storage"): its filesystem backend publishes a PUT
with `If-None-Match: *` by link(2), which fails when the key exists, so of any number of
concurrent creators of a key exactly one gets 200 and the rest 412: the guarantee delta-rs'
commits rely on. moto's server checks and then writes (not atomic under its threaded server)
and pins python-dateutil below 3 (this project pins 4); MinIO is AGPL.

The jar (`org.gaul:s3proxy:4.0.0:jar-with-dependencies`, Java 17) is the `s3proxy` set of
`dispatch.stack.jars` (stack/maven/s3proxy/pom.xml, pinned in stack/jars.lock, fetched by
scripts/bootstrap.sh). The JVM is a managed process (pid file in `var/run`, log in
`var/logs/object-store.log`), so `dispatch down` stops it from another shell by its pid.
Each object is a file `<var>/object-store/<bucket>/<key>`.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from dispatch.settings import Settings
from dispatch.stack import class_sharing
from dispatch.stack.jars import jar_paths
from dispatch.stack.process import ManagedProcess, ProcessError, ProcessRecord

NAME = "object-store"
START_TIMEOUT_S = 60.0
"""S3Proxy answers in 2-5 s; a loaded two-core machine (JIT, a Spark JVM beside it) may
take several times that."""
STOP_TIMEOUT_S = 20.0
HEAP = "256m"
"""Requests stream through: a small heap serves the stack's tables (Jetty and jclouds)."""


class ObjectStore:
    """S3Proxy on loopback for one settings object, a component of the local stack."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.storage = settings.storage
        var = settings.paths.var
        self.data = var / NAME
        """The filesystem backend's base directory: one directory per bucket."""
        self.bucket_dir = self.data / self.storage.bucket
        # Beside the pid file, not in `data`: a file there would be listed as a bucket.
        self.properties_file = var / "run" / f"{NAME}.properties"
        self.process = ManagedProcess(NAME, var / "run", var / "logs" / f"{NAME}.log")

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def log_file(self) -> Path:
        return self.process.log_file

    @property
    def address(self) -> str:
        """The endpoint clients reach (`dispatch status`)."""
        return self.storage.endpoint_url.rstrip("/")

    @property
    def host(self) -> str:
        return urlsplit(self.storage.endpoint_url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        # The settings insist on http:// when serving: without a port, http's own.
        return urlsplit(self.storage.endpoint_url).port or 80

    @property
    def pid(self) -> int | None:
        record = self.running()
        return record.pid if record else None

    def running(self) -> ProcessRecord | None:
        """The live server this stack started (per its pid file), or None."""
        return self.process.record()

    def properties(self) -> dict[str, str]:
        """S3Proxy's configuration: this endpoint, these credentials, the bucket directories
        under `data`."""
        return {
            "s3proxy.endpoint": self.address,
            # v2 and v4 signatures: delta-rs signs with v4, older S3A setups with v2.
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.storage.access_key_id,
            "s3proxy.credential": self.storage.secret_access_key,
            # nio2: If-None-Match: * resolved by link(2) as the object is published.
            "jclouds.provider": "filesystem-nio2",
            "jclouds.filesystem.basedir": str(self.data),
        }

    def write_properties(self) -> None:
        self.properties_file.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{key}={value}\n" for key, value in self.properties().items())
        # It holds the secret key: readable by this user only, from its creation on.
        fd = os.open(self.properties_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        self.properties_file.chmod(0o600)  # an older file keeps its mode through O_TRUNC

    def command(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ProcessError(
                "Java is not installed (Java 17+ is needed for S3Proxy): run scripts/bootstrap.sh"
            )
        (jar,) = jar_paths("s3proxy", self.settings.jar_cache)  # JarError says what is missing
        return [
            java, f"-Xmx{HEAP}", *class_sharing.quick_start_options(self.settings),
            "-jar", str(jar), "--properties", str(self.properties_file),
        ]  # fmt: skip

    def _port_taken(self) -> bool:
        # create_connection, not an AF_INET socket: the loopback host may be ::1 or localhost.
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def start(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Start the server unless it runs already and return once it answers HTTP. Returns
        True if it was started, False if it was already running."""
        if not self.storage.serve:
            raise ProcessError(
                "storage.serve is false: the object store is the user's, not the stack's to run"
            )
        if self.running() is not None:
            return False
        command = self.command()
        # Another server there would answer the readiness probe in this one's place.
        if self._port_taken():
            raise ProcessError(
                f"port {self.port} on {self.host} is taken by another process; stop it or "
                "change storage.endpoint_url"
            )
        # The filesystem backend's buckets are directories: the bucket exists from the start.
        self.bucket_dir.mkdir(parents=True, exist_ok=True)
        self.write_properties()
        self.process.start(command)
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            # Including a Ctrl-C during the wait: nothing half-started is left behind.
            self.process.stop(timeout_s=STOP_TIMEOUT_S)
            raise
        return True

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.exit_code()
            if code is not None or self.running() is None:
                raise ProcessError(
                    f"the {self.name} exited (code {code}) during start; see {self.log_file}:\n"
                    f"{self.process.log_tail()}"
                )
            try:
                # No proxy from the environment: the server is on this machine. Any answer,
                # an S3 error too (403 for an unsigned request), is a server answering.
                httpx.get(self.address, timeout=2.0, trust_env=False)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        raise ProcessError(
            f"the {self.name} did not answer on {self.address} within {timeout_s:g} s; "
            f"see {self.log_file}"
        )

    def stop(self) -> bool:
        """End the server by its recorded pid (SIGTERM, SIGKILL if it lingers). Returns True
        if one was running."""
        return self.process.stop(timeout_s=STOP_TIMEOUT_S)
