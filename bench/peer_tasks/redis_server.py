"""A fresh redis-server for one measurement: found on PATH or fetched from Debian's packages
into a cache, started with AOF on a free loopback port and a temporary data directory, stopped
by the pid it was started with.

Nothing here is installed system-wide: without `redis-server` on PATH, `apt-get download`
fetches `redis-server` and `redis-tools` (and the libraries they need that are not installed,
read from the package's Depends and checked with `ldd`) into `~/.cache/dispatch/redis/`, where
`dpkg -x` unpacks them; the binary then runs with `LD_LIBRARY_PATH` over the unpacked
libraries.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dispatch.stack.ports import free_port

CACHE = Path.home() / ".cache" / "dispatch" / "redis"
PACKAGES = ("redis-server", "redis-tools")
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


class RedisUnavailable(RuntimeError):
    """redis-server could not be found, fetched or started; the message says why."""


@dataclass(frozen=True)
class RedisBinary:
    path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment (LD_LIBRARY_PATH) for a binary unpacked into the cache."""

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def version(self) -> str:
        out = subprocess.run(
            [str(self.path), "--version"],
            env=self.environment(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = re.search(r"v=(\S+)", out)
        return found.group(1) if found else out.strip()


def redis_argv(binary: Path, port: int, data_dir: Path) -> list[str]:
    """The command line of the bench's Redis: AOF with fsync once a second, no RDB snapshots.

    `appendfsync everysec` loses at most about a second of writes on a power loss, like a
    single Kafka broker with acks=all (which leaves fsync to the page cache by default).
    RDB snapshots are off (`save ""`): they add no durability over the AOF, and their fork
    in the middle of a run would be noise on a 2-core machine."""
    return [
        str(binary),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "no",
        "--logfile", "",
    ]  # fmt: skip


def missing_sonames(ldd_output: str) -> list[str]:
    """The shared libraries `ldd` could not find, e.g. ['liblzf.so.1']."""
    return re.findall(r"^\s*(\S+) => not found", ldd_output, flags=re.MULTILINE)


def library_packages(depends: str) -> list[str]:
    """The library packages named in a Debian Depends field (the first of alternatives)."""
    names = [part.split("|")[0].split("(")[0].strip() for part in depends.split(",")]
    return [name for name in names if name.startswith("lib")]


def _cached_binary(root: Path) -> RedisBinary | None:
    path = root / "usr" / "bin" / "redis-server"
    if not path.exists():
        return None
    libraries = sorted({str(so.parent) for so in root.rglob("*.so*")})
    return RedisBinary(path, {"LD_LIBRARY_PATH": ":".join(libraries)} if libraries else {})


def _unresolved(binary: RedisBinary) -> list[str]:
    # redis-server is a symlink to redis-check-rdb; ldd follows it.
    ldd = subprocess.run(
        ["ldd", str(binary.path)],
        env=binary.environment(),
        capture_output=True,
        text=True,
        check=False,  # a missing library is in its output, with a non-zero exit status
    )
    return missing_sonames(ldd.stdout)


def _installed(package: str) -> bool:
    status = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package],
        capture_output=True,
        text=True,
        check=False,  # a package never installed exits 1
    )
    return status.returncode == 0 and status.stdout.endswith("installed")


def _download_and_unpack(packages: list[str], debs: Path, root: Path) -> list[Path]:
    fetched = subprocess.run(
        ["apt-get", "download", *packages],
        cwd=debs,
        capture_output=True,
        text=True,
        check=False,  # its stderr goes into the error below
    )
    if fetched.returncode != 0:
        raise RedisUnavailable(
            f"`apt-get download {' '.join(packages)}` failed: {fetched.stderr.strip()[-500:]}"
        )
    files = [next(debs.glob(f"{package}_*.deb"), None) for package in packages]
    for package, deb in zip(packages, files, strict=True):
        if deb is None:
            raise RedisUnavailable(f"`apt-get download {package}` left no .deb in {debs}")
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True, capture_output=True)
    return [deb for deb in files if deb is not None]


def fetch_redis(cache: Path = CACHE) -> RedisBinary:
    """Debian's redis-server unpacked into `cache` (fetched on first use), ready to run."""
    cached = _cached_binary(cache / "root")
    if cached is not None and not _unresolved(cached):
        return cached
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise RedisUnavailable("no redis-server on PATH, and no apt-get/dpkg to fetch one")
    cache.mkdir(parents=True, exist_ok=True)
    # Unpacked beside the final place and renamed into it, so that an interrupted fetch never
    # leaves a half-unpacked tree that the check above would take for a complete one.
    with tempfile.TemporaryDirectory(dir=cache, prefix="fetch-") as scratch:
        debs, root = Path(scratch) / "debs", Path(scratch) / "root"
        debs.mkdir()
        downloaded = _download_and_unpack(list(PACKAGES), debs, root)
        depends = ", ".join(
            subprocess.run(
                ["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True, check=True
            ).stdout
            for deb in downloaded
        )
        wanted = [name for name in library_packages(depends) if not _installed(name)]
        if wanted:
            _download_and_unpack(wanted, debs, root)
        binary = _cached_binary(root)
        if binary is None:
            raise RedisUnavailable(f"the packages {PACKAGES} hold no usr/bin/redis-server")
        missing = _unresolved(binary)
        if missing:
            raise RedisUnavailable(
                f"the unpacked redis-server still misses shared libraries: {', '.join(missing)}"
            )
        shutil.rmtree(cache / "root", ignore_errors=True)
        root.rename(cache / "root")
    found = _cached_binary(cache / "root")
    if found is None:
        raise RedisUnavailable(f"redis-server vanished from {cache / 'root'}")
    return found


def find_redis() -> RedisBinary:
    """redis-server from PATH, else Debian's, fetched into the cache."""
    on_path = shutil.which("redis-server")
    return RedisBinary(Path(on_path)) if on_path else fetch_redis()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def redis_server(binary: RedisBinary) -> Iterator[str]:
    """A fresh Redis on a free loopback port: yields its URL, stops it by its pid afterwards."""
    with tempfile.TemporaryDirectory(prefix="dispatch-peers-redis-") as scratch:
        data = Path(scratch)
        log = data / "redis.log"
        port = free_port()
        with log.open("wb") as out:
            process = subprocess.Popen(
                redis_argv(binary.path, port, data),
                env=binary.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _answers(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-800:]
                    raise RedisUnavailable(f"redis-server on port {port} did not answer: {tail}")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            # SIGTERM: Redis flushes the AOF and exits; SIGKILL only if it does not in time.
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
