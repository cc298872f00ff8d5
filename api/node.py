"""One API node: its leadership term (if any), the submit producer, the hub and metrics.

Today every node runs as leader of its group (the lease and followers arrive with the HA
issue); leadership lives behind `Node.leader()`, the one seam the election will change. When a
term fails (fenced, broker lost), a supervisor thread starts a new term, which rebuilds from
the log before it serves.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from kafka import KafkaProducer

from api.hub import Hub
from api.leader import Answer, Command, Decide, Leader, LeaderUnavailable
from api.metrics import Metrics
from dispatch.core.commands import SubmitRequest
from dispatch.settings import Settings
from dispatch.submit_records import submit_record_value

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


class Node:
    def __init__(self, settings: Settings, node_id: str, address: str) -> None:
        self.settings = settings
        self.node_id = node_id
        self.address = address
        self.metrics = Metrics()
        self._leader: Leader | None = None
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._producer: KafkaProducer | None = None
        self.hub: Hub | None = None
        self.terms = 0

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.hub = Hub(asyncio.get_running_loop(), self.metrics)
        self._producer = await asyncio.to_thread(
            KafkaProducer,
            bootstrap_servers=self.settings.kafka.bootstrap,
            client_id=f"dispatch-{self.node_id}-submit",
            acks="all",
            enable_idempotence=True,
            # A few ms of linger batch a REST batch into few produce requests; every new
            # batch would otherwise wake the sender thread (a syscall and a GIL hand-off).
            linger_ms=5,
            batch_size=256 * 1024,
            max_request_size=16 * 1024 * 1024,
        )
        self._supervisor = threading.Thread(
            target=self._supervise, name="dispatch-supervisor", daemon=True
        )
        self._supervisor.start()

    async def stop(self) -> None:
        self._stopping.set()
        leader = self._leader
        if leader is not None:
            await asyncio.to_thread(leader.stop)
        if self._supervisor is not None:
            await asyncio.to_thread(self._supervisor.join, 15.0)
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close, 5)

    def _supervise(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            assert self.hub is not None
            leader = Leader(self.settings, self.node_id, self.hub, self.metrics)
            try:
                leader.start()
            except Exception:
                log.exception("node %s could not start a leader term", self.node_id)
                leader.stop()
                self._stopping.wait(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
                failures += 1
                continue
            failures = 0
            self.terms += 1
            self._leader = leader
            self.metrics.is_leader.set(1)
            self.metrics.epoch.set(leader.core.epoch)
            while leader.running and not self._stopping.is_set():
                self._stopping.wait(0.1)
            self.metrics.is_leader.set(0)
            self._leader = None
            leader.stop()

    # --- what request handlers use -----------------------------------------------------------

    def leader(self) -> Leader:
        """The ready leadership term of this node, or LeaderUnavailable."""
        leader = self._leader
        if leader is None or not leader.ready.is_set() or leader.error is not None:
            raise LeaderUnavailable("no leader is ready on this node yet")
        return leader

    @property
    def ready(self) -> bool:
        try:
            return self.leader().running
        except LeaderUnavailable:
            return False

    async def call(self, decide: Decide, answer: Answer | None = None) -> Any:
        """Run a command on the leader loop; resolves after its commit."""
        future = self.leader().submit(Command(decide, answer))
        return await asyncio.wrap_future(future)

    async def read(self, answer: Answer) -> Any:
        """Read committed state (answered after the current iteration's commit)."""
        return await self.call(lambda core, now: [], answer)

    async def produce_submissions(self, submissions: Iterable[SubmitRequest]) -> None:
        """Write submissions to `dispatch.submit`; returns once Kafka acknowledged all."""
        producer = self._producer
        if producer is None:
            raise LeaderUnavailable("the node is not started")
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[None]] = []
        topic = self.settings.kafka.submit_topic
        for submission in submissions:
            done: asyncio.Future[None] = loop.create_future()
            sent = producer.send(
                topic, key=submission.id.encode(), value=submit_record_value(submission)
            )
            sent.add_callback(lambda _meta, d=done: loop.call_soon_threadsafe(_settle, d, None))
            sent.add_errback(lambda error, d=done: loop.call_soon_threadsafe(_settle, d, error))
            waits.append(done)
        started = time.monotonic()
        await asyncio.gather(*waits)
        log.debug("%d submissions acknowledged in %.3fs", len(waits), time.monotonic() - started)


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
