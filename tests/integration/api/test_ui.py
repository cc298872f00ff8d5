"""The dashboard at `/ui`, driven in a real headless Chromium against a real API node on the
session's Kafka broker; and its JSON view `GET /v1/overview`, read over HTTP.

Chromium is Debian's (`scripts/bootstrap.sh --with-browser` installs it); Playwright only
drives it, so nothing is downloaded. Every browser request must go to the node under test:
the page works offline.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Route, expect, sync_playwright

from dispatch.settings import Settings
from tests.integration.api.conftest import RunningNode, poll

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("DISPATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
"""The browser binary: Debian's chromium unless DISPATCH_CHROMIUM names another."""

SUBJECTS = ["job.assign.ui.*"]

NO_VALUE = "\N{EN DASH}"
"""What the page shows where it has no value yet."""

# The page refreshes once a second and a leader commit takes a few ms; 15 s leaves room for
# a slow CI machine without hiding a page that never updates.
expect.set_options(timeout=15_000)


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    """The API tests' settings, with timeouts long enough that nothing times out while a
    test watches a job on the page (the page refreshes once a second)."""
    dispatcher = api_settings.dispatcher.model_copy(
        update={"ack_timeout_s": 60.0, "max_ack_timeout_s": 60.0, "worker_expiry_s": 60.0}
    )
    return api_settings.model_copy(update={"dispatcher": dispatcher})


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `scripts/bootstrap.sh --with-browser`")
    with sync_playwright() as playwright:
        # Containers often run tests as root, where Chromium refuses to start sandboxed; a
        # small /dev/shm there crashes tabs unless Chromium keeps its memory elsewhere.
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Dashboard:
    """The page of one test, with every request it made and every script error it hit."""

    page: Page
    node: RunningNode
    requests: list[str] = field(default_factory=list)
    script_errors: list[str] = field(default_factory=list)

    def open(self, role: str = "admin") -> None:
        """Load `/ui` and connect with the dev key of `role`."""
        self.page.goto(f"{self.node.url}/ui")
        self.page.fill("#api-key", self.node.keys[role])
        self.page.click("#key-save")

    def foreign_requests(self) -> list[str]:
        """Requests to anywhere but the node under test (data: URLs are not requests)."""
        origin = urlsplit(self.node.url).netloc
        return [
            url
            for url in self.requests
            if urlsplit(url).scheme != "data" and urlsplit(url).netloc != origin
        ]

    def check_clean(self) -> None:
        assert self.foreign_requests() == []
        assert self.script_errors == []


@pytest.fixture
def dashboard(browser: Browser, api_node: RunningNode) -> Iterator[Dashboard]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        board = Dashboard(page, api_node)
        origin = urlsplit(api_node.url).netloc

        def only_the_node(route: Route) -> None:
            # Refused, not just recorded: a page that needs the internet fails here too.
            if urlsplit(route.request.url).netloc == origin:
                route.continue_()
            else:
                route.abort()

        context.route("**/*", only_the_node)
        page.on("request", lambda request: board.requests.append(request.url))
        page.on("pageerror", lambda error: board.script_errors.append(str(error)))

        def console_error(message: ConsoleMessage) -> None:
            # A refused key or a 404 lookup is logged by Chromium as a failed resource
            # load; only script errors count.
            if message.type == "error" and "Failed to load resource" not in message.text:
                board.script_errors.append(message.text)

        page.on("console", console_error)
        yield board
    finally:
        context.close()


def _ack(worker: httpx.Client, assignment: dict[str, object], result: object) -> None:
    answer = worker.post(
        f"/v1/jobs/{assignment['id']}/ack",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"], "result": result},
    )
    assert answer.status_code == 200, answer.text


def _fail(
    worker: httpx.Client, assignment: dict[str, object], error: str, *, retryable: bool
) -> None:
    answer = worker.post(
        f"/v1/jobs/{assignment['id']}/fail",
        json={
            "attempt": assignment["attempt"],
            "lease": assignment["lease"],
            "error": error,
            "retryable": retryable,
        },
    )
    assert answer.status_code == 200, answer.text


def _take(worker: httpx.Client, worker_id: str, job_id: str) -> dict[str, object]:
    """Poll as `worker_id` until it is handed `job_id`."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for assignment in poll(worker, worker_id, SUBJECTS, credits=1, wait_s=2.0):
            assert assignment["id"] == job_id, assignment
            return assignment
    raise AssertionError(f"{worker_id} was never handed {job_id}")


# --- the page in a browser ------------------------------------------------------------------


def test_the_dashboard_follows_a_job_from_submission_to_done_and_shows_the_leader(
    dashboard: Dashboard, api_node: RunningNode
) -> None:
    page = dashboard.page
    dashboard.open()
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        leader = admin.get("/v1/leader").json()
        expect(page.locator("#leader-epoch")).to_have_text(str(leader["epoch"]))
        expect(page.locator("#leader-address")).to_have_text(api_node.url)
        expect(page.locator("#connection")).to_have_attribute("data-state", "live")

        submitted = admin.post(
            "/v1/jobs", json={"id": "ui-job", "exec": "ui.work", "payload": {"n": 1}}
        )
        assert submitted.status_code == 202, submitted.text
        queue_row = page.locator("#queues tr[data-key='ui.work']")
        expect(queue_row.locator("td").nth(1)).to_have_text("1")  # ready
        expect(page.locator("#total-queued")).to_have_text("1")
        # The look-up box follows the job live, from queued to succeeded.
        page.fill("#lookup-id", "ui-job")
        page.click("#lookup-go")
        status = page.locator("#lookup-result dd[data-field='status']")
        expect(status).to_have_text("queued")

        assignment = _take(worker, "ui-worker", "ui-job")
        in_flight = page.locator("#inflight tr[data-key='ui-job']")
        expect(in_flight).to_contain_text("ui-worker")
        expect(in_flight).to_contain_text("1 / 3")
        expect(page.locator("#workers tr[data-key='ui-worker']")).to_be_visible()
        expect(queue_row.locator("td").nth(3)).to_have_text("1")  # running
        expect(status).to_have_text("running")

        _ack(worker, assignment, {"ok": True})
        finished = page.locator("#finished tr[data-key='ui-job']")
        expect(finished).to_contain_text("succeeded")
        expect(finished).to_contain_text("ui-worker")
        expect(in_flight).to_have_count(0)
        expect(status).to_have_text("succeeded")
        expect(page.locator("#lookup-result dd[data-field='result']")).to_have_text('{"ok":true}')
        expect(page.locator("#total-succeeded")).to_have_text("1")
        # The charts are drawn from the history: their legends show the latest values.
        expect(page.locator("#legend-throughput .legend-value").first).not_to_have_text(NO_VALUE)
        expect(page.locator("#legend-backlog .legend-value").first).not_to_have_text(NO_VALUE)
    dashboard.check_clean()


def test_the_look_up_shows_a_retrying_job_s_next_attempt_and_an_expired_job(
    dashboard: Dashboard, api_node: RunningNode
) -> None:
    page = dashboard.page
    dashboard.open()
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        body: dict[str, object] = {
            "id": "ui-retry", "exec": "ui.work", "retry": {"delay_s": 600, "jitter": 0},
        }  # fmt: skip
        assert admin.post("/v1/jobs", json=body).status_code == 202
        _fail(worker, _take(worker, "ui-worker", "ui-retry"), "database down", retryable=True)
        page.fill("#lookup-id", "ui-retry")
        page.click("#lookup-go")
        status = page.locator("#lookup-result dd[data-field='status']")
        expect(status).to_have_text("retrying")
        expect(page.locator("#lookup-result dd[data-field='next attempt']")).to_have_text(
            "in 10 min"
        )

        body = {"id": "ui-expired", "exec": "ui.nobody", "ttl_s": 0.5}
        assert admin.post("/v1/jobs", json=body).status_code == 202
        page.fill("#lookup-id", "ui-expired")
        page.click("#lookup-go")
        expect(status).to_have_text("expired")
        expect(page.locator("#total-expired")).to_have_text("1")
    dashboard.check_clean()


def test_the_look_up_shows_a_time_limit_and_cancels_a_running_job(
    dashboard: Dashboard, api_node: RunningNode
) -> None:
    page = dashboard.page
    dashboard.open()
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        body = {"id": "ui-long", "exec": "ui.work", "max_run_s": 3600, "timeout_s": 600}
        assert admin.post("/v1/jobs", json=body).status_code == 202
        assignment = _take(worker, "ui-worker", "ui-long")
        page.fill("#lookup-id", "ui-long")
        page.click("#lookup-go")
        status = page.locator("#lookup-result dd[data-field='status']")
        expect(status).to_have_text("running")
        expect(page.locator("#lookup-result dd[data-field='time limit']")).to_have_text(
            re.compile(r"^3600 s, stops in (59|60) min$")
        )
        page.locator("#lookup-result button[data-action='cancel']").click()
        expect(page.locator(".toast-ok")).to_have_text("Cancelled ui-long: cancelling")
        expect(status).to_have_text("cancelling")
        expect(page.locator("#lookup-result dd[data-field='cancel asked']")).to_be_visible()
        # The worker stops, as told: the job ends cancelled, and the page offers no cancel.
        _fail(worker, assignment, "stopped", retryable=False)
        page.click("#lookup-go")
        expect(status).to_have_text("cancelled")
        expect(page.locator("#lookup-result button[data-action='cancel']")).to_have_count(0)
        job = admin.get("/v1/jobs/ui-long").json()
        assert job["status"] == "cancelled"
    dashboard.check_clean()


def test_a_paused_queue_is_marked_and_the_look_up_shows_progress(
    dashboard: Dashboard, api_node: RunningNode
) -> None:
    page = dashboard.page
    dashboard.open()
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        admin.put("/v1/pauses/exec/ui.held", json={"reason": "maintenance"}).raise_for_status()
        admin.post("/v1/jobs", json={"id": "ui-held", "exec": "ui.held"}).raise_for_status()
        held = page.locator("#queues tr[data-key='ui.held']")
        expect(held).to_have_class(re.compile(r"\bpaused\b"))
        expect(held.locator(".paused-badge")).to_have_text("paused")

        body = {"id": "ui-progress", "exec": "ui.work", "timeout_s": 600}
        admin.post("/v1/jobs", json=body).raise_for_status()
        assignment = _take(worker, "ui-worker", "ui-progress")
        beat = worker.post(
            "/v1/jobs/ui-progress/heartbeat",
            json={
                "attempt": assignment["attempt"],
                "lease": assignment["lease"],
                "progress": {"done": 30, "total": 120, "message": "resizing"},
            },
        )
        assert beat.status_code == 200, beat.text
        page.fill("#lookup-id", "ui-progress")
        page.click("#lookup-go")
        expect(page.locator("#lookup-result dd[data-field='progress']")).to_contain_text(
            "30 / 120 (25 %) resizing"
        )

        admin.delete("/v1/pauses/exec/ui.held").raise_for_status()
        expect(held.locator(".paused-badge")).to_have_count(0)
    dashboard.check_clean()


def test_the_limits_panel_shows_each_limit_and_what_it_holds_and_tenants_their_limit(
    dashboard: Dashboard, api_node: RunningNode
) -> None:
    page = dashboard.page
    dashboard.open()
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        limit = {"max_inflight": 1, "reason": "one at a time"}
        admin.put("/v1/limits/key/ui:acct", json=limit).raise_for_status()
        admin.put("/v1/limits/client/ui-tenant", json={"max_inflight": 5, "rate": 2})
        for n in range(3):
            body = {"id": f"ui-k{n}", "exec": "ui.keyed", "key": "ui:acct",
                    "client_id": "ui-tenant"}  # fmt: skip
            admin.post("/v1/jobs", json=body).raise_for_status()
        _take(worker, "ui-worker", "ui-k0")
        # A worker with room: the limit holds the other two back.
        assert poll(worker, "ui-worker", SUBJECTS, credits=3, wait_s=0.3) == []

        row = page.locator("#limits tr[data-key='key|ui:acct']")
        cells = row.locator("td")
        expect(cells.nth(1)).to_have_text("ui:acct")
        expect(cells.nth(2)).to_have_text("1")
        expect(cells.nth(3)).to_have_text(NO_VALUE)
        expect(cells.nth(5)).to_have_text("1")  # running
        expect(cells.nth(6)).to_have_text("2")  # held
        expect(row).to_have_class(re.compile(r"\bholding\b"))
        expect(cells.nth(7)).to_have_text("runtime")
        expect(cells.nth(8)).to_have_text("dev-admin")
        expect(cells.nth(9)).to_have_text("one at a time")
        tenant = page.locator("#tenants tr[data-key='ui-tenant'] .limit-badge")
        expect(tenant).to_have_text("≤ 5 running · 2/s (burst 2)")

        page.fill("#lookup-id", "ui-k1")
        page.click("#lookup-go")
        expect(page.locator("#lookup-result dd[data-field='key']")).to_have_text("ui:acct")

        admin.delete("/v1/limits/key/ui:acct").raise_for_status()
        expect(row).to_have_count(0)
    dashboard.check_clean()


def test_a_queue_no_worker_serves_is_marked_until_one_joins(
    dashboard: Dashboard, api_node: RunningNode
) -> None:
    page = dashboard.page
    dashboard.open()
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        expect(page.locator("#connection")).to_have_attribute("data-state", "live")
        for job_id, exec_name in (("orphan-1", "orphan.resize"), ("served-1", "ui.served")):
            submitted = admin.post("/v1/jobs", json={"id": job_id, "exec": exec_name})
            assert submitted.status_code == 202, submitted.text
        # A worker of ui.* joins (it takes nothing: no credit): only orphan.resize is unserved.
        assert poll(worker, "ui-worker", SUBJECTS, credits=0, wait_s=0.0) == []
        orphan = page.locator("#queues tr[data-key='orphan.resize']")
        served = page.locator("#queues tr[data-key='ui.served']")
        expect(orphan).to_have_class("unserved")
        expect(orphan.locator(".unserved-badge")).to_have_text("no worker")
        expect(orphan.locator("td").first).to_have_attribute(
            "title", "no worker serves this exec now: its jobs wait until one does"
        )
        expect(served.locator("td").nth(1)).to_have_text("1")  # ready
        expect(served).not_to_have_class("unserved")
        expect(served.locator(".unserved-badge")).to_have_count(0)

        # One joins whose wildcard covers it: the mark goes.
        assert poll(worker, "orphan-worker", ["job.assign.orphan.>"], credits=0, wait_s=0) == []
        expect(orphan.locator(".unserved-badge")).to_have_count(0)
        expect(orphan).not_to_have_class("unserved")
        expect(orphan.locator("td").first).to_have_text("orphan.resize")
    dashboard.check_clean()


def test_a_dead_letter_is_redriven_from_the_page(
    dashboard: Dashboard, api_node: RunningNode
) -> None:
    page = dashboard.page
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        admin.post("/v1/jobs", json={"id": "ui-doomed", "exec": "ui.work"})
        assignment = _take(worker, "ui-worker", "ui-doomed")
        _fail(worker, assignment, "the disk is on fire", retryable=False)
        assert admin.get("/v1/jobs/ui-doomed").json()["status"] == "dead"

        dashboard.open()
        dead_row = page.locator("#dlq tr[data-key='ui-doomed']")
        expect(dead_row).to_contain_text("permanent_failure")
        expect(dead_row).to_contain_text("the disk is on fire")
        failure_row = page.locator("#failures tr[data-key='ui-doomed']")
        expect(failure_row).to_contain_text("dead")
        expect(page.locator("#total-dead")).to_have_text("1")

        dead_row.locator("button[data-action='redrive']").click()
        expect(page.locator(".toast-ok")).to_have_text("Redriven ui-doomed: queued")
        expect(dead_row).to_have_count(0)
        expect(page.locator("#dlq tr.empty")).to_have_count(1)

        job = admin.get("/v1/jobs/ui-doomed").json()
        assert (job["status"], job["attempts"], job["dead_reason"]) == ("queued", 0, None)
        assert admin.get("/v1/dlq").json()["jobs"] == []
        # Queued again for real: a worker gets it as a first attempt.
        again = _take(worker, "ui-worker", "ui-doomed")
        assert again["attempt"] == 1
    dashboard.check_clean()


def test_the_page_asks_again_for_a_refused_key_and_explains_a_non_admin_key(
    dashboard: Dashboard,
) -> None:
    page = dashboard.page
    page.goto(f"{dashboard.node.url}/ui")
    expect(page.locator("#key-form")).to_be_visible()
    page.fill("#api-key", "dk_admin_not-a-real-key")
    page.click("#key-save")
    expect(page.locator("#notice")).to_contain_text("refused")
    expect(page.locator("#key-form")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('dispatch.apiKey')") is None

    page.fill("#api-key", dashboard.node.keys["client"])
    page.click("#key-save")
    expect(page.locator("#notice")).to_contain_text("admin role")

    page.click("#key-forget")
    dashboard.open("admin")
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")
    expect(page.locator("#notice")).to_be_hidden()
    # The key lives in this tab's session only, and a reload keeps the page connected.
    page.reload()
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")
    expect(page.locator("#key-form")).to_be_hidden()
    dashboard.check_clean()


# --- over HTTP ------------------------------------------------------------------------------


def test_the_page_and_its_files_are_served_offline_with_a_strict_policy(
    api_node: RunningNode,
) -> None:
    with httpx.Client(base_url=api_node.url, timeout=10) as anonymous:
        page = anonymous.get("/ui")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        for name, media_type in [
            ("app.js", "text/javascript"),
            ("charts.js", "text/javascript"),
            ("style.css", "text/css"),
        ]:
            served = anonymous.get(f"/ui/static/{name}")
            assert served.status_code == 200, name
            assert served.headers["content-type"].startswith(media_type)
            assert "http://" not in served.text and "https://" not in served.text, name
        assert "http://" not in page.text and "https://" not in page.text
        for missing in ("index.html", "nope.js", "..%2Fui_history.py", "%2E%2E%2Fapp.py"):
            answer = anonymous.get(f"/ui/static/{missing}")
            assert answer.status_code == 404, missing
            assert answer.json()["error"] == "not_found"
        assert anonymous.get("/v1/overview").status_code == 401
    with api_node.client("client") as client:
        assert client.get("/v1/overview").status_code == 403


def test_the_overview_lists_in_flight_jobs_failures_finishes_and_history(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        first = admin.get("/v1/overview").json()  # starts the history's sampling
        assert first["node"] == api_node.url
        assert first["epoch"] == admin.get("/v1/leader").json()["epoch"]
        assert first["in_flight"] == {"total": 0, "jobs": []}
        assert first["recent_failures"] == [] and first["recently_finished"] == []

        # One job at a time: submissions on two partitions may be consumed in any order.
        admin.post("/v1/jobs", json={"id": "done", "exec": "ui.work", "payload": "big"})
        _ack(worker, _take(worker, "w1", "done"), "fine")
        admin.post("/v1/jobs", json={"id": "flaky", "exec": "ui.work"})
        _fail(worker, _take(worker, "w1", "flaky"), "try again", retryable=True)
        retry = _take(worker, "w2", "flaky")  # attempt 2, running with its last error
        assert retry["attempt"] == 2
        admin.post("/v1/jobs", json={"id": "doomed", "exec": "ui.work"})
        _fail(worker, _take(worker, "w1", "doomed"), "broken", retryable=False)
        time.sleep(2.2)  # the work's last counts land in a point, and one more point follows

        overview = admin.get("/v1/overview", params={"limit": 10}).json()
        assert overview["counts"]["running"] == 1 and overview["counts"]["dead"] == 1
        assert overview["in_flight"]["total"] == 1
        [running] = overview["in_flight"]["jobs"]
        assert (running["id"], running["worker_id"], running["attempts"]) == ("flaky", "w2", 2)
        assert "payload" not in running and "lease" not in running
        failures = {job["id"]: job for job in overview["recent_failures"]}
        assert set(failures) == {"flaky", "doomed"}
        assert (failures["flaky"]["status"], failures["flaky"]["error"]) == (
            "running",
            "try again",
        )
        assert failures["doomed"]["dead_reason"] == "permanent_failure"
        assert [job["id"] for job in overview["recently_finished"]] == ["done"]
        assert overview["server_time"] == pytest.approx(time.time(), abs=5)

        history = overview["history"]
        assert len(history) >= 2 and overview["history_interval_s"] == 1.0
        assert [point["t"] for point in history] == sorted(point["t"] for point in history)
        # One job each over intervals of a second or (on a busy machine) a little more.
        assert 0.5 < sum(point["completed"] for point in history) <= 1.1
        assert 0.5 < sum(point["dead"] for point in history) <= 1.1
        assert any(point["dispatch_p50"] is not None for point in history)
        assert history[-1]["in_flight"] == 1

        later = admin.get("/v1/overview", params={"since": history[-1]["t"]}).json()
        assert all(point["t"] > history[-1]["t"] for point in later["history"])
        limited = admin.get("/v1/overview", params={"limit": 1}).json()
        assert len(limited["recent_failures"]) == 1
        assert admin.get("/v1/overview", params={"limit": 0}).status_code == 422
