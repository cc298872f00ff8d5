"""Free loopback ports, for stacks that must not collide with a developer's (tests, bench).

Ports are drawn at random *below* the kernel's ephemeral range (`ip_local_port_range`), not
picked by the OS: an OS-picked port is an ephemeral one, and between the probe that finds it
free and the server that binds it (a broker starting seconds later), any outgoing connection
on the machine may take it as its source port ("Address already in use"). Below that range
only another listener can take it, and random choices over some 20,000 ports rarely meet.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

LOWEST_PORT = 10_000
"""The lowest port drawn (well above the ports services usually listen on)."""
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_ATTEMPTS = 100


def _listen_ports(count: int) -> range | None:
    """Where a run of `count` ports may start: below the ephemeral range (None when it is
    unknown or leaves too little room: then the OS picks)."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if low - count - LOWEST_PORT < 1_000:
        return None
    return range(LOWEST_PORT, low - count)


def _all_free(host: str, first: int, count: int) -> bool:
    with contextlib.ExitStack() as held:
        try:
            for port in range(first, first + count):
                taken = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                taken.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, outside the ephemeral range when that is known."""
    return free_port_run(1, host)


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports free on `host` now: a local cluster's ports are
    derived from one (tests and benches, which must not collide with a developer's stack)."""
    starts = _listen_ports(count)
    if starts is not None:
        for _attempt in range(_ATTEMPTS):
            first = random.choice(starts)
            if _all_free(host, first, count):
                return first
    for _attempt in range(_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            picked: int = probe.getsockname()[1]
        if picked + count <= 65536 and _all_free(host, picked, count):
            return picked
    raise OSError(f"found no {count} consecutive free ports on {host}")
