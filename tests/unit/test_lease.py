"""The Delta-table lease: real delta-rs tables on local disk, racing threads and processes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from multiprocessing.synchronize import Barrier as BarrierType
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from dispatch.lease import CHECKPOINT_EVERY, LEASES, Lease, LeaseTable, serving_deadline
from dispatch.settings import LeaseSettings

SETTINGS = LeaseSettings(ttl_s=10.0, renew_every_s=3.0, clock_skew_margin_s=2.0)
T0 = 1_700_000_000.25
GROUP = "default"


@pytest.fixture
def table(tmp_path: Path) -> LeaseTable:
    return LeaseTable(tmp_path, SETTINGS)


def test_first_acquire_gets_epoch_1(table: LeaseTable) -> None:
    assert table.read(GROUP) is None
    lease = table.try_acquire(GROUP, "a", "http://a:8000", T0)
    assert lease == Lease(GROUP, "a", "http://a:8000", 1, T0 + SETTINGS.ttl_s, T0)
    assert table.read(GROUP) == lease
    assert (table.path / "_delta_log").is_dir()
    assert table.path == table.path.parent / LEASES


def test_a_second_holder_is_refused_while_the_lease_is_live(table: LeaseTable) -> None:
    first = table.try_acquire(GROUP, "a", "http://a", T0)
    assert table.try_acquire(GROUP, "b", "http://b", T0 + SETTINGS.ttl_s - 0.001) is None
    assert table.read(GROUP) == first


def test_the_holder_acquiring_again_while_live_is_a_renewal(table: LeaseTable) -> None:
    table.try_acquire(GROUP, "a", "http://a", T0)
    again = table.try_acquire(GROUP, "a", "http://a:9000", T0 + 1)
    assert again is not None
    assert (again.epoch, again.expires_at, again.address) == (
        1,
        T0 + 1 + SETTINGS.ttl_s,
        "http://a:9000",
    )


def test_takeover_after_expiry_fences_the_old_holder(table: LeaseTable) -> None:
    old = table.try_acquire(GROUP, "a", "http://a", T0)
    assert old is not None
    later = old.expires_at  # expired at exactly expires_at
    new = table.try_acquire(GROUP, "b", "http://b", later)
    assert new is not None
    assert (new.holder, new.epoch, new.expires_at) == ("b", 2, later + SETTINGS.ttl_s)
    # The old holder, waking up: its renewal fails, and it cannot take the live lease back.
    assert table.renew(old, later + 1) is None
    assert table.try_acquire(GROUP, "a", "http://a", later + 1) is None
    assert table.release(old, later + 1) is False
    assert table.read(GROUP) == new


def test_an_expired_lease_taken_again_by_its_holder_starts_a_new_epoch(table: LeaseTable) -> None:
    old = table.try_acquire(GROUP, "a", "http://a", T0)
    assert old is not None
    again = table.try_acquire(GROUP, "a", "http://a", old.expires_at + 5)
    assert again is not None and again.epoch == 2


def test_renew_extends_the_lease(table: LeaseTable) -> None:
    lease = table.try_acquire(GROUP, "a", "http://a", T0)
    assert lease is not None
    renewed = table.renew(lease, T0 + 3)
    assert renewed == Lease(GROUP, "a", "http://a", 1, T0 + 3 + SETTINGS.ttl_s, T0 + 3)
    assert table.read(GROUP) == renewed
    # The lease object in hand need not be the latest renewal: holder and epoch decide.
    assert table.renew(lease, T0 + 6) is not None
    # Another holder is still refused inside the extended term.
    assert table.try_acquire(GROUP, "b", "http://b", T0 + 12) is None


def test_release_lets_another_take_over_at_once(table: LeaseTable) -> None:
    lease = table.try_acquire(GROUP, "a", "http://a", T0)
    assert lease is not None
    assert table.release(lease, T0 + 1)
    released = table.read(GROUP)
    assert released is not None
    assert (released.holder, released.epoch) == ("a", 1)  # the epoch is kept
    assert not released.is_live(T0 + 1)
    taken = table.try_acquire(GROUP, "b", "http://b", T0 + 1)
    assert taken is not None and taken.epoch == 2
    assert table.renew(lease, T0 + 2) is None


def test_advance_raises_the_epoch_of_a_held_lease_only(table: LeaseTable) -> None:
    lease = table.try_acquire(GROUP, "a", "http://a", T0)
    assert lease is not None
    with pytest.raises(ValueError):
        table.advance(lease, 1, T0 + 1)
    advanced = table.advance(lease, 7, T0 + 1)
    assert advanced is not None
    assert (advanced.epoch, advanced.expires_at) == (7, T0 + 1 + SETTINGS.ttl_s)
    assert table.renew(lease, T0 + 2) is None  # the old epoch no longer matches
    assert table.renew(advanced, T0 + 2) is not None
    taken = table.try_acquire(GROUP, "b", "http://b", T0 + 100)
    assert taken is not None and taken.epoch == 8


def test_groups_are_independent_and_names_are_quoted(table: LeaseTable) -> None:
    a = table.try_acquire("g-1", "o'brien", "http://x/'", T0)
    b = table.try_acquire("g-2", "b", "http://b", T0)
    assert a is not None and b is not None
    assert (a.epoch, b.epoch) == (1, 1)
    assert table.renew(a, T0 + 1) is not None
    assert table.read("g-1") == Lease("g-1", "o'brien", "http://x/'", 1, T0 + 11, T0 + 1)
    assert table.read("g-3") is None


def test_epochs_strictly_increase_across_takeovers(table: LeaseTable) -> None:
    now = T0
    epochs: list[int] = []
    for turn in range(24):
        lease = table.try_acquire(GROUP, f"node-{turn % 3}", "http://n", now)
        assert lease is not None
        epochs.append(lease.epoch)
        if turn % 2:
            assert table.release(lease, now + 1)  # graceful: the next one may come at once
            now += 1
        else:
            now = lease.expires_at  # the holder died: wait for expiry
    assert epochs == list(range(1, 25))


def test_serving_deadline_is_the_skew_margin_before_expiry() -> None:
    lease = Lease(GROUP, "a", "http://a", 3, expires_at=T0 + 10, renewed_at=T0)
    assert serving_deadline(lease, SETTINGS) == T0 + 8
    # A holder that renews on time never reaches its deadline.
    assert serving_deadline(lease, SETTINGS) > lease.renewed_at + SETTINGS.renew_every_s


def test_racing_creators_all_end_with_the_one_table(tmp_path: Path) -> None:
    creators = 6
    barrier = threading.Barrier(creators)
    tables: list[LeaseTable] = []

    def create() -> None:
        barrier.wait(30)
        tables.append(LeaseTable(tmp_path, SETTINGS))

    threads = [threading.Thread(target=create) for _ in range(creators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(tables) == creators
    # Only version 0: no loser committed a second CREATE TABLE over the winner's.
    assert DeltaTable(str(tmp_path / LEASES)).version() == 0
    assert tables[0].try_acquire(GROUP, "a", "http://a", T0) is not None
    assert all(table.read(GROUP) is not None for table in tables)


def test_threads_racing_for_the_lease_elect_exactly_one_per_round(tmp_path: Path) -> None:
    racers, rounds = 6, 4
    barrier = threading.Barrier(racers)
    won: dict[int, list[Lease]] = {round_: [] for round_ in range(rounds)}
    lock = threading.Lock()

    def race(name: str) -> None:
        try:
            barrier.wait(30)
            table = LeaseTable(tmp_path, SETTINGS)  # round 0 also races the table's creation
            for round_ in range(rounds):
                barrier.wait(30)
                # Each round starts after the previous winner's lease expired.
                lease = table.try_acquire(GROUP, name, f"http://{name}", T0 + 100 * round_)
                if lease is not None:
                    with lock:
                        won[round_].append(lease)
        except Exception:
            barrier.abort()  # the other racers stop waiting; pytest reports this thread's error
            raise

    threads = [threading.Thread(target=race, args=(f"t{i}",)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [len(won[round_]) for round_ in range(rounds)] == [1] * rounds
    assert [won[round_][0].epoch for round_ in range(rounds)] == list(range(1, rounds + 1))


def _race_in_process(
    warehouse: str, name: str, rounds: int, barrier: BarrierType, results: Any
) -> None:
    barrier.wait(60)
    table = LeaseTable(Path(warehouse), SETTINGS)
    for round_ in range(rounds):
        barrier.wait(60)
        lease = table.try_acquire(GROUP, name, f"http://{name}", T0 + 100 * round_)
        results.put((round_, name, None if lease is None else lease.epoch))


def test_processes_racing_for_the_lease_elect_exactly_one_per_round(tmp_path: Path) -> None:
    rounds = 5
    # Spawned with the venv's interpreter: separate processes, separate delta-rs runtimes.
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    processes = [
        context.Process(
            target=_race_in_process, args=(str(tmp_path), name, rounds, barrier, results)
        )
        for name in ("p1", "p2")
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in range(2 * rounds)]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    for round_ in range(rounds):
        epochs = [epoch for r, _, epoch in outcomes if r == round_ and epoch is not None]
        assert epochs == [round_ + 1]


def test_the_table_stays_small_and_fast_after_many_renewals(table: LeaseTable) -> None:
    lease = table.try_acquire(GROUP, "a", "http://a", T0)
    assert lease is not None
    renewals = 2 * CHECKPOINT_EVERY  # two checkpoints: they keep coming
    for step in range(1, renewals + 1):
        renewed = table.renew(lease, T0 + step)
        assert renewed is not None
        lease = renewed
    log_dir = table.path / "_delta_log"
    assert (log_dir / "_last_checkpoint").is_file()
    checkpoints = sorted(path.name for path in log_dir.glob("*.checkpoint.parquet"))
    assert checkpoints[-1] >= f"{renewals:020d}"
    assert len(checkpoints) == renewals // CHECKPOINT_EVERY
    started = time.perf_counter()
    assert table.read(GROUP) == lease
    assert time.perf_counter() - started < 1.0  # ~10 ms here; generous for a loaded machine
    # Every renewal rewrote the row's file; a vacuum without retention keeps only the live one.
    assert len(list(table.path.glob("*.parquet"))) > renewals
    table.maintain(vacuum_retention_hours=0)
    assert len(list(table.path.glob("*.parquet"))) == 1
    assert table.read(GROUP) == lease
    assert table.renew(lease, T0 + renewals + 1) is not None


def test_concurrent_renewals_of_two_groups_do_not_depose_each_other(tmp_path: Path) -> None:
    # One table, one Delta version sequence: the groups' commits race each other; a commit
    # lost to the other group's is retried on the newer version, not taken for a lost lease.
    table = LeaseTable(tmp_path, SETTINGS)
    failures: list[str] = []

    def keep(group: str) -> None:
        lease = table.try_acquire(group, "a", "http://a", T0)
        assert lease is not None
        for step in range(1, 21):
            time.sleep(0.05)  # paced as in service (renew_every_s, 0.5 s by default), faster
            renewed = table.renew(lease, T0 + step)
            if renewed is None:
                failures.append(f"{group} at {step}")
                return
            lease = renewed

    threads = [threading.Thread(target=keep, args=(group,)) for group in ("g-1", "g-2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures
