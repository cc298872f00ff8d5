"""The filter of recently finished ids: no id it was given is ever missed within the window,
new ids are rarely held, and its memory does not grow with the ids."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from dispatch.api.finished_ids import GENERATIONS, FinishedIds

DAY = 86_400.0


def loaded(window_s: float = DAY, size_bytes: int = 1 << 20) -> FinishedIds:
    ids = FinishedIds(window_s, size_bytes)
    ids.rebuild(lambda: iter(()))
    return ids


def test_an_id_finished_within_the_window_is_always_held() -> None:
    ids = loaded()
    finished = [uuid.uuid4().hex for _ in range(5_000)]
    start = 1_800_000_000.0
    ids.add_many((job_id, start + i * 10.0) for i, job_id in enumerate(finished))
    assert all(ids.may_hold(job_id) for job_id in finished)


def test_new_ids_are_rarely_held() -> None:
    ids = loaded(size_bytes=1 << 20)  # ~8.4 million bits for 5,000 ids: far under 1 %
    ids.add_many((uuid.uuid4().hex, 1_800_000_000.0) for _ in range(5_000))
    held = sum(ids.may_hold(uuid.uuid4().hex) for _ in range(20_000))
    assert held < 20_000 * 0.01


def test_ids_leave_once_their_generation_is_older_than_the_window() -> None:
    ids = loaded(window_s=100.0)
    ids.add("old", 1_000.0)
    ids.add("new", 1_000.0 + 100.0 * 2)  # two windows later: the old generation is gone
    assert ids.may_hold("new") and not ids.may_hold("old")
    # An id finished before the window of what the filter holds is not taken at all.
    ids.add("older", 900.0)
    assert not ids.may_hold("older")


def test_memory_is_fixed_whatever_the_rate() -> None:
    ids = loaded(window_s=100.0, size_bytes=1 << 20)
    for second in range(1_000):  # ten windows of ~200 ids a second
        ids.add_many((f"{second}-{i}", float(second)) for i in range(200))
        assert ids.memory_bytes() <= (1 << 20)
    assert ids.memory_bytes() >= (1 << 20) * GENERATIONS // (GENERATIONS + 1)


def test_until_loaded_every_id_may_be_held_and_a_failed_load_leaves_it_so() -> None:
    ids = FinishedIds(DAY, 1 << 16)
    assert ids.may_hold("anything")  # the term's first seconds: Delta answers instead

    def broken() -> Iterator[list[tuple[str, float]]]:
        raise OSError("object storage away")

    ids.rebuild(broken)
    assert ids.may_hold("anything") and not ids.loaded.is_set()
    ids.rebuild(lambda: iter([[("a", 1_800_000_000.0)]]))
    assert ids.loaded.is_set() and ids.may_hold("a") and ids.ids_held() == 1
