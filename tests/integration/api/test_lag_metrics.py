"""The streaming fold's lag on `/metrics`, measured against the real broker and warehouse:
with no fold running, every committed record of the three topics is lag."""

from __future__ import annotations

import re
import time

import pytest

from dispatch.api import lag_metrics
from tests.integration.api.conftest import RunningNode

pytestmark = pytest.mark.integration


def gauge(text: str, name: str, labels: str = "") -> float | None:
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_metrics_show_what_the_delta_tables_lack(
    broker_api_node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Measure at every scrape here (the node caches the figure for REFRESH_EVERY_S).
    monkeypatch.setattr(lag_metrics, "REFRESH_EVERY_S", 0.0)
    kafka = broker_api_node.settings.kafka
    with broker_api_node.client("client") as client:
        jobs = [{"id": f"lag-{n}", "exec": "lag.test"} for n in range(3)]
        assert client.post("/v1/jobs:batch", json={"jobs": jobs}).status_code == 202
    submit_label = f'{{topic="{kafka.submit_topic}"}}'
    deadline = time.monotonic() + 20
    with broker_api_node.client() as admin:
        while True:
            text = admin.get("/metrics").text
            submitted = gauge(text, "dispatch_streaming_lag_records", submit_label)
            if submitted == 3.0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert submitted == 3.0, text
    # The leader's own transactions on the events topic are lag too, until a fold runs.
    events = gauge(text, "dispatch_streaming_lag_records", f'{{topic="{kafka.events_topic}"}}')
    assert events is not None and events >= 1
    assert gauge(text, "dispatch_streaming_last_batch_age_seconds") == -1.0
