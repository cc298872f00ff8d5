"""`GET /v1/tenants` on a real node (in-memory log): the Delta `stats` rows the streaming fold
writes, read with delta-rs, per client and exec against each client's wait target, beside
what the leader holds now. No Spark: the rows are built and rolled up with the fold's own code.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from deltalake import write_deltalake
from playwright.sync_api import expect

from dispatch.delta import tables as t
from dispatch.delta.stats import Histogram, MinuteStats, minute_of
from dispatch.settings import Settings
from dispatch.streaming.delta_commits import DeltaCommits
from dispatch.streaming.rollup import StatsRollup, stats_row
from dispatch.warehouse import Warehouse
from tests.integration.api import test_ui
from tests.integration.api.conftest import RunningNode, poll_until

pytestmark = pytest.mark.integration

# The dashboard tests' headless Chromium and page, for the Tenants panel.
browser = test_ui.browser
dashboard = test_ui.dashboard


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    """acme must wait at most 2 s, everyone else 10 s."""
    tenants = api_settings.tenants.model_copy(
        update={"wait_target_s": 10.0, "wait_targets": {"acme": 2.0}}
    )
    return api_settings.model_copy(update={"tenants": tenants})


def _stats(
    client_id: str, exec_name: str, waits: list[float], *, minute: int, **counters: int
) -> dict[str, Any]:
    """A `stats` row as the fold writes it."""
    stats = MinuteStats(queue_wait=Histogram())
    for wait in waits:
        stats.queue_wait.add(wait)
    stats.counters["started"] = len(waits)
    stats.counters.update(counters)
    return stats_row((minute, "default", exec_name, client_id), stats)


def _write_stats(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """The rows as partial statistics of one batch, rolled up into `stats` by the fold's own
    roll-up (a MERGE, as in production)."""
    warehouse = Warehouse.of(settings)
    for name in (t.STATS, t.STATS_PARTIAL):
        write_deltalake(
            warehouse.table(name), t.empty_table(name), partition_by=t.PARTITIONS[name] or None
        )
    partial = [
        {
            **{
                key: value
                for key, value in row.items()
                if not key.endswith(("p50_s", "p95_s", "p99_s"))
            },
            "batch_end": 1,
            "batch_id": 0,
        }
        for row in rows
    ]
    DeltaCommits(warehouse).append(
        t.STATS_PARTIAL,
        t.arrow_rows(t.STATS_PARTIAL, partial),
        app_id="test-fold",
        version=0,
        metadata="{}",
    )
    assert StatsRollup(warehouse, every_s=0).run("test-fold") == len(rows)


def _by_client(answer: httpx.Response) -> dict[str, dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    return {tenant["client_id"]: tenant for tenant in answer.json()["tenants"]}


def test_a_tenant_over_its_target_shows_breaches_and_its_live_jobs(api_node: RunningNode) -> None:
    now = minute_of(time.time())
    _write_stats(
        api_node.settings,
        [
            # acme (target 2 s): three of its five resize waits were over 2 s.
            _stats("acme", "resize", [0.5, 1.0, 3.0, 6.0], minute=now, submitted=4, completed=3),
            _stats("acme", "resize", [12.0], minute=now - 60, submitted=1, dead=1),
            _stats("acme", "encode", [0.2], minute=now - 60, submitted=1, completed=1),
            # globex (10 s): the same waits are within its target.
            _stats("globex", "resize", [0.5, 1.0, 3.0, 6.0], minute=now, submitted=4),
            # An hour ago: outside a 15-minute window.
            _stats("acme", "resize", [30.0], minute=now - 3600, submitted=1),
        ],
    )
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        accepted = admin.post(
            "/v1/jobs:batch",
            json={
                "jobs": [
                    *[{"id": f"acme-{n}", "exec": "resize", "client_id": "acme"} for n in range(3)],
                    {"id": "initech-1", "exec": "report", "client_id": "initech"},
                ]
            },
        )
        assert accepted.status_code == 202, accepted.text
        api_node.wait_known("initech-1")
        poll_until(worker, "w1", ["job.assign.resize"], 1)
        tenants = _by_client(admin.get("/v1/tenants"))

    acme = tenants["acme"]
    assert acme["wait_target_s"] == 2.0
    assert acme["breaches"] == 3  # 3 s, 6 s and 12 s
    assert (acme["submitted"], acme["started"], acme["completed"], acme["dead"]) == (6, 6, 4, 1)
    assert acme["queue_wait_n"] == 6
    assert acme["queue_wait_max_s"] == 12.0
    assert acme["queue_wait_p50_s"] == pytest.approx(1.0, rel=0.05)
    assert acme["queue_wait_p99_s"] == pytest.approx(12.0, rel=0.05)
    assert (acme["queued"], acme["running"]) == (2, 1)
    execs = {row["exec"]: row for row in acme["execs"]}
    assert (execs["resize"]["breaches"], execs["encode"]["breaches"]) == (3, 0)
    assert (execs["resize"]["queued"], execs["resize"]["running"]) == (2, 1)

    globex = tenants["globex"]
    assert (globex["wait_target_s"], globex["breaches"], globex["submitted"]) == (10.0, 0, 4)
    # No statistics yet, but jobs waiting now: listed, with zero counts.
    initech = tenants["initech"]
    assert (initech["queued"], initech["submitted"], initech["breaches"]) == (1, 0, 0)
    assert initech["queue_wait_p50_s"] is None


def test_the_window_is_chosen_in_minutes_and_bounded(api_node: RunningNode) -> None:
    now = minute_of(time.time())
    _write_stats(
        api_node.settings,
        [
            _stats("acme", "resize", [3.0], minute=now, submitted=1),
            _stats("acme", "resize", [4.0], minute=now - 30 * 60, submitted=1),
        ],
    )
    with api_node.client("admin") as admin:
        assert _by_client(admin.get("/v1/tenants"))["acme"]["breaches"] == 1
        longer = admin.get("/v1/tenants", params={"minutes": 60})
        assert _by_client(longer)["acme"]["breaches"] == 2
        assert longer.json()["minutes"] == 60
        assert longer.json()["since"] == now - 59 * 60
        for bad in ("0", "1441", "soon"):
            refused = admin.get("/v1/tenants", params={"minutes": bad})
            assert refused.status_code == 422, refused.text
            body = refused.json()
            assert body["error"] == "invalid"
            assert "minutes" in body["detail"]


def test_only_admins_read_tenants(api_node: RunningNode) -> None:
    for role in ("client", "worker"):
        with api_node.client(role) as other:
            refused = other.get("/v1/tenants")
            assert refused.status_code == 403
            assert "admin" in refused.json()["detail"]
    assert httpx.get(f"{api_node.url}/v1/tenants").status_code == 401


def test_before_the_fold_wrote_statistics_the_list_is_empty(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin:
        answer = admin.get("/v1/tenants")
    assert answer.status_code == 200
    assert answer.json()["tenants"] == []


def test_the_tenant_gauges_are_on_the_metrics_page(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin:
        admin.post("/v1/jobs", json={"id": "gauge-1", "exec": "resize", "client_id": "acme"})
        api_node.wait_known("gauge-1")
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"{api_node.url}/metrics").text
        if 'dispatch_tenant_queued{client="acme"} 1.0' in text:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
    assert 'dispatch_tenant_queued{client="other"} 0.0' in text


def test_the_dashboard_marks_the_tenant_over_its_target(
    dashboard: test_ui.Dashboard, api_node: RunningNode
) -> None:
    now = minute_of(time.time())
    _write_stats(
        api_node.settings,
        [
            _stats("acme", "resize", [0.5, 3.0, 6.0], minute=now, submitted=3),
            _stats("globex", "resize", [0.5, 3.0, 6.0], minute=now, submitted=3),
        ],
    )
    page = dashboard.page
    dashboard.open()
    acme = page.locator("#tenants tr[data-key='acme']")
    expect(acme).to_have_attribute("data-breaching", "yes")
    expect(acme.locator("td.breaches")).to_have_text("2")
    expect(acme.locator("td").nth(9)).to_have_text("2.0 s")  # the target
    globex = page.locator("#tenants tr[data-key='globex']")
    expect(globex).to_have_attribute("data-breaching", "no")
    expect(globex.locator("td.breaches")).to_have_text("0")
    # Over their target first.
    expect(page.locator("#tenants tbody tr").first).to_have_attribute("data-key", "acme")
    expect(page.locator("#tenants-count")).to_have_text("(2, 1 over target)")
    dashboard.check_clean()
