"""Free loopback ports, for stacks that must not collide with a developer's (tests, bench)."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports free on `host` now: a local cluster's ports are
    derived from one (tests and benches, which must not collide with a developer's stack)."""
    for _attempt in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            first: int = probe.getsockname()[1]
        if first + count > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    taken = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    taken.bind((host, port))
            except OSError:
                continue
        return first
    raise OSError(f"found no {count} consecutive free ports on {host}")
