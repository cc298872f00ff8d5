"""The node's Prometheus metrics stay small and cheap whatever exec names clients choose."""

from __future__ import annotations

from api.metrics import MAX_EXEC_LABELS, OTHER_EXEC, QUEUE_DEPTH_EVERY_S, Metrics
from dispatch.core import Dispatcher
from tests.unit.core.helpers import T0, make, request, worker


def _depths(metrics: Metrics) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["exec"], sample.labels["state"]): sample.value
        for metric in metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "dispatch_queue_depth"
    }


def _submit(core: Dispatcher, count: int, start: int = 0) -> None:
    core.submit_many(
        [request(f"j{n}", f"kind{n:05}.run", client_id=f"c{n % 20}") for n in range(start, count)],
        T0,
    )


def test_exec_labels_are_bounded_and_the_rest_is_summed_under_other() -> None:
    core = make()
    _submit(core, 10_000)
    metrics = Metrics()
    metrics.observe_committed(core, [])
    depths = _depths(metrics)
    execs = {exec_name for exec_name, _ in depths}
    assert len(execs) == MAX_EXEC_LABELS + 1 and OTHER_EXEC in execs
    assert depths[("kind00000.run", "ready")] == 1
    assert depths[(OTHER_EXEC, "ready")] == 10_000 - MAX_EXEC_LABELS
    assert sum(value for (_, state), value in depths.items() if state == "ready") == 10_000
    assert len(metrics.render()) < 40_000  # 10,000 series made it 1.36 MB


def test_with_few_execs_the_depth_is_exact_after_every_commit() -> None:
    clock = [0.0]
    core = make()
    metrics = Metrics(clock=lambda: clock[0])
    core.submit(request("a", "x.run"), T0)
    metrics.observe_committed(core, [])
    core.submit(request("b", "x.run"), T0)
    metrics.observe_committed(core, [])  # no time passed: still refreshed
    assert _depths(metrics)[("x.run", "ready")] == 2
    events = worker(core, "w", credits=1)
    metrics.observe_committed(core, events)
    assert _depths(metrics)[("x.run", "ready")] == 1
    assert metrics.in_flight._value.get() == 1


def test_with_many_execs_the_depth_is_refreshed_at_most_every_interval() -> None:
    clock = [0.0]
    core = make()
    metrics = Metrics(clock=lambda: clock[0])
    _submit(core, MAX_EXEC_LABELS + 50)
    metrics.observe_committed(core, [])
    core.submit(request("late", "kind00000.run"), T0)
    metrics.observe_committed(core, [])
    assert _depths(metrics)[("kind00000.run", "ready")] == 1
    clock[0] += QUEUE_DEPTH_EVERY_S
    metrics.observe_committed(core, [])
    assert _depths(metrics)[("kind00000.run", "ready")] == 2
