"""Epoch fencing over the event log.

A `leader_elected{epoch}` event raises the fence; any later event (in log order) whose epoch is
lower than the highest elected epoch seen so far is void: it was written by a deposed leader.
The leader's rebuild and the Spark fold both filter the log through it, so both ignore exactly
the same events.

Equivalent set-based rule (for a Spark window): keep event e iff
    e.epoch >= max(fence epoch before the batch,
                   max epoch of leader_elected events at or before e in log order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dispatch.core.events import Event, LeaderElected


class EpochFence:
    """Stateful filter; persist `epoch` between micro-batches to continue where it stopped."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: int = 0) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch: expected an integer >= 0, got {epoch!r}")
        self.epoch = epoch
        """The highest leader epoch elected so far."""

    def admit(self, event: Event) -> bool:
        """True if `event` is valid at this point of the log (and learn from it)."""
        if event.epoch < self.epoch:
            return False
        if type(event) is LeaderElected:
            self.epoch = event.epoch
        return True

    def filter(self, events: Iterable[Event]) -> Iterator[Event]:
        """The admitted events, in order."""
        admit = self.admit
        return (event for event in events if admit(event))

    def __repr__(self) -> str:
        return f"EpochFence(epoch={self.epoch})"


def fence_events(events: Iterable[Event], epoch: int = 0) -> tuple[list[Event], int]:
    """Filter a batch: (admitted events in order, fence epoch after the batch)."""
    fence = EpochFence(epoch)
    kept = list(fence.filter(events))
    return kept, fence.epoch
