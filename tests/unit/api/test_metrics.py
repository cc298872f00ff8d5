"""The node's Prometheus metrics stay small and cheap whatever exec names clients choose."""

from __future__ import annotations

from dispatch.api.metrics import (
    MAX_EXEC_LABELS,
    OTHER_CLIENTS,
    OTHER_EXEC,
    QUEUE_DEPTH_EVERY_S,
    TENANT_LOAD_EVERY_S,
    TENANT_WALK_EVERY_COMMIT,
    Metrics,
    top_clients,
)
from dispatch.core import Dispatcher
from dispatch.core.queries import ClientLoad
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


# --- per-tenant series ------------------------------------------------------------------------


def _tenants(metrics: Metrics) -> dict[str, tuple[float, float]]:
    """client label -> (queued, running)."""
    queued: dict[str, float] = {}
    running: dict[str, float] = {}
    for metric in metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "dispatch_tenant_queued":
                queued[sample.labels["client"]] = sample.value
            elif sample.name == "dispatch_tenant_running":
                running[sample.labels["client"]] = sample.value
    assert queued.keys() == running.keys()
    return {client: (queued[client], running[client]) for client in queued}


def test_a_flood_of_client_ids_keeps_the_tenant_series_bounded() -> None:
    core = make()
    # 5,000 clients with one job each, and three deep ones.
    core.submit_many([request(f"j{n}", "x.run", client_id=f"c{n:05}") for n in range(5_000)], T0)
    core.submit_many(
        [request(f"deep{n}", "x.run", client_id=f"deep{n % 3}") for n in range(30)], T0
    )
    metrics = Metrics(tenant_series=5)
    metrics.observe_committed(core, [])
    series = _tenants(metrics)
    assert len(series) == 5 + 1
    assert {"deep0", "deep1", "deep2", OTHER_CLIENTS} <= series.keys()
    assert series["deep0"] == (10.0, 0.0)
    # Nothing lost: the other bucket holds every job of the clients without a series.
    assert sum(queued for queued, _running in series.values()) == 5_030
    assert metrics.tenant_other_clients._value.get() == 5_000 - 2
    assert len(metrics.render()) < 10_000


def test_a_client_leaving_the_top_loses_its_series_and_running_jobs_are_counted() -> None:
    core = make()
    core.submit_many(
        [
            *[request(f"a{n}", "x.run", client_id="acme") for n in range(3)],
            *[request(f"g{n}", "y.run", client_id="globex") for n in range(2)],
        ],
        T0,
    )
    metrics = Metrics(tenant_series=1)
    metrics.observe_committed(core, [])
    assert _tenants(metrics) == {"acme": (3, 0), OTHER_CLIENTS: (2, 0)}
    # acme's jobs start (running, no longer queued): globex has the deepest queue now.
    events = worker(core, "w", subjects=["job.assign.x.>"], credits=3)
    metrics.observe_committed(core, events)  # a small walk: refreshed after every commit
    assert _tenants(metrics) == {"globex": (2, 0), OTHER_CLIENTS: (0, 3)}


def test_with_a_long_walk_the_tenants_are_refreshed_at_most_every_interval() -> None:
    clock = [0.0]
    core = make()
    clients = TENANT_WALK_EVERY_COMMIT + 10  # one lane each
    core.submit_many([request(f"j{n}", "x.run", client_id=f"c{n}") for n in range(clients)], T0)
    metrics = Metrics(clock=lambda: clock[0], tenant_series=1)
    metrics.observe_committed(core, [])
    assert _tenants(metrics)["c0"] == (1, 0)
    core.submit(request("more", "x.run", client_id="c0"), T0)
    metrics.observe_committed(core, [])
    assert _tenants(metrics)["c0"] == (1, 0)
    clock[0] += TENANT_LOAD_EVERY_S
    metrics.observe_committed(core, [])
    assert _tenants(metrics)["c0"] == (2, 0)


def test_a_client_named_like_the_bucket_is_summed_into_it() -> None:
    kept, rest, others = top_clients({OTHER_CLIENTS: ClientLoad(7, 1), "acme": ClientLoad(1, 0)}, 5)
    assert kept == {"acme": ClientLoad(1, 0)}
    assert (rest, others) == (ClientLoad(7, 1), 1)
