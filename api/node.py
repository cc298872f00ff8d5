"""One API node: its part in the election, its leadership term (if any), the submit producer,
the hub and metrics.

Every node takes part in the election of its group (`dispatch.api.election`). While it holds the
lease, a supervisor thread runs a leadership term (`dispatch.api.leader.Leader`), which fences the
previous leader, rebuilds, and serves; when a term fails (fenced, broker lost) and the lease is
still held, it starts a new one. A node without the lease is a follower: `Node.leader()` raises
`LeaderUnavailable` naming the leader; a follower relays client calls to it
(`dispatch.api.forward`), and the worker routes turn it into a 307 to it.

Ready means working: `Node.ready` is true only while this node's term has completed a loop
iteration, and heard from the broker, within `stall_bound_s` (`Leader.not_working`). A term
whose loop stalls past that bound is abandoned: the node gives the lease up (a standby takes
over) and its supervisor starts a new term when it holds the lease again. A term that fails
to start is retried after RESTART_BACKOFF_S; a term refused because the log lost records
after the newest snapshot (`LogGap`) keeps the node not ready, with that reason.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Sequence
from typing import TypeVar

from dispatch.api.election import Election
from dispatch.api.hub import Hub
from dispatch.api.lag_metrics import LagGauges
from dispatch.api.leader import (
    Command,
    Leader,
    LeaderUnavailable,
    LogGap,
    preload_rebuild_modules,
)
from dispatch.api.leader_io import KafkaLeaderIO, NodeIO, SubmitSink
from dispatch.api.loop_commands import LoopCommand
from dispatch.api.metrics import Metrics
from dispatch.core.commands import SubmitRequest
from dispatch.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

RESTART_BACKOFF_S = (0.1, 0.25, 0.5, 1.0)
"""Pauses before retrying a term that did not start (the broker down, a rebuild that failed).
Short, so that a node serves within about a second of its broker answering again: a start
that fails costs only a refused connection while the broker is down."""

REFUSED_RETRY_S = 5.0
"""Pause before trying again to lead over a gap in the log (`LogGap`): the operator must act."""


class Node:
    def __init__(
        self, settings: Settings, node_id: str, address: str, *, io: NodeIO | None = None
    ) -> None:
        self.settings = settings
        self.io: NodeIO = io if io is not None else KafkaLeaderIO(settings)
        self.node_id = node_id
        self.address = address
        self.metrics = Metrics()
        self.lag = LagGauges(settings, self.metrics, self.io)
        self._leader: Leader | None = None
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._producer: SubmitSink | None = None
        self.hub: Hub | None = None
        self.terms = 0
        self.refused: str | None = None
        """Why this node refuses to lead (`LogGap`), until a term starts."""
        self._wake = threading.Event()
        self.election = Election(settings, node_id, address, on_change=self._wake.set)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.hub = Hub(asyncio.get_running_loop(), self.metrics)
        self._producer = await asyncio.to_thread(
            self.io.open_submit_sink, f"dispatch-{self.node_id}-submit"
        )
        await asyncio.to_thread(preload_rebuild_modules)
        self._supervisor = threading.Thread(
            target=self._supervise, name="dispatch-supervisor", daemon=True
        )
        self._supervisor.start()
        self.election.start()

    async def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        leader = self._leader
        if leader is not None:
            await asyncio.to_thread(leader.stop)
        if self._supervisor is not None:
            await asyncio.to_thread(self._supervisor.join, 15.0)
        # After the term stopped: the lease goes back only once nothing more can commit.
        await asyncio.to_thread(self.election.stop)
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close, 5)
        await asyncio.to_thread(self.lag.close)

    async def render_metrics(self) -> bytes:
        """Prometheus text, with the streaming lag refreshed when it is a few seconds old."""
        await self.lag.refresh()
        return self.metrics.render()

    def _supervise(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            if not self.election.held.is_set():
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            started = self._term()
            if not self._stopping.is_set():
                # The term's state (a million records in reference cycles, unfrozen by
                # `Leader.stop`) is garbage now: free it here, not frozen again by the next
                # rebuild (which runs with the collector off) nor kept until a full
                # collection, which the thresholds `dispatch.api.server` sets make rare.
                gc.collect()
            if started:
                failures = 0
            elif self.refused is not None:
                self._stopping.wait(REFUSED_RETRY_S)
            else:
                self._stopping.wait(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
                failures += 1

    def _term(self) -> bool:
        """One leadership term, until it fails or the lease is lost; False if it did not
        start. The Leader is dropped on return, so its state can be collected."""
        assert self.hub is not None
        leader = Leader(
            self.settings, self.node_id, self.hub, self.metrics,
            epoch_for=self.election.epoch_for,
            serving_until=self.election.serving_until, io=self.io,
        )  # fmt: skip
        try:
            leader.start()
        except LogGap as refusal:
            log.error("node %s: %s", self.node_id, refusal)
            self.refused = str(refusal)
            leader.stop()
            return False
        except Exception:
            log.exception("node %s could not start a leader term", self.node_id)
            leader.stop()
            return False
        self.refused = None
        self.terms += 1
        self._leader = leader
        self.metrics.is_leader.set(1)
        self.metrics.epoch.set(leader.core.epoch)
        while leader.running and self.election.held.is_set() and not self._stopping.is_set():
            if leader.stalled_s() > leader.stall_bound_s:
                # Ready must mean working: a loop stuck somewhere (a Kafka call past its
                # deadline, a bug) serves nobody; a standby may.
                log.error(
                    "node %s: the leader loop completed no iteration for %.1fs: giving up "
                    "the lease", self.node_id, leader.stalled_s(),
                )  # fmt: skip
                self.election.give_up("the leader loop stalled")
                break
            self._wake.wait(0.1)
            self._wake.clear()
        self.metrics.is_leader.set(0)
        self._leader = None
        leader.stop()
        return True

    # --- what request handlers use -----------------------------------------------------------

    def leader(self) -> Leader:
        """The ready leadership term of this node, or LeaderUnavailable."""
        leader = self._leader
        if leader is None or not leader.ready.is_set() or leader.error is not None:
            elsewhere = self.election.leader_address
            if elsewhere is not None and elsewhere != self.address:
                raise LeaderUnavailable(f"{elsewhere} leads; this node follows", leader=elsewhere)
            raise LeaderUnavailable("no leader is ready yet (an election or a rebuild is on)")
        return leader

    @property
    def ready(self) -> bool:
        """This node leads and its term works (see `not_ready_reason`)."""
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        """Why this node does not serve as the leader now, or None when it does: it follows,
        its term is starting or refused to lead, its loop stalled, or its broker is silent."""
        try:
            leader = self.leader()
        except LeaderUnavailable as unavailable:
            return self.refused or str(unavailable)
        if not leader.running:
            return "the leader term has stopped"
        return leader.not_working()

    async def call(self, command: LoopCommand[T]) -> T:
        """Run `command` on the leader loop; its answer, once what it decided is committed
        (a read: after the current iteration's commit)."""
        future = self.leader().submit(Command(command.decide, command.answer))
        answer: T = await asyncio.wrap_future(future)
        return answer

    async def produce_submissions(self, submissions: Sequence[SubmitRequest]) -> None:
        """Write submissions to `dispatch.submit`; returns once Kafka acknowledged all."""
        producer = self._producer
        if producer is None:
            raise LeaderUnavailable("the node is not started")
        await producer.send(submissions)
