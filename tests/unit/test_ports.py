"""Free ports for the stacks tests and benches start: below the ephemeral range, so that no
outgoing connection can take one between the probe and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

from dispatch.stack.ports import LOWEST_PORT, free_port, free_port_run


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_free_port_is_below_the_ephemeral_range_and_can_be_bound() -> None:
    for _ in range(20):
        port = free_port()
        assert LOWEST_PORT <= port < _ephemeral_low()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", port))


def test_a_run_of_ports_is_free_and_consecutive() -> None:
    first = free_port_run(3)
    assert first + 3 <= _ephemeral_low()
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for offset, server in enumerate((a, b, c)):
            server.bind(("127.0.0.1", first + offset))


def test_a_port_someone_listens_on_is_never_given() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        assert all(free_port() != busy for _ in range(200))
