"""The benchmarks' worker: a WebSocket worker that acks every no-op job at once.

One copy for every bench that needs jobs done as fast as the node hands them out
(`bench/e2e.py`, `bench/memory_bench.py`): it joins with `batch` assignments, grants
`credit`, acks what arrived in the last 2 ms in one `acks` message (what a busy worker SDK
does too) and grants back, per `settled_many`, as many credits as jobs settled (acks return
no credit: docs/spec.md §5, the worker grants more when ready).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any


async def run_acking_worker(
    url: str,
    key: str,
    worker_id: str,
    credit: int,
    *,
    connected: Callable[[], None],
    settled: Callable[[int], None],
) -> None:
    """Serve `bench.>` jobs on the node at `url` until the socket closes or the task is
    cancelled; `connected()` once the credit is granted, `settled(n)` per settled batch."""
    import websockets  # the worker's process only

    stream = url.replace("http://", "ws://") + "/v1/stream"
    headers = {"Authorization": f"Bearer {key}"}
    async with websockets.connect(
        stream, additional_headers=headers, proxy=None, max_queue=None, compression=None
    ) as socket:
        hello = {"type": "hello", "role": "worker", "worker_id": worker_id,
                 "subjects": ["job.assign.bench.>"], "batch": True}  # fmt: skip
        await socket.send(json.dumps(hello))
        await socket.send(json.dumps({"type": "credit", "credits": credit}))
        connected()
        pending: list[dict[str, Any]] = []

        async def flush_acks() -> None:
            while True:
                await asyncio.sleep(0.002)
                if pending:
                    batch = pending[:]
                    pending.clear()
                    await socket.send(json.dumps({"type": "acks", "acks": batch}))

        flusher = asyncio.create_task(flush_acks())
        try:
            async for raw in socket:
                message = json.loads(raw)
                if message["type"] == "assign_many":
                    pending += [
                        {"id": job["id"], "attempt": job["attempt"], "lease": job["lease"],
                         "result": None}
                        for job in message["assignments"]
                    ]  # fmt: skip
                elif message["type"] == "settled_many":
                    count = len(message["results"])
                    settled(count)
                    await socket.send(json.dumps({"type": "credit", "credits": count}))
        finally:
            flusher.cancel()
