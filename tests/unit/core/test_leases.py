"""Lease tokens: 128 random bits each, unrelated to one another; a seeded source repeats."""

from __future__ import annotations

import itertools
import os

import pytest

from dispatch.core import CoreConfig, Dispatcher, leases
from dispatch.core.leases import RandomLeaseTokens, seeded_lease_tokens
from tests.unit.core.helpers import T0, assignments, request, worker


def test_random_tokens_are_128_bit_hex_and_never_repeat() -> None:
    source = RandomLeaseTokens()
    tokens = [source() for _ in range(1_000)]  # several blocks of the buffer
    assert len(set(tokens)) == len(tokens)
    assert all(len(token) == 32 and int(token, 16) >= 0 for token in tokens)
    # No relation between neighbours: a guess from the previous token (+1, same prefix) misses.
    for previous, token in itertools.pairwise(tokens):
        assert int(token, 16) != int(previous, 16) + 1
    assert len({token[:8] for token in tokens}) > 990


def test_two_sources_share_no_tokens() -> None:
    first, second = RandomLeaseTokens(), RandomLeaseTokens()
    assert not {first() for _ in range(300)} & {second() for _ in range(300)}


def test_a_forked_child_draws_a_new_block(monkeypatch: pytest.MonkeyPatch) -> None:
    source = RandomLeaseTokens()
    source()  # fills a block: a forked child must not hand out the rest of it
    drawn: list[int] = []
    real_urandom = os.urandom

    def counting_urandom(size: int) -> bytes:
        drawn.append(size)
        return real_urandom(size)

    monkeypatch.setattr(os, "urandom", counting_urandom)
    source()
    assert drawn == []  # the same process goes on with its block
    leases._after_fork_in_child()  # what os.register_at_fork runs in a child
    source()
    assert drawn == [16 * 256]


def test_a_seeded_source_repeats_its_sequence() -> None:
    first, second = seeded_lease_tokens(7), seeded_lease_tokens(7)
    tokens = [first() for _ in range(100)]
    assert tokens == [second() for _ in range(100)]
    assert len(set(tokens)) == 100 and all(len(token) == 32 for token in tokens)
    assert seeded_lease_tokens(8)() != tokens[0]


def test_a_dispatcher_leases_with_its_epoch_and_a_random_token() -> None:
    d = Dispatcher(CoreConfig(worker_expiry_s=None, default_cap=2_000))
    d.begin_epoch(7, T0)
    worker(d, "w", credits=1_000)
    events = d.submit_many([request(f"j{n}") for n in range(1_000)], T0)
    leases = [event.lease for event in assignments(events)]
    assert len(leases) == len(set(leases)) == 1_000
    for lease in leases:
        epoch, dot, token = lease.partition(".")
        assert (epoch, dot, len(token)) == ("7", ".", 32)
        int(token, 16)
    # Knowing one lease tells nothing about the next: no common prefix beyond chance.
    tokens = [lease[2:] for lease in leases]
    assert len({token[:6] for token in tokens}) > 990
