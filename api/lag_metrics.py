"""The streaming fold's lag on the API's `/metrics`: measured at scrape time, at most every few
seconds (a Kafka round trip and a delta-rs read each time).

The lag is Kafka's end offsets minus what the last committed batch recorded in `jobs`
(`dispatch.delta.lag`); it tells an operator the Delta tables (and so the notebooks, and the
snapshot a new leader rebuilds from) are behind the log, and by how much.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from dispatch.api.metrics import Metrics
from dispatch.settings import Settings

if TYPE_CHECKING:
    from dispatch.api.leader_io import LagSource, NodeIO

log = logging.getLogger(__name__)

REFRESH_EVERY_S = 5.0


class LagGauges:
    def __init__(self, settings: Settings, metrics: Metrics, io: NodeIO) -> None:
        self.settings = settings
        self.metrics = metrics
        self.io = io
        self._probe: LagSource | None = None
        self._measured_at = float("-inf")
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Update the gauges if they are older than REFRESH_EVERY_S (never raises)."""
        async with self._lock:
            if time.monotonic() - self._measured_at < REFRESH_EVERY_S:
                return
            self._measured_at = time.monotonic()
            try:
                await asyncio.to_thread(self._measure)
            except Exception:
                # A scrape must still answer: the other metrics matter more than this one.
                log.warning("measuring the streaming lag failed", exc_info=True)

    def _measure(self) -> None:
        from dispatch.delta.lag import last_batch_age_s  # delta-rs
        from dispatch.warehouse import Warehouse

        if self._probe is None:
            self._probe = self.io.open_lag_source("dispatch-api-lag")
            if self._probe is None:
                return  # no fold reads this log (an in-memory one)
        for topic, records in self._probe.measure().items():
            self.metrics.streaming_lag.labels(topic).set(records)
        age = last_batch_age_s(Warehouse.of(self.settings))
        self.metrics.streaming_batch_age.set(-1.0 if age is None else age)

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
        self._probe = None
