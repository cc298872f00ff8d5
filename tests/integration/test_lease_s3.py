"""The Delta-table lease on object storage: a real S3-compatible server (S3Proxy) on loopback.

The compare-and-swap is S3's conditional write: delta-rs creates commit file v+1 with
`If-None-Match: *`, so racing writers of one version get one 200 and 412s. These tests race
contenders (threads with a delta-rs instance each, and processes) for each epoch and check
that exactly one wins, that epochs never repeat, and that a holder's renewal is never undone
by a contender that read the table before it.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.synchronize import Barrier as BarrierType
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError

from dispatch.lease import CHECKPOINT_EVERY, LEASES, Lease, LeaseTable
from dispatch.settings import LeaseSettings
from dispatch.storage import join, storage_options
from tests.s3_server import S3Server

pytestmark = pytest.mark.integration

SETTINGS = LeaseSettings(ttl_s=10.0, renew_every_s=3.0, clock_skew_margin_s=2.0)
T0 = 1_700_000_000.25
GROUP = "default"


def _warehouse(server: S3Server, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """A warehouse URI of this test's own and the options that reach the server."""
    location = server.uri("lease-tests", request.node.name)
    return location, storage_options(server.settings(), location)


def _run_all(targets: list[Callable[[], None]], barrier: threading.Barrier) -> None:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:
            errors.append(error)
            barrier.abort()  # the others stop waiting instead of timing out
            raise

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not errors, errors


def test_lease_semantics_hold_on_s3(s3_server: S3Server, request: pytest.FixtureRequest) -> None:
    warehouse, options = _warehouse(s3_server, request)
    table = LeaseTable(warehouse, SETTINGS, options)
    assert table.location == f"{warehouse}/{LEASES}"
    with pytest.raises(ValueError):
        _ = table.path  # no local folder behind an s3:// table
    old = table.try_acquire(GROUP, "a", "http://a", T0)
    assert old == Lease(GROUP, "a", "http://a", 1, T0 + SETTINGS.ttl_s, T0)
    assert table.try_acquire(GROUP, "b", "http://b", T0 + 1) is None
    new = table.try_acquire(GROUP, "b", "http://b", old.expires_at)
    assert new is not None and new.epoch == 2
    assert table.renew(old, old.expires_at + 1) is None  # fenced
    assert table.release(new, new.renewed_at + 1)
    again = table.try_acquire(GROUP, "a", "http://a", new.renewed_at + 1)
    assert again is not None and again.epoch == 3
    # A second process's view: a fresh instance reads the same row from the store.
    assert LeaseTable(warehouse, SETTINGS, options).read(GROUP) == again
    # The objects are in the bucket, under the warehouse prefix.
    log_dir = s3_server.data / "dispatch" / "lease-tests" / request.node.name / LEASES
    assert (log_dir / "_delta_log" / "00000000000000000000.json").is_file()


def test_a_stale_writer_is_refused_by_the_store(
    s3_server: S3Server, request: pytest.FixtureRequest
) -> None:
    # The mechanism itself: a commit prepared on version v after someone else committed v+1
    # must fail (its PUT of v+1 answered 412), not overwrite v+1 and not land as v+2.
    warehouse, options = _warehouse(s3_server, request)
    table = LeaseTable(warehouse, SETTINGS, options)
    lease = table.try_acquire(GROUP, "holder", "http://h", T0)
    assert lease is not None
    stale = DeltaTable(table.location, storage_options=options)
    version = stale.version()
    renewed = table.renew(lease, T0 + 5)  # the holder commits version + 1
    assert renewed is not None
    with pytest.raises(CommitFailedError):
        stale.update(
            updates={"holder": "'thief'", "epoch": "2"},
            predicate='"epoch" = 1',
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    latest = DeltaTable(table.location, storage_options=options)
    assert latest.version() == version + 1
    assert table.read(GROUP) == renewed


def test_thread_contenders_elect_exactly_one_per_epoch(
    s3_server: S3Server, request: pytest.FixtureRequest
) -> None:
    warehouse, options = _warehouse(s3_server, request)
    racers, rounds = 6, 15
    barrier = threading.Barrier(racers)
    won: dict[int, list[Lease]] = {round_: [] for round_ in range(rounds)}
    lock = threading.Lock()

    def race(name: str) -> None:
        barrier.wait(60)
        table = LeaseTable(warehouse, SETTINGS, options)  # round 0 also races the creation
        for round_ in range(rounds):
            barrier.wait(60)
            # Every round starts after the previous winner's lease expired.
            lease = table.try_acquire(GROUP, name, f"http://{name}", T0 + 100 * round_)
            if lease is not None:
                with lock:
                    won[round_].append(lease)

    _run_all([functools.partial(race, f"t{i}") for i in range(racers)], barrier)
    assert [len(won[round_]) for round_ in range(rounds)] == [1] * rounds
    assert [won[round_][0].epoch for round_ in range(rounds)] == list(range(1, rounds + 1))
    # Only the CREATE TABLE and one commit per epoch: no loser's commit landed anywhere.
    latest = DeltaTable(join(warehouse, LEASES), storage_options=options)
    assert latest.version() == rounds


def test_renewals_never_lose_to_a_stale_contender(
    s3_server: S3Server, request: pytest.FixtureRequest
) -> None:
    # Each round the holder's lease has just expired on everyone's clock: the holder renews
    # while the contenders try to take it over, all at once. Exactly one commit wins: the
    # renewal (same epoch, every contender refused) or one takeover (epoch + 1, the holder's
    # renewal refused); the winner holds the next round.
    warehouse, options = _warehouse(s3_server, request)
    contenders, rounds = 4, 15
    names = ["holder"] + [f"c{i}" for i in range(contenders)]
    tables = {name: LeaseTable(warehouse, SETTINGS, options) for name in names}
    first = tables["holder"].try_acquire(GROUP, "holder", "http://holder", T0)
    assert first is not None
    barrier = threading.Barrier(len(names))
    holding: dict[str, Lease | None] = {name: None for name in names}
    holding["holder"] = first
    results: list[dict[str, Lease | None]] = []
    lock = threading.Lock()

    def play(name: str) -> None:
        table = tables[name]
        for round_ in range(rounds):
            barrier.wait(60)
            now = T0 + 100 * (round_ + 1)  # past every lease of the previous round
            mine = holding[name]
            if mine is not None:
                outcome = table.renew(mine, now)
            else:
                outcome = table.try_acquire(GROUP, name, f"http://{name}", now)
            with lock:
                if len(results) <= round_:
                    results.append({})
                results[round_][name] = outcome
            barrier.wait(60)
            if name == "holder":
                # Between rounds, one thread hands the lease to this round's winner.
                winners = [who for who, lease in results[round_].items() if lease is not None]
                for who in names:
                    holding[who] = results[round_][who] if who in winners else None
            barrier.wait(60)

    _run_all([functools.partial(play, name) for name in names], barrier)
    epoch = first.epoch
    held_by = "holder"
    for round_, outcomes in enumerate(results):
        winners = {who: lease for who, lease in outcomes.items() if lease is not None}
        assert len(winners) == 1, (round_, outcomes)
        ((who, lease),) = winners.items()
        if who == held_by:
            assert lease.epoch == epoch  # a renewal keeps the epoch
        else:
            epoch += 1
            assert lease.epoch == epoch  # a takeover starts the next one, never a reused one
            held_by = who
    last = results[-1]
    assert tables["c0"].read(GROUP) == next(lease for lease in last.values() if lease)


def _contend_in_process(
    warehouse: str,
    options: dict[str, str],
    name: str,
    threads: int,
    rounds: int,
    barrier: BarrierType,
    results: Any,
) -> None:
    # Several delta-rs instances in this process too: processes and threads race at once.
    tables = [LeaseTable(warehouse, SETTINGS, options) for _ in range(threads)]
    inner = threading.Barrier(threads)

    def contend(index: int) -> None:
        holder = f"{name}-{index}"
        for round_ in range(rounds):
            if index == 0:
                barrier.wait(120)
            inner.wait(120)
            lease = tables[index].try_acquire(GROUP, holder, "http://p", T0 + 100 * round_)
            results.put((round_, holder, None if lease is None else lease.epoch))

    workers = [threading.Thread(target=contend, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)


def test_process_contenders_elect_exactly_one_per_epoch(
    s3_server: S3Server, request: pytest.FixtureRequest
) -> None:
    warehouse, options = _warehouse(s3_server, request)
    LeaseTable(warehouse, SETTINGS, options)  # created up front: the processes race the lease
    processes, threads, rounds = 3, 2, 10
    context = multiprocessing.get_context("spawn")  # separate delta-rs runtimes
    barrier = context.Barrier(processes)
    results = context.Queue()
    children = [
        context.Process(
            target=_contend_in_process,
            args=(warehouse, options, f"p{i}", threads, rounds, barrier, results),
        )
        for i in range(processes)
    ]
    for child in children:
        child.start()
    try:
        outcomes = [results.get(timeout=240) for _ in range(processes * threads * rounds)]
    finally:
        for child in children:
            child.join(60)
            if child.is_alive():
                child.kill()  # by its own pid: a child stuck past the test's end
    assert all(child.exitcode == 0 for child in children)
    for round_ in range(rounds):
        epochs = [epoch for r, _, epoch in outcomes if r == round_ and epoch is not None]
        assert epochs == [round_ + 1], (round_, outcomes)


def test_maintenance_runs_on_s3(s3_server: S3Server, request: pytest.FixtureRequest) -> None:
    warehouse, options = _warehouse(s3_server, request)
    table = LeaseTable(warehouse, SETTINGS, options)
    lease = table.try_acquire(GROUP, "a", "http://a", T0)
    assert lease is not None
    for step in range(1, CHECKPOINT_EVERY + 1):
        renewed = table.renew(lease, T0 + step)
        assert renewed is not None
        lease = renewed
    folder = s3_server.data / "dispatch" / "lease-tests" / request.node.name / LEASES
    log_dir = folder / "_delta_log"
    assert (log_dir / "_last_checkpoint").is_file()
    assert sorted(path.name for path in log_dir.glob("*.checkpoint.parquet")) == [
        f"{CHECKPOINT_EVERY:020d}.checkpoint.parquet"
    ]
    assert len(list(folder.glob("*.parquet"))) > CHECKPOINT_EVERY
    table.maintain(vacuum_retention_hours=0)
    assert len(list(folder.glob("*.parquet"))) == 1
    fresh = LeaseTable(warehouse, SETTINGS, options)
    assert fresh.read(GROUP) == lease
    assert fresh.renew(lease, T0 + CHECKPOINT_EVERY + 1) is not None


def test_storage_options_reach_delta_rs(
    s3_server: S3Server, request: pytest.FixtureRequest
) -> None:
    # The options carry credentials: a wrong secret is refused by the server (signature).
    warehouse, options = _warehouse(s3_server, request)
    wrong = storage_options(s3_server.settings(secret_access_key="wrong"), warehouse)
    with pytest.raises(OSError):
        DeltaTable.create(
            join(warehouse, "t"), pa.schema([("a", pa.int64())]), storage_options=wrong
        )
    DeltaTable.create(join(warehouse, "t"), pa.schema([("a", pa.int64())]), storage_options=options)
    assert DeltaTable.is_deltatable(join(warehouse, "t"), storage_options=options)
