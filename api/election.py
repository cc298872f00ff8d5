"""One node's side of the leader election: take, renew, watch and give back the group's lease.

The lease is a row of the Delta table `leases` (`dispatch.lease`): whoever holds an unexpired
row leads the dispatcher group. A thread of its own (`Election`) renews it every
`lease.renew_every_s`, or, on a standby, reads it that often and takes it once it expired.

The node's leadership term asks two things of it:
- `serving_until()`: the wall-clock time after which the term must commit nothing more: the
  lease's expiry minus `clock_skew_margin_s`, since another node, whose clock may run that much
  ahead, can see the lease expire that much earlier. A renewal that fails (another holder, a
  lost race, an I/O error) does not move it; the term then stops by itself at that time.
- `epoch_for(log_epoch)`: the epoch the term leads with: the lease's, advanced past the
  highest epoch in the log when needed (a second term under the same lease, or a lease table
  newer than the log). Only the holder advances it, by a conditional commit, so the epoch of
  the row is always above every epoch a leader ever wrote.

A node whose term cannot work (a stalled loop, a rebuild it must refuse) calls `give_up`: the
lease is released at once, and the node stands aside for one `ttl_s` before it tries to take
it again, so that a standby (whose loop may be fine) takes over first.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable

from dispatch.api.leader import LeaseExpired
from dispatch.lease import Lease, LeaseTable, serving_deadline
from dispatch.settings import Settings
from dispatch.warehouse import Warehouse

log = logging.getLogger(__name__)


class Election:
    def __init__(
        self,
        settings: Settings,
        node_id: str,
        address: str,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.group = settings.dispatcher.group
        self.node_id = node_id
        # The lease's holder: unique per process start, so a node restarted under the same
        # name (a container, `dispatch serve --node-id`) does not take its dead predecessor's
        # lease as its own; it waits for that lease to expire like any other node.
        self.holder = f"{node_id}/{secrets.token_hex(4)}"
        self.address = address
        self.on_change = on_change
        """Called (on the election thread) when this node gains or loses the lease."""
        self._table: LeaseTable | None = None
        self._lock = threading.Lock()  # renewals and epoch advances are commits on one row
        self._lease: Lease | None = None
        self._serving_until = 0.0
        self.leader_address: str | None = None
        """The base URL of the group's leader as last read (this node's own when it holds)."""
        self.held = threading.Event()
        self._stand_aside_until = 0.0
        """Wall-clock time before which this node does not try to take the lease (`give_up`)."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dispatch-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop taking part; give the lease back so a standby takes over at once."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10.0)
        with self._lock:
            lease, self._lease = self._lease, None
            self._serving_until = 0.0
            self.held.clear()
            if lease is not None and self._table is not None:
                try:
                    self._table.release(lease, time.time())
                except Exception:
                    # The lease then expires by itself within ttl_s: slower, not unsafe.
                    log.warning("node %s: could not release the lease", self.node_id, exc_info=True)

    def give_up(self, why: str) -> None:
        """Release the lease now (if held) and stand aside for one `ttl_s`; the term must
        have stopped committing first (`serving_until` is 0 from here on). Never raises."""
        with self._lock:
            lease = self._lease
            self._stand_aside_until = time.time() + self.settings.lease.ttl_s
            if lease is None:
                return
            self._lost(f"gave it up: {why}")
            if self._table is None:
                return
            try:
                self._table.release(lease, time.time())
            except Exception:
                # It then expires by itself within ttl_s: slower, not unsafe.
                log.warning("node %s: could not release the lease", self.node_id, exc_info=True)

    # --- what the term uses ----------------------------------------------------------------

    @property
    def lease(self) -> Lease | None:
        return self._lease

    def serving_until(self) -> float:
        return self._serving_until

    def epoch_for(self, log_epoch: int) -> int:
        with self._lock:
            lease = self._lease
            if lease is None or time.time() >= self._serving_until:
                raise LeaseExpired(f"node {self.node_id} no longer holds the lease")
            if lease.epoch > log_epoch:
                return lease.epoch
            assert self._table is not None
            advanced = self._table.advance(lease, log_epoch + 1, time.time())
            if advanced is None:
                self._lost("the lease changed while advancing its epoch")
                raise LeaseExpired(f"node {self.node_id} lost the lease")
            self._hold(advanced)
            return advanced.epoch

    # --- the election thread -----------------------------------------------------------------

    def _run(self) -> None:
        every_s = self.settings.lease.renew_every_s
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._step()
            except Exception:
                # I/O trouble with the lease table: keep trying; a holder's term stops by
                # itself at serving_until if renewals keep failing.
                log.warning("node %s: lease step failed", self.node_id, exc_info=True)
            self._stopping.wait(max(0.0, every_s - (time.monotonic() - started)))

    def _step(self) -> None:
        if self._table is None:
            warehouse = Warehouse.of(self.settings)
            self._table = LeaseTable(
                warehouse.location, self.settings.lease, warehouse.storage_options
            )
        table = self._table
        now = time.time()
        with self._lock:
            lease = self._lease
            if lease is not None:
                renewed = table.renew(lease, now)
                if renewed is not None:
                    self._hold(renewed)
                    return
                # Then read who holds it now, below, so 307s name the new leader at once.
                self._lost("another node holds it now")
            aside = now < self._stand_aside_until
            taken = None if aside else table.try_acquire(self.group, self.holder, self.address, now)
            if taken is not None:
                log.info("node %s: took the lease of %r, epoch %d", self.node_id, self.group,
                         taken.epoch)  # fmt: skip
                self._hold(taken)
                gained = True
            else:
                current = table.read(self.group)
                live = current is not None and current.expires_at > now
                self.leader_address = current.address if live and current else None
                gained = False
        if gained:
            self.on_change()

    def _hold(self, lease: Lease) -> None:
        self._lease = lease
        self._serving_until = serving_deadline(lease, self.settings.lease)
        self.leader_address = self.address
        self.held.set()

    def _lost(self, why: str) -> None:
        log.warning("node %s: lost the lease of %r (%s)", self.node_id, self.group, why)
        self._lease = None
        self._serving_until = 0.0
        self.leader_address = None
        self.held.clear()
        # Outside the lock would be nicer, but the callback only sets flags.
        self.on_change()
