"""Lease tokens: the secret a worker presents to settle the assignment it holds.

A lease is `"{epoch}.{token}"`: the epoch of the leader that made the assignment (public: it
only says which term decided) and a token of 128 random bits (32 hex characters) that nobody
who was not sent the assignment can guess. The core never draws it implicitly: a dispatcher
takes a `LeaseTokens` source (`RandomLeaseTokens` unless a test or benchmark passes a seeded
one), and the lease is written into the `assigned`/`reassigned` event, so replaying the log
or folding it in Spark reads the lease and never draws one.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

LeaseTokens = Callable[[], str]
"""A source of lease tokens: each call returns a new one."""

TOKEN_BYTES = 16
"""128 random bits per token."""
TOKEN_CHARS = 2 * TOKEN_BYTES
_TOKENS_PER_BLOCK = 256
_BLOCK_CHARS = TOKEN_CHARS * _TOKENS_PER_BLOCK

_fork_generation = 0
"""Incremented in a forked child, so a child never hands out tokens its parent also holds."""


def _after_fork_in_child() -> None:
    global _fork_generation  # noqa: PLW0603  (one counter for the whole process, by design)
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class RandomLeaseTokens:
    """Tokens from the operating system's CSPRNG (`os.urandom`), 128 bits each.

    One `os.urandom` call fills a block of 256 tokens: a call per token (what
    `secrets.token_hex(16)` does) costs about three times as much, and every assignment draws
    one. Not thread-safe, like the dispatcher that owns it: one source per dispatcher.
    """

    __slots__ = ("_block", "_generation", "_position")

    def __init__(self) -> None:
        self._block = ""
        self._position = _BLOCK_CHARS
        self._generation = _fork_generation

    def __call__(self) -> str:
        position = self._position
        if position >= _BLOCK_CHARS or self._generation != _fork_generation:
            self._block = os.urandom(TOKEN_BYTES * _TOKENS_PER_BLOCK).hex()
            self._generation = _fork_generation
            position = 0
        self._position = position + TOKEN_CHARS
        return self._block[position : position + TOKEN_CHARS]


def seeded_lease_tokens(seed: int) -> LeaseTokens:
    """Reproducible 128-bit tokens (same seed, same sequence), for tests and benchmarks that
    compare the events of two runs. Predictable by design: never use it to serve workers."""
    generator = random.Random(seed)  # reproducible, not secret: the point here

    def token() -> str:
        return f"{generator.getrandbits(8 * TOKEN_BYTES):0{TOKEN_CHARS}x}"

    return token
