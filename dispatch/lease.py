"""The leader lease: one row per dispatcher group in the Delta table `leases`, delta-rs only.

Whoever holds an unexpired row leads the group. Every change is an optimistic-concurrency
commit: load the latest version v, check the row in v, then UPDATE (or MERGE-insert) with
`max_commit_retries=0`, so the commit lands as v+1 or fails with `CommitFailedError` when any
other writer committed since v. The predicate also pins the row as read (holder, epoch,
expires_at), and the updated-row count is checked, since an UPDATE matching nothing commits
nothing and raises nothing. A lost race is re-evaluated on the newer version (it may have been
another group's commit or a maintenance commit); a lost lease answers None, never an exception.

The epoch is the fencing token: 1 for a group's first lease, +1 on every change of hands (a
takeover of an expired row, even by its last holder, starts a new term). Rows are never
deleted and a release keeps the epoch, so an epoch is never reused.

Clocks: `now` is the caller's wall clock (unix seconds), since rows are compared across nodes.
Pass the time read *before* the call, so a holder never believes its lease lasts longer than
the row says. See `serving_deadline` for skew between nodes.

Upkeep: a lease table takes a commit per renewal (every `renew_every_s`, forever), and every
update rewrites the row's data file. Commits skip delta-rs' post-commit hooks; instead the
writer of each version divisible by CHECKPOINT_EVERY (100) writes a checkpoint, drops log files
older than RETENTION and vacuums data files removed longer than RETENTION ago (`maintain`),
best effort: maintenance trouble never turns a won commit into a lost lease. Loads then read one
checkpoint plus < 100 JSON commits and a directory of a few thousand files at most.

Where: the table lives under a warehouse location, a local path or an object-store URI
(`s3://bucket/prefix`, dispatch/storage.py) with delta-rs `storage_options`. The compare-and-swap
needs no lock service on S3: delta-rs writes commit file v+1 with `If-None-Match: *`, so two
writers of v+1 get one 200 and one 412 (`CommitFailedError`), exactly as two local writers get
one rename and one "file exists". tests/integration/test_lease_s3.py races contenders on a real
S3-compatible server to hold it to that.

A renew, a takeover or a read takes tens of milliseconds, far below the lease's period
(local disk and S3Proxy: BENCHMARKS.md, *The lease on object storage*,
bench/lease_failover_bench.py).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Literal

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake.exceptions import CommitFailedError, DeltaError

from dispatch import storage
from dispatch.delta_sql import query as delta_query
from dispatch.delta_sql import sql_text
from dispatch.settings import LeaseSettings

log = logging.getLogger(__name__)

LEASES = "leases"
CHECKPOINT_EVERY = 100
RETENTION = "interval 15 minutes"
"""Log and removed-file retention: readers only ever want the latest version of this table."""
_ATTEMPTS = 8
"""Loads per call: a commit lost to an unrelated writer (another group, a vacuum) is retried."""
_BACKOFF_S = 0.01
"""Up to this long (random) before a retry, so two writers do not stay in step."""
_LISTING_RACED = (
    "Invalid table version",
    "Kernel error: Generic delta kernel error:",
    "Kernel error: No table metadata or protocol found in delta log",
)
"""delta-rs' errors (1.6.6) for a `_delta_log` listing that lacks versions ("Expected contiguous
commit files", "Requested snapshot version ... is not available", "LogSegment end version 7 not
the same as the specified end version 8"; a listing that lost the checkpoint and the commits
before it finds no metadata at all): a listing that raced a writer on a store whose LIST
is not consistent with its PUTs (S3Proxy's filesystem backend drops the rest of a directory
when a temporary file vanishes under the listing). Retried as a lost race, at most _ATTEMPTS
times: a re-evaluation on a fresh listing is always safe (a commit of ours that did land is
found there as our own live row), it only costs time. Storage failures are OSErrors: not
retried."""

SCHEMA = pa.schema(
    [
        pa.field("group", pa.string(), nullable=False),
        pa.field("holder", pa.string(), nullable=False),
        pa.field("address", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("expires_at", pa.float64(), nullable=False),
        pa.field("acquired_at", pa.float64(), nullable=False),
        pa.field("renewed_at", pa.float64(), nullable=False),
    ]
)
_CONFIGURATION: dict[str, str | None] = {
    "delta.checkpointInterval": str(CHECKPOINT_EVERY),
    "delta.logRetentionDuration": RETENTION,
    "delta.deletedFileRetentionDuration": RETENTION,
}
_COLUMNS = ", ".join(f'"{name}"' for name in SCHEMA.names)
# Any commit since the loaded version fails ours: the check and the write see the same table.
_NO_RETRY = CommitProperties(max_commit_retries=0)
# Checkpoints and log cleanup run in `maintain`, outside the commit that decides the lease.
_NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)

_Outcome = Literal["done", "raced", "lost"]

_Sets = dict[str, object]
"""Column -> new value, for an UPDATE."""


@dataclass(frozen=True, slots=True)
class Lease:
    """What a holder knows of its lease (or anyone of the current row, from `read`)."""

    group: str
    holder: str
    address: str
    """The holder's base URL, where followers redirect to."""
    epoch: int
    expires_at: float
    renewed_at: float

    def is_live(self, now: float) -> bool:
        return now < self.expires_at


def serving_deadline(lease: Lease, settings: LeaseSettings) -> float:
    """The time after which the holder must stop dispatching (commit nothing more).

    A standby takes the lease once `expires_at <= now` on *its* clock; a clock running up to
    `clock_skew_margin_s` ahead of the holder's sees that moment that much earlier. Stopping
    the margin before expiry keeps two leaders from ever dispatching at once, as long as the
    skew stays within the margin (settings require renew_every_s + margin < ttl_s, so a
    healthy holder renews long before it reaches this deadline).
    """
    return lease.expires_at - settings.clock_skew_margin_s


def _number(value: float) -> str:
    # repr round-trips a float64 exactly, so a pinned expires_at matches the stored value.
    if not math.isfinite(value):
        raise ValueError(f"not a finite time: {value!r}")
    return repr(float(value))


def _listing_raced(error: Exception) -> bool:
    return isinstance(error, DeltaError) and str(error).startswith(_LISTING_RACED)


def _back_off(attempt: int) -> None:
    if attempt:
        time.sleep(random.uniform(0, _BACKOFF_S * attempt))


def _changes(old: Lease, new: Lease) -> _Sets:
    changed = ((field.name, getattr(new, field.name)) for field in fields(Lease))
    return {name: value for name, value in changed if value != getattr(old, name)}


def _literal(value: object) -> str:
    if isinstance(value, str):
        return sql_text(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no SQL literal for {value!r}")


def _lease_options(
    location: str, settings: LeaseSettings, options: Mapping[str, str] | None
) -> dict[str, str] | None:
    """delta-rs storage options for the lease table: the caller's, with every request (its
    retries included) bounded by ttl_s on an object store, since an answer that comes after the
    lease would have expired is worthless, and a holder stuck in one call stops renewing."""
    if not storage.is_object_store(location):
        return dict(options) if options else None
    bound = f"{settings.ttl_s:g}s"
    return {**(options or {}), "timeout": bound, "retry_timeout": bound}


class LeaseTable:
    """The `leases` table under `warehouse`; safe to share between threads (one lock).

    `warehouse` is a local path or an object-store URI; `storage_options` are delta-rs'
    (`dispatch.storage.storage_options(settings.storage, warehouse)`; none for a local path).

    One `DeltaTable` is kept and brought up to date incrementally before each read: loading
    the table afresh replays the log since the last checkpoint, an incremental update only
    what is new (an order of magnitude less CPU: BENCHMARKS.md, *The lease on object
    storage*), and a leader and its standbys read or renew twice a second, forever."""

    def __init__(
        self,
        warehouse: str | Path,
        settings: LeaseSettings,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        # Not dispatch.delta.tables: that module describes the tables Spark writes; this one is
        # delta-rs' alone (delta-rs cannot write every feature Spark may add).
        self.location = storage.join(warehouse, LEASES)
        """The table's location: an absolute path or a URI."""
        self.settings = settings
        self._options = _lease_options(self.location, settings, storage_options)
        self._lock = threading.RLock()
        self._table: DeltaTable | None = None
        self._create()

    @property
    def path(self) -> Path:
        """The table's folder, for a table on local disk (ValueError on an object store)."""
        return storage.local_path(self.location)

    # --- reading -------------------------------------------------------------------------

    def read(self, group: str) -> Lease | None:
        """The group's current row, from the latest version (expired or not), or None."""
        with self._lock:
            return self._row(self._latest(), group)

    # --- the holder's commits --------------------------------------------------------------

    def try_acquire(self, group: str, holder: str, address: str, now: float) -> Lease | None:
        """Take the group's lease: when it has no row (epoch 1), when its row expired (a new
        term, epoch + 1), or when `holder` holds it live (a renewal, same epoch). None when
        another holder's lease is live or another writer won the race."""
        expires_at = now + self.settings.ttl_s
        with self._lock:
            return self._acquire(group, holder, address, now, expires_at)

    def _acquire(
        self, group: str, holder: str, address: str, now: float, expires_at: float
    ) -> Lease | None:
        for attempt in range(_ATTEMPTS):
            _back_off(attempt)
            table = self._latest()
            current = self._row(table, group)
            if current is None:
                lease = Lease(group, holder, address, 1, expires_at, now)
                outcome = self._insert(table, lease)
            elif not current.is_live(now):
                lease = Lease(group, holder, address, current.epoch + 1, expires_at, now)
                takeover = _changes(current, lease) | {"acquired_at": now}
                outcome = self._update(table, current, takeover)
            elif current.holder == holder:
                lease = replace(current, address=address, expires_at=expires_at, renewed_at=now)
                outcome = self._update(table, current, _changes(current, lease))
            else:
                return None
            if outcome != "raced":
                return lease if outcome == "done" else None
        return None

    def renew(self, lease: Lease, now: float) -> Lease | None:
        """Extend the lease to now + ttl_s if the row still has its holder and epoch; else None."""
        expires_at = now + self.settings.ttl_s
        return self._change(lease, lambda row: replace(row, expires_at=expires_at, renewed_at=now))

    def advance(self, lease: Lease, epoch: int, now: float) -> Lease | None:
        """Raise the epoch of a lease still held to `epoch` (past epochs seen elsewhere, such as
        in the log), renewing it in the same commit; None when the lease was lost."""
        if epoch <= lease.epoch:
            raise ValueError(f"an epoch only grows: {epoch} <= {lease.epoch}")
        expires_at = now + self.settings.ttl_s
        return self._change(
            lease, lambda row: replace(row, epoch=epoch, expires_at=expires_at, renewed_at=now)
        )

    def release(self, lease: Lease, now: float) -> bool:
        """Step down gracefully: expire the row at once if it is still ours (epoch kept), so a
        standby takes over without waiting for ttl_s. Stop dispatching *before* calling this."""
        # Back-dated by the skew margin, so a standby whose clock lags ours sees it expired too.
        expired_at = now - self.settings.clock_skew_margin_s
        released = self._change(
            lease, lambda row: replace(row, expires_at=min(row.expires_at, expired_at))
        )
        return released is not None

    # --- upkeep ----------------------------------------------------------------------------

    def maintain(self, vacuum_retention_hours: int | None = None) -> None:
        """Checkpoint the latest version, drop expired log files, vacuum removed data files.

        Runs by itself every CHECKPOINT_EVERY versions; `vacuum_retention_hours` overrides
        RETENTION (0 removes every unreferenced file: for tests and operators, not for a live
        cluster whose readers may still be opening the previous version's file)."""
        with self._lock:
            self._maintain(self._latest(), vacuum_retention_hours)

    # --- internals -------------------------------------------------------------------------

    def _create(self) -> None:
        try:
            # No retries: with them, the loser of a creation race commits a second CREATE TABLE
            # (a new table id) as version 1 instead of failing (deltalake 1.6.6).
            DeltaTable.create(
                self.location,
                SCHEMA,
                mode="ignore",
                configuration=_CONFIGURATION,
                storage_options=self._options,
                commit_properties=_NO_RETRY,
            )
        except (DeltaError, OSError):
            # Another node committed version 0 between our existence check and our commit:
            # its table is the same as ours. Anything else (no table after all) is real.
            if not DeltaTable.is_deltatable(self.location, storage_options=self._options):
                raise

    def _latest(self) -> DeltaTable:
        """The kept table at its latest version (a fresh load if updating it failed)."""
        table = self._table
        if table is not None:
            try:
                table.update_incremental()
            except (DeltaError, OSError) as error:
                if _listing_raced(error):
                    log.info("lease table %s: log listing raced a writer; reloading", self.location)
                else:
                    log.warning("lease table %s: reloading", self.location, exc_info=True)
                table = None
        if table is None:
            table = self._table = self._load()
        return table

    def _load(self) -> DeltaTable:
        """The table loaded afresh; a load whose listing raced a writer is tried again."""
        for attempt in range(_ATTEMPTS):
            _back_off(attempt)
            try:
                return DeltaTable(self.location, storage_options=self._options)
            except DeltaError as error:
                if not _listing_raced(error) or attempt == _ATTEMPTS - 1:
                    raise
                log.info("lease table %s: log listing raced a writer; loading again", self.location)
        raise AssertionError("unreachable")

    def _row(self, table: DeltaTable, group: str) -> Lease | None:
        # Through DataFusion (`delta_sql.query`): `to_pyarrow_table` goes through delta-rs'
        # pyarrow filesystem wrapper, after which the interpreter aborts at exit ("terminate
        # called without an active exception", deltalake 1.6.6).
        sql = f'SELECT {_COLUMNS} FROM leases WHERE "group" = {sql_text(group)}'
        rows = delta_query(table, "leases", sql).to_pylist()
        if not rows:
            return None
        # One row per group (inserts are merges on the group); the highest epoch if ever not.
        row = max(rows, key=lambda r: r["epoch"])
        return Lease(*(row[field.name] for field in fields(Lease)))

    def _change(self, lease: Lease, change: Callable[[Lease], Lease]) -> Lease | None:
        """Replace the row by `change(row)` if it still has the lease's holder and epoch."""
        with self._lock:
            return self._change_locked(lease, change)

    def _change_locked(self, lease: Lease, change: Callable[[Lease], Lease]) -> Lease | None:
        for attempt in range(_ATTEMPTS):
            _back_off(attempt)
            table = self._latest()
            current = self._row(table, lease.group)
            if current is None or (current.holder, current.epoch) != (lease.holder, lease.epoch):
                return None
            changed = change(current)
            outcome = self._update(table, current, _changes(current, changed))
            if outcome != "raced":
                return changed if outcome == "done" else None
        return None

    def _update(self, table: DeltaTable, current: Lease, sets: _Sets) -> _Outcome:
        if not sets:
            return "done"  # e.g. released twice: nothing to commit
        predicate = (
            f'"group" = {sql_text(current.group)} AND "holder" = {sql_text(current.holder)}'
            f' AND "epoch" = {current.epoch} AND "expires_at" = {_number(current.expires_at)}'
        )
        updates = {column: _literal(value) for column, value in sets.items()}
        return self._commit(
            table,
            "num_updated_rows",
            lambda: table.update(
                updates=updates,
                predicate=predicate,
                commit_properties=_NO_RETRY,
                post_commithook_properties=_NO_HOOKS,
            ),
        )

    def _insert(self, table: DeltaTable, lease: Lease) -> _Outcome:
        row = {**asdict(lease), "acquired_at": lease.renewed_at}
        source = pa.Table.from_pylist([row], schema=SCHEMA)
        # A MERGE, not an append: even a commit that somehow rebased could not add a 2nd row.
        merger = table.merge(
            source,
            predicate='t."group" = s."group"',
            source_alias="s",
            target_alias="t",
            commit_properties=_NO_RETRY,
            post_commithook_properties=_NO_HOOKS,
        ).when_not_matched_insert_all()
        return self._commit(table, "num_target_rows_inserted", merger.execute)

    def _commit(
        self, table: DeltaTable, count: str, run: Callable[[], dict[str, object]]
    ) -> _Outcome:
        try:
            metrics = run()
        except CommitFailedError:
            return "raced"
        except DeltaError as error:
            if _listing_raced(error):
                # Usually raised before our commit file was written (delta-rs lists newer
                # versions first); either way, re-evaluate on a fresh listing.
                log.info("lease table %s: log listing raced a writer; retrying", self.location)
                return "raced"
            log.warning("lease table %s: commit failed", self.location, exc_info=True)
            return "lost"
        except OSError:
            # Storage trouble: the lease is not ours as far as we know. If the commit did land,
            # the holder's next try_acquire finds itself holding it live and renews it.
            log.warning("lease table %s: commit failed", self.location, exc_info=True)
            return "lost"
        if metrics.get(count) != 1:
            return "lost"
        if table.version() % CHECKPOINT_EVERY == 0:
            self._maintain(table, None)
        return "done"

    def _maintain(self, table: DeltaTable, vacuum_retention_hours: int | None) -> None:
        try:
            table.create_checkpoint()
            table.cleanup_metadata()
            table.vacuum(
                retention_hours=vacuum_retention_hours,
                dry_run=False,
                enforce_retention_duration=vacuum_retention_hours is None,
                post_commithook_properties=_NO_HOOKS,
            )
        except (DeltaError, OSError):
            log.warning("lease table %s: maintenance failed", self.location, exc_info=True)
