"""The ids of jobs that finished within the dedup window, in bounded memory.

The leader keeps a finished job in memory for minutes (`dispatcher.finished_window_s`, at
most `dispatcher.finished_max` of them); Delta keeps it for as long as its retention says. A
resubmitted id must still be answered as the existing job for `dispatcher.dedup_window_s`
(a day by default), but asking Delta about every new id would put object storage on the
submit path. So the leader keeps, for the dedup window, a Bloom filter of the ids that
finished: a new id (nearly always) is answered "not finished" in a few microseconds, and only
an id the filter may hold is looked up in Delta (`dispatch.delta.job_lookup.find_jobs`).

The filter is a ring of generations, each covering a quarter of the window: an id is added
to the generation of its finish time, and a generation is dropped once all of it is older
than the window. Its size is fixed (`dispatcher.dedup_filter_mb`), whatever the rate: at a
rate past what it was sized for, more new ids are false positives and cost a Delta lookup;
memory does not grow.

A new term starts with an empty filter and fills it from Delta (the ids that finished within
the window: `dispatch.delta.job_lookup.finished_ids_since`) in a thread of its own; until that
is done, `may_hold` answers True for every id, so every unknown id is looked up in Delta: exact,
slower, and only for the first seconds of a term.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator

log = logging.getLogger(__name__)

GENERATIONS = 4
"""Generations covering the window (one more is filling): an id is held from its finish for
the window and at most a quarter of it more."""

HASHES = 7
"""Bits set per id: the best count for about 10 bits per id (a 1 % false-positive rate)."""
_HASH_INDEXES = range(HASHES)


class _Generation:
    __slots__ = ("bits", "count", "start")

    def __init__(self, start: int, size_bytes: int) -> None:
        self.start = start
        self.bits = bytearray(size_bytes)
        self.count = 0


class FinishedIds:
    """A Bloom filter of the ids finished within `window_s` (see the module's docstring).

    Thread-safe: the leader loop adds, request handlers ask, and the rebuild adds from its
    own thread."""

    def __init__(self, window_s: float, size_bytes: int) -> None:
        self.window_s = window_s
        self.span_s = window_s / GENERATIONS
        self._per_generation = max(64, size_bytes // (GENERATIONS + 1))
        self._bit_count = self._per_generation * 8
        self._generations: dict[int, _Generation] = {}
        self._lock = threading.Lock()
        self.loaded = threading.Event()
        """Set once the ids that finished before this term are in (see `rebuild`)."""

    def _positions(self, job_id: str) -> list[int]:
        # Python's own string hash (SipHash, cached on the string, keyed per process: the
        # filter lives in one process and is rebuilt by the next), split into the two halves
        # of double hashing. A hashlib digest cost several times more on the submit path.
        code = hash(job_id) & 0xFFFF_FFFF_FFFF_FFFF
        first = code & 0xFFFF_FFFF
        step = (code >> 32) | 1
        bits = self._bit_count
        return [(first + i * step) % bits for i in _HASH_INDEXES]

    def add(self, job_id: str, finished_at: float) -> None:
        self.add_many(((job_id, finished_at),))

    def add_many(self, finished: Iterable[tuple[str, float]]) -> None:
        """Record ids with their finish times (ids older than the window are left out)."""
        with self._lock:
            for job_id, finished_at in finished:
                index = int(finished_at // self.span_s)
                generation = self._generations.get(index)
                if generation is None:
                    if not self._admit(index):
                        continue
                    generation = self._generations[index] = _Generation(index, self._per_generation)
                bits = generation.bits
                for position in self._positions(job_id):
                    bits[position >> 3] |= 1 << (position & 7)
                generation.count += 1

    def _admit(self, index: int) -> bool:
        """Whether a generation `index` may be made now, dropping those it outlives."""
        newest = max(self._generations, default=index)
        if index < newest - GENERATIONS:
            return False  # finished before the window of the newest generation
        for old in [start for start in self._generations if start < index - GENERATIONS]:
            del self._generations[old]
        return True

    def may_hold(self, job_id: str) -> bool:
        """False: `job_id` did not finish within the window (certain). True: it may have."""
        if not self.loaded.is_set():
            return True
        positions = self._positions(job_id)
        # No lock: the tuple is taken in one step under the GIL, and a generation dropped
        # meanwhile only answers for ids that are leaving anyway.
        for generation in tuple(self._generations.values()):
            bits = generation.bits
            for p in positions:
                if not bits[p >> 3] & (1 << (p & 7)):
                    break
            else:
                return True
        return False

    def ids_held(self) -> int:
        """How many ids were added to the generations held (an id added twice counts twice)."""
        with self._lock:
            return sum(generation.count for generation in self._generations.values())

    def memory_bytes(self) -> int:
        with self._lock:
            return len(self._generations) * self._per_generation

    def rebuild(self, batches: Callable[[], Iterator[list[tuple[str, float]]]]) -> None:
        """Add what `batches` yields (the ids Delta holds as finished within the window), then
        mark the filter loaded. A failure leaves it unloaded: every unknown id is then looked
        up in Delta, which is slower but never wrong."""
        try:
            total = 0
            for batch in batches():
                self.add_many(batch)
                total += len(batch)
        except Exception as error:  # noqa: BLE001  (the term serves on, checking Delta)
            log.warning(
                "finished ids: the rebuild from Delta failed (%r): every id that is "
                "not in memory is looked up in Delta this term",
                error,
            )
            return
        log.info("finished ids: %d ids of the last %.0f s from Delta", total, self.window_s)
        self.loaded.set()
