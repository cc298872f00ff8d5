"""The embedded local stack as one unit: what `dispatch up`, `down` and `status` act on.

Today it is the Kafka broker and its topics; the streaming query and the API nodes join it as
their issues land, each as another managed process started in order and stopped in reverse.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from dispatch.settings import Settings
from dispatch.stack.broker import Broker, create_topics


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    address: str
    log_file: Path

    @property
    def running(self) -> bool:
        return self.pid is not None


class LocalStack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.broker = Broker(settings)

    def up(self) -> list[str]:
        """Start every component that is not running; returns the topics it had to create."""
        if self.broker.running() is None:
            self.broker.start()
        return create_topics(self.settings.kafka)

    def down(self) -> list[str]:
        """Stop every running component, last started first; returns the names stopped."""
        return ["broker"] if self.broker.stop() else []

    def status(self) -> list[ComponentStatus]:
        record = self.broker.running()
        return [
            ComponentStatus(
                "broker",
                record.pid if record else None,
                self.settings.kafka.bootstrap,
                self.broker.log_file,
            )
        ]

    def wait_until_stopped(self, poll_s: float = 1.0) -> str:
        """Block until SIGINT/SIGTERM or until a component dies; returns why it returned."""
        stop = threading.Event()
        reason = ["interrupted"]

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            reason[0] = signal.Signals(signum).name
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not stop.wait(poll_s):
                if self.broker.running() is None:
                    return f"the broker stopped unexpectedly; see {self.broker.log_file}"
            return reason[0]
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
