"""The failover benchmark's pure helpers: lease epochs, medians, first receipts, node logs."""

from __future__ import annotations

import datetime as dt

import pytest

from dispatch.bench.failover_bench import term_log
from dispatch.bench.harness_load import Receipt, first_receipt, lease_epoch
from dispatch.bench.stats import p50_max


def test_the_epoch_of_a_lease_token_is_before_the_dot() -> None:
    assert lease_epoch("7." + "ab" * 16) == 7
    assert lease_epoch("12.1") == 12


@pytest.mark.parametrize("token", ["", "7", "7.", ".3", "a.1", "1.xyz", "-1.2"])
def test_a_malformed_lease_token_is_refused(token: str) -> None:
    with pytest.raises(ValueError, match="not a lease token"):
        lease_epoch(token)


def test_p50_is_the_median_and_max_the_largest() -> None:
    assert p50_max([3.0, 1.0, 2.0]) == {"p50": 2.0, "max": 3.0, "n": 3}
    assert p50_max([4.0, 1.0, 2.0, 3.0]) == {"p50": 2.5, "max": 4.0, "n": 4}
    assert p50_max([1.23456]) == {"p50": 1.235, "max": 1.235, "n": 1}
    assert p50_max([]) == {}


def test_the_first_receipt_is_the_earliest_of_the_epoch_after_the_kill() -> None:
    receipts = [
        Receipt(5.0, 2, "late"),
        Receipt(1.0, 2, "before-the-kill"),
        Receipt(3.0, 1, "old-leader"),
        Receipt(4.0, 2, "first"),
    ]
    found = first_receipt(receipts, after=2.0, epoch=2)
    assert found is not None and found.job_id == "first"
    assert first_receipt(receipts, after=6.0, epoch=2) is None
    assert first_receipt(receipts, after=0.0, epoch=3) is None


def test_a_terms_lease_and_rebuild_are_read_from_the_node_log() -> None:
    text = "\n".join(
        [
            "2026-11-26 02:00:00,000 INFO dispatch.api.election: node node-1: took the lease of "
            "'default', epoch 3",
            "2026-11-26 02:00:01,000 INFO dispatch.api.leader: leader node-1: epoch 3, rebuilt "
            "from full log (no snapshot yet) + 2 batches of the log in 0.50s",
            "2026-11-26 02:00:10,250 INFO dispatch.api.election: node node-1: took the lease of "
            "'default', epoch 5",
            "2026-11-26 02:00:11,000 INFO dispatch.api.leader: leader node-1: epoch 5, rebuilt "
            "from snapshot v12 (3 jobs) + 40 batches of the log in 0.75s",
        ]
    )
    term = term_log(text, 5)
    expected = dt.datetime(2026, 11, 26, 2, 0, 10, 250_000).timestamp()
    assert term.lease_taken_at == pytest.approx(expected)
    assert term.rebuild_s == 0.75
    assert term.rebuilt_from == "snapshot v12 (3 jobs)"
    assert term.replayed_batches == 40
    missing = term_log(text, 4)
    assert missing.lease_taken_at is None and missing.rebuild_s is None
