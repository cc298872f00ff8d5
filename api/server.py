"""Run one API node with uvicorn (`dispatch serve`)."""

from __future__ import annotations

import gc
import logging

import uvicorn

from api.app import create_app
from api.auth import KeyRing
from api.node import Node
from dispatch.settings import Settings


def serve(settings: Settings, port: int, node_id: str | None = None) -> None:
    # The core holds a million small objects; CPython's default GC thresholds rescan them
    # constantly (the core benchmark gains about a quarter with these).
    gc.set_threshold(100_000, 50, 100)
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
