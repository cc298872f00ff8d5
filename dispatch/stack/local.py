"""The embedded local stack as one unit: what `dispatch up`, `down` and `status` act on.

The Kafka broker and its topics, then an API node (the leader of the default group). The
streaming query and a standby node join as their issues land: each is another managed process,
started in order and stopped in reverse.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from dispatch.settings import Settings, to_environment
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.process import ManagedProcess, ProcessError

DISPATCH = str(Path(sys.executable).parent / "dispatch")
NODE_READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    address: str
    log_file: Path

    @property
    def running(self) -> bool:
        return self.pid is not None


class ApiNode:
    """`dispatch serve` on one port, as a managed process."""

    def __init__(self, settings: Settings, port: int) -> None:
        self.settings = settings
        self.port = port
        self.url = f"http://{settings.api.host}:{port}"
        run_dir = settings.paths.var / "run"
        self.process = ManagedProcess(
            f"api-{port}", run_dir, settings.paths.var / "logs" / f"api-{port}.log"
        )

    def start(self) -> None:
        # The child gets exactly these settings, whatever its environment or working folder.
        environment = {**os.environ, **to_environment(self.settings)}
        self.process.start([DISPATCH, "serve", "--port", str(self.port)], env=environment)
        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.record() is None:
                raise ProcessError(
                    f"the API node on port {self.port} exited during start; see "
                    f"{self.process.log_file}:\n{self.process.log_tail()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise ProcessError(
            f"the API node on port {self.port} was not ready in time; see {self.process.log_file}"
        )


class LocalStack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.broker = Broker(settings)
        self.nodes = [ApiNode(settings, settings.api.ports[0])]

    def up(self) -> list[str]:
        """Start every component that is not running; returns the topics it had to create."""
        from api.auth import ensure_dev_keys  # the API package is heavier than the stack's

        if self.broker.running() is None:
            self.broker.start()
        created = create_topics(self.settings.kafka)
        ensure_dev_keys(self.settings.auth)
        for node in self.nodes:
            if node.process.record() is None:
                node.start()
        return created

    def down(self) -> list[str]:
        """Stop every running component, last started first; returns the names stopped."""
        stopped = [
            node.process.name for node in reversed(self.nodes) if node.process.stop(timeout_s=20.0)
        ]
        if self.broker.stop():
            stopped.append("broker")
        return stopped

    def status(self) -> list[ComponentStatus]:
        record = self.broker.running()
        components = [
            ComponentStatus(
                "broker",
                record.pid if record else None,
                self.settings.kafka.bootstrap,
                self.broker.log_file,
            )
        ]
        for node in self.nodes:
            node_record = node.process.record()
            components.append(
                ComponentStatus(
                    node.process.name,
                    node_record.pid if node_record else None,
                    node.url,
                    node.process.log_file,
                )
            )
        return components

    def wait_until_stopped(self, signals: StopSignals, poll_s: float = 1.0) -> str:
        """Block until a stop signal or until a component dies; returns why it returned."""
        while not signals.received.wait(poll_s):
            for component in self.status():
                if not component.running:
                    return f"{component.name} stopped unexpectedly; see {component.log_file}"
        return signals.name


class StopSignals:
    """SIGINT and SIGTERM set `received` instead of raising, while inside the `with`.

    Installed before `dispatch up` starts anything, so a Ctrl-C at any moment (even during
    start) ends in an orderly stop of what was started, never in a half-stopped stack."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.name = ""
        self._previous: dict[signal.Signals, Any] = {}

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.name = signal.Signals(signum).name
        self.received.set()

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
