"""Run one API node with uvicorn (`dispatch serve`)."""

from __future__ import annotations

import gc
import logging

import uvicorn

from api.app import create_app
from api.auth import KeyRing
from api.node import Node
from dispatch.settings import Settings

GC_THRESHOLDS = (10_000, 3, 100)
"""The node's cyclic-collector thresholds. A pause of the collector is a pause of every
request and of the leader's loop, so what matters is each pause's length, not their total:
a young generation of 10k objects takes ~2 ms to scan, and the middle one, emptied every
third young collection, under 20 ms. At (100_000, 50, 100), tuned for throughput, each young
collection took ~30 ms, every second or two at 2,500 jobs/s: most of submit→assign's p99
(BENCHMARKS.md, *End to end*); at (10_000, 10, 100) each middle one took up to 65 ms.
CPython's defaults (700, 10, 10) rescan the long-lived jobs held in the old generation far
too often. The rebuild pauses the collector and freezes what it built
(`api.leader.collector_paused`), whatever these are."""


def serve(settings: Settings, port: int, node_id: str | None = None) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # kafka-python logs every connection at INFO: only its warnings matter here.
    logging.getLogger("kafka").setLevel(logging.WARNING)
    host = settings.api.host
    # What clients are sent to (307s, the lease row): set api.advertise_url when host:port is
    # not how others reach this node (0.0.0.0 in a container, a proxy).
    address = settings.api.advertise_url or f"http://{host}:{port}"
    node = Node(settings, node_id or f"node-{port}", address)
    app = create_app(settings, node, KeyRing.load(settings.auth.keys_file))
    # Job messages are small JSON: compressing each costs more CPU than it saves on loopback
    # or a LAN.
    uvicorn.run(
        app, host=host, port=port, log_level="info", ws="websockets-sansio", lifespan="on",
        ws_per_message_deflate=False,
    )  # fmt: skip
