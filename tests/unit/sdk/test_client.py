"""Pure parts of the client SDK: configuration, the backoff schedule, error mapping, node
routing and the retry decision of one try."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from dispatch.client import (
    Backoff,
    BadRequest,
    Client,
    Conflict,
    DispatchError,
    Forbidden,
    Invalid,
    NodeRouter,
    NotFound,
    ServerError,
    Submission,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unreachable,
    UntrustedRedirect,
    _Call,
    _Done,
    _Tries,
    _Waiting,
    default_api_key,
    default_urls,
    error_from_body,
    error_from_response,
    leader_from_redirect,
    parse_urls,
    stream_url,
    submission_of,
)
from dispatch.http_transport import Answer, TransportError
from tests.unit.sdk.httpx_transport import HttpxTransport

# --- backoff --------------------------------------------------------------------------------


def test_the_backoff_ceiling_doubles_up_to_its_cap() -> None:
    backoff = Backoff(initial_s=0.1, multiplier=2.0, max_s=1.0)
    assert [backoff.ceiling(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff.ceiling(10_000) == 1.0  # no float overflow after many tries


def test_jitter_spreads_each_pause_below_its_ceiling() -> None:
    backoff = Backoff(initial_s=1.0, multiplier=2.0, max_s=8.0, jitter=0.5)
    assert backoff.delay(2, draw=lambda: 0.0) == 4.0
    assert backoff.delay(2, draw=lambda: 0.999999) == pytest.approx(2.0, abs=1e-5)
    assert Backoff(jitter=0.0).delay(3, draw=lambda: 0.7) == Backoff(jitter=0.0).ceiling(3)
    for attempt in range(8):
        assert 0.5 * backoff.ceiling(attempt) <= backoff.delay(attempt) <= backoff.ceiling(attempt)


@pytest.mark.parametrize(
    "arguments",
    [{"initial_s": 0}, {"multiplier": 0.5}, {"max_s": 0.01}, {"jitter": 1.5}, {"jitter": -0.1}],
)
def test_a_nonsense_backoff_is_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**arguments)


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, BadRequest), (401, Unauthorized), (403, Forbidden), (404, NotFound), (409, Conflict),
     (413, TooLarge), (422, Invalid), (503, Unavailable), (500, ServerError), (502, ServerError),
     (418, DispatchError)],
)  # fmt: skip
def test_an_error_status_maps_to_its_exception(status: int, kind: type[DispatchError]) -> None:
    error = error_from_body(status, {"error": "some_code", "detail": "what happened"})
    assert type(error) is kind
    assert (error.status, error.error, error.detail) == (status, "some_code", "what happened")
    assert str(error) == "some_code: what happened"


@pytest.mark.parametrize(
    ("code", "kind"),
    [("forbidden", Forbidden), ("unauthorized", Unauthorized), ("invalid", Invalid),
     ("stale_lease", Conflict), ("not_dead", Conflict), ("unknown_worker", NotFound),
     ("unavailable", Unavailable), ("something_new", DispatchError)],
)  # fmt: skip
def test_a_socket_error_maps_by_its_code(code: str, kind: type[DispatchError]) -> None:
    error = error_from_body(None, {"type": "error", "error": code, "detail": "d"})
    assert type(error) is kind and error.status is None and error.error == code


def test_a_body_that_is_not_the_error_format_still_gives_a_typed_error() -> None:
    error = error_from_response(Answer(502, {}, b"<html>Bad gateway</html>"))
    assert isinstance(error, ServerError)
    assert (error.error, error.detail) == ("http_502", "<html>Bad gateway</html>")
    assert error_from_body(404, None).detail == "no detail"


# --- configuration --------------------------------------------------------------------------


def test_node_urls_are_parsed_from_a_list_or_a_comma_separated_string() -> None:
    assert parse_urls("http://a:1/, https://b:2 ,") == ["http://a:1", "https://b:2"]
    assert parse_urls(["http://a:1"]) == ["http://a:1"]
    for bad in ("", "a:1", "ftp://a", ["http://"]):
        with pytest.raises(ValueError):
            parse_urls(bad)
    assert stream_url("http://h:1") == "ws://h:1/v1/stream"
    assert stream_url("https://h") == "wss://h/v1/stream"


def test_urls_and_key_come_from_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_URL", "http://n1:8000,http://n2:8001")
    monkeypatch.setenv("DISPATCH_API_KEY", "secret")
    assert default_urls() == ["http://n1:8000", "http://n2:8001"]
    assert default_api_key() == "secret"
    monkeypatch.delenv("DISPATCH_URL")
    assert default_urls() == ["http://127.0.0.1:8000"]


def test_without_a_key_the_local_stack_client_key_is_used_not_the_admin_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dev_keys = tmp_path / "dev-keys.json"
    monkeypatch.delenv("DISPATCH_API_KEY", raising=False)
    monkeypatch.setenv("DISPATCH_AUTH__DEV_KEYS_FILE", str(dev_keys))
    assert default_api_key() is None  # no file yet
    dev_keys.write_text(
        json.dumps({"admin": "dk_admin_x", "client": "dk_client_y", "worker": "dk_worker_z"})
    )
    assert default_api_key() == "dk_client_y"
    assert Client("http://a").api_key == "dk_client_y"
    assert default_api_key("worker") == "dk_worker_z"
    assert default_api_key("admin") == "dk_admin_x"  # only when asked for
    with pytest.raises(ValueError, match="role"):
        default_api_key("root")
    dev_keys.write_text("not json")
    assert default_api_key() is None


# --- routing --------------------------------------------------------------------------------


def test_the_router_moves_on_after_a_failure_and_follows_redirects() -> None:
    router = NodeRouter(["http://a", "http://b"])
    assert router.current == "http://a"
    router.failed("http://a")
    assert router.current == "http://b"
    router.failed("http://a")  # someone else's stale failure: no move
    assert router.current == "http://b"
    router.failed("http://b")
    assert router.current == "http://a"
    router.redirect("http://b/")
    assert router.current == "http://b"
    router.redirect("http://a:9")  # another node on a configured host
    assert (router.current, router.urls) == ("http://a:9", ["http://a", "http://b", "http://a:9"])


@pytest.mark.parametrize(
    ("leader", "trusted"),
    [
        ("http://a:8000", True),
        ("http://a:9999", True),  # the same host, another port: a node of the same machine
        ("https://a:8443", True),  # an upgrade to TLS
        ("http://B:1", True),  # host names are not case-sensitive
        ("https://s:1", True),
        ("http://s:1", False),  # https configured: never downgraded to cleartext
        ("http://evil:8000", False),
        ("http://a.evil:8000", False),
        ("http://a:8000@evil:80", False),  # user info: the host is `evil`
        ("http://u:p@a:8000", False),
    ],
)
def test_a_redirect_is_trusted_only_to_a_configured_host(leader: str, trusted: bool) -> None:
    router = NodeRouter(["http://a:8000", "http://b:8001", "https://s:443"])
    assert router.trusts(leader) is trusted
    if trusted:
        router.redirect(leader)
        assert router.current == leader.rstrip("/")
    else:
        with pytest.raises(UntrustedRedirect, match="not following it"):
            router.redirect(leader)
        assert router.current == "http://a:8000"
        assert leader not in router.urls


def test_a_leader_that_is_not_a_url_is_untrusted() -> None:
    with pytest.raises(UntrustedRedirect, match="not a node URL"):
        NodeRouter(["http://a"]).redirect("javascript:alert(1)")


def test_the_client_never_sends_its_key_to_a_foreign_leader() -> None:
    seen: list[httpx.Request] = []

    def node(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "a":
            # A follower (or whatever answers in its place) naming a leader elsewhere.
            return httpx.Response(
                307,
                headers={"Location": "http://evil:8000/v1/queues"},
                json={"error": "not_leader", "detail": "follower", "leader": "http://evil:8000"},
            )
        return httpx.Response(200, json={"queues": []})

    with Client("http://a:8000", "secret-key", retry_timeout_s=1.0) as client:
        client._transport = HttpxTransport(httpx.MockTransport(node))
        with pytest.raises(UntrustedRedirect, match="http://evil:8000") as raised:
            client.queues()
    assert raised.value.error == "untrusted_redirect"
    assert [request.url.host for request in seen] == ["a"]
    assert seen[0].headers["authorization"] == "Bearer secret-key"


def test_the_client_follows_a_redirect_to_another_node_of_a_configured_host() -> None:
    seen: list[str] = []

    def node(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}:{request.url.port}")
        if request.url.port == 8000:
            return httpx.Response(307, json={"error": "not_leader", "leader": "http://a:8001"})
        return httpx.Response(200, json={"queues": []})

    with Client("http://a:8000", "secret-key") as client:
        client._transport = HttpxTransport(httpx.MockTransport(node))
        assert client.queues() == []
    assert seen == ["a:8000", "a:8001"]


def test_the_leader_is_read_from_a_307_body_or_its_location() -> None:
    assert leader_from_redirect(Answer.of_json(307, {"leader": "http://l:1"})) == "http://l:1"
    by_location = Answer(307, {"Location": "http://l:2/v1/jobs/x?wait=1"})
    assert leader_from_redirect(by_location) == "http://l:2"
    assert leader_from_redirect(Answer.of_json(307, {"leader": None})) is None
    assert leader_from_redirect(Answer(307, {"location": "/relative"})) is None


# --- one try's outcome ----------------------------------------------------------------------


def _call(idempotent: bool = True) -> _Call[str]:
    return _Call("GET", "/v1/x", lambda response: str(response.json()["v"]), idempotent=idempotent)


def _pause(outcome: _Done[str] | float) -> float:
    assert isinstance(outcome, float), outcome
    return outcome


def _tries(budget_s: float = 30.0) -> _Tries:
    return _Tries(Backoff(initial_s=0.1, max_s=1.0, jitter=0.0), budget_s)


def test_one_try_ends_in_a_value_a_redirect_a_pause_or_an_error() -> None:
    with Client(["http://a", "http://b"], "key") as client:
        tries = _tries()
        assert client._outcome(_call(), "http://a", tries, Answer.of_json(200, {"v": 1})) == (
            _Done("1")
        )
        redirect = Answer.of_json(307, {"leader": "http://b"})
        assert client._outcome(_call(), "http://a", tries, redirect) == 0.0
        assert client.router.current == "http://b"
        busy = Answer.of_json(503, {"error": "unavailable", "detail": "rebuilding"})
        assert client._outcome(_call(), "http://b", tries, busy) == pytest.approx(0.1)
        assert client.router.current == "http://a"  # moved on to the next node
        with pytest.raises(NotFound):
            client._outcome(_call(), "http://a", tries, Answer.of_json(404, {}))


def test_a_503_waits_at_least_its_retry_after() -> None:
    with Client("http://a", "key") as client:
        busy = Answer.of_json(503, {}, {"Retry-After": "0.7"})
        assert client._outcome(_call(), "http://a", _tries(), busy) == pytest.approx(0.7)


def test_only_safe_requests_are_retried_after_a_network_error() -> None:
    refused = TransportError.connect_failed("refused")
    lost = TransportError.read_timeout("no answer")
    with Client("http://a", "key") as client:
        # Never sent: safe for anything.
        assert _pause(client._outcome(_call(idempotent=False), "http://a", _tries(), refused)) > 0
        # Sent, answer lost: safe only when a repeat does no harm.
        assert _pause(client._outcome(_call(idempotent=True), "http://a", _tries(), lost)) > 0
        with pytest.raises(Unavailable, match="ReadTimeout"):
            client._outcome(_call(idempotent=False), "http://a", _tries(), lost)


def test_retries_stop_when_the_budget_is_spent() -> None:
    with Client("http://a", "key") as client:
        # The budget counts the time spent so far plus the next pause (0.1 s, then 0.2 s).
        tries = _tries(budget_s=0.15)
        busy = Answer.of_json(503, {"error": "unavailable", "detail": "no leader"})
        assert client._outcome(_call(), "http://a", tries, busy) == pytest.approx(0.1)
        with pytest.raises(Unavailable, match="no leader"):
            client._outcome(_call(), "http://a", tries, busy)


def _refused(url: str) -> TransportError:
    return TransportError.connect_failed(f"{url}: [Errno 111] Connection refused")


def test_fail_fast_gives_up_once_every_node_refused_the_connection() -> None:
    with Client(["http://a", "http://b"], "key", fail_fast=True) as client:
        tries = client._tries()
        assert _pause(client._outcome(_call(), "http://a", tries, _refused("http://a"))) > 0
        with pytest.raises(Unreachable, match=r"http://a, http://b \(connection refused\)"):
            client._outcome(_call(), "http://b", tries, _refused("http://b"))
    # Without it (the SDK's default), refusals are retried for the whole budget.
    with Client(["http://a", "http://b"], "key") as client:
        tries = client._tries()
        for url in ("http://a", "http://b", "http://a"):
            assert _pause(client._outcome(_call(), url, tries, _refused(url))) > 0


def test_fail_fast_keeps_retrying_once_a_node_answered() -> None:
    """A node that answers 503 (an election) means something runs: the other's refusal is a
    leader that died, and the call waits for the next one within its budget."""
    with Client(["http://a", "http://b"], "key", fail_fast=True) as client:
        tries = client._tries()
        electing = Answer.of_json(503, {"error": "unavailable", "detail": "no leader"})
        assert _pause(client._outcome(_call(), "http://a", tries, electing)) > 0
        assert _pause(client._outcome(_call(), "http://b", tries, _refused("http://b"))) > 0
        assert _pause(client._outcome(_call(), "http://a", tries, _refused("http://a"))) > 0


def test_a_fail_fast_client_against_a_closed_port_fails_within_a_second() -> None:
    from dispatch.stack.ports import free_port

    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with Client(url, "key", fail_fast=True) as client, pytest.raises(Unreachable):
        client.get("x")
    assert time.monotonic() - started < 1.0


def test_endless_redirects_become_pauses() -> None:
    with Client("http://a", "key") as client:
        tries = _tries()
        loop = Answer.of_json(307, {"leader": "http://a"})
        pauses = [_pause(client._outcome(_call(), "http://a", tries, loop)) for _ in range(7)]
        assert pauses[:5] == [0.0] * 5 and all(pause > 0 for pause in pauses[5:])


def test_an_unauthorized_answer_says_how_to_get_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_AUTH__DEV_KEYS_FILE", "/nonexistent/dev-keys.json")
    monkeypatch.delenv("DISPATCH_API_KEY", raising=False)
    with Client("http://a") as client:
        assert client.api_key is None
        refused = Answer.of_json(401, {"error": "unauthorized", "detail": "missing key"})
        with pytest.raises(Unauthorized, match="DISPATCH_API_KEY"):
            client._outcome(_call(), "http://a", _tries(), refused)


# --- submissions and waiting ----------------------------------------------------------------


def test_a_submission_gets_its_id_before_it_is_sent() -> None:
    body = Submission(exec="a.b").to_body()
    assert body["exec"] == "a.b" and body["payload"] is None and len(body["id"]) == 32
    assert "max_attempts" not in body and "client_id" not in body
    assert Submission(exec="a.b").to_body()["id"] != body["id"]
    assert Submission(exec="a.b", id="mine", payload=[1]).to_body()["id"] == "mine"
    with pytest.raises(Invalid, match=r"job\.colour: Extra inputs are not permitted"):
        submission_of({"exec": "a.b", "colour": "red"})
    with pytest.raises(Invalid, match=r"jobs\[2\]\.max_attempts"):
        submission_of({"exec": "a.b", "max_attempts": 0}, "jobs[2]")


def test_a_wait_is_cut_into_long_polls_within_its_timeout() -> None:
    forever = _Waiting("j", None, poll_s=30.0)
    assert forever.step() == 30.0
    assert _Waiting("j", None, poll_s=500.0).step() == 60.0  # the server's cap
    short = _Waiting("j", 2.0, poll_s=30.0)
    assert 1.9 < short.step() <= 2.0
    missing = NotFound("no job 'j'", error="not_found", status=404)
    assert short.not_found(missing) == 0.05  # just accepted: not visible yet
    short.started -= 10  # long after the submit: it really does not exist
    with pytest.raises(NotFound):
        short.not_found(missing)


# --- cancel and the time limit --------------------------------------------------------------


def _job_answer(job_id: str, status: str) -> dict[str, object]:
    return {"id": job_id, "client_id": "c", "exec": "a.b", "status": status, "attempts": 1,
            "max_attempts": 3, "timeout_s": 30.0, "submitted_at": 1.0, "updated_at": 2.0,
            "max_run_s": 60.0, "run_limit_at": 61.0, "cancel_requested_at": 2.0}  # fmt: skip


def test_cancel_posts_to_the_jobs_cancel_route_with_an_optional_reason() -> None:
    seen: list[tuple[str, str, bytes]] = []

    def node(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.raw_path.decode(), request.content))
        if request.url.path == "/v1/jobs/cancel":
            return httpx.Response(200, json={"cancelled": 2, "cancelling": 1})
        return httpx.Response(200, json=_job_answer("a/b", "cancelling"))

    with Client("http://a:8000", "k") as client:
        client._transport = HttpxTransport(httpx.MockTransport(node))
        job = client.cancel("a/b")
        assert (job.status, job.cancel_requested_at, job.max_run_s) == ("cancelling", 2.0, 60.0)
        client.cancel("a/b", reason="not needed")
        assert client.cancel_many(exec="image.*", status="any", limit=10, reason="r") == {
            "cancelled": 2, "cancelling": 1,
        }  # fmt: skip
        client.cancel_many()
        with pytest.raises(ValueError, match="status"):
            client.cancel_many(status="dead")
    assert [(method, path) for method, path, _ in seen] == [
        ("POST", "/v1/jobs/a%2Fb/cancel"), ("POST", "/v1/jobs/a%2Fb/cancel"),
        ("POST", "/v1/jobs/cancel"), ("POST", "/v1/jobs/cancel"),
    ]  # fmt: skip
    assert seen[0][2] == b""
    assert [json.loads(body) for _, _, body in seen[1:]] == [
        {"reason": "not needed"},
        {"exec": "image.*", "status": "any", "limit": 10, "reason": "r"},
        {"status": "queued"},
    ]


def test_cancels_are_not_retried_after_a_lost_answer() -> None:
    tries: list[str] = []

    def node(request: httpx.Request) -> httpx.Response:
        tries.append(request.url.path)
        raise httpx.ReadTimeout("lost", request=request)

    with Client("http://a:8000", "k", retry_timeout_s=5.0) as client:
        client._transport = HttpxTransport(httpx.MockTransport(node))
        for call in (lambda: client.cancel("j"), lambda: client.cancel_many(status="any")):
            with pytest.raises(Unavailable):
                call()
    assert tries == ["/v1/jobs/j/cancel", "/v1/jobs/cancel"]


def test_max_run_s_is_a_submit_option() -> None:
    assert Submission(exec="a.b", max_run_s=90).to_body()["max_run_s"] == 90
    assert "max_run_s" not in Submission(exec="a.b").to_body()
    with pytest.raises(Invalid, match=r"job\.max_run_s"):
        submission_of({"exec": "a.b", "max_run_s": 0})
    bodies: list[dict[str, object]] = []

    def node(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(202, json={"id": bodies[-1]["id"], "status": "queued"})

    with Client("http://a:8000", "k") as client:
        client._transport = HttpxTransport(httpx.MockTransport(node))
        client.submit("a.b", id="x", max_run_s=5.5, ttl_s=60)
    assert bodies == [{"exec": "a.b", "payload": None, "id": "x", "priority": 0,
                       "delay_s": 0.0, "ttl_s": 60, "max_run_s": 5.5}]  # fmt: skip


def test_key_is_a_submit_option_checked_before_sending() -> None:
    assert Submission(exec="a.b", key="account:42").to_body()["key"] == "account:42"
    assert "key" not in Submission(exec="a.b").to_body()
    for bad in ("", "k" * 201):
        with pytest.raises(Invalid, match=r"job\.key"):
            submission_of({"exec": "a.b", "key": bad})
    with pytest.raises(Invalid, match=r"jobs\[1\]\.key"):
        Client("http://a:8000", "k").submit_many([{"exec": "a.b"}, {"exec": "a.b", "key": ""}])
    bodies: list[dict[str, object]] = []

    def node(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(202, json={"id": bodies[-1]["id"], "status": "queued"})

    with Client("http://a:8000", "k") as client:
        client._transport = HttpxTransport(httpx.MockTransport(node))
        client.submit("a.b", id="x", key="account:42")
    assert bodies == [{"exec": "a.b", "payload": None, "id": "x", "priority": 0,
                       "delay_s": 0.0, "key": "account:42"}]  # fmt: skip


_LIMIT = {"scope": "key", "target": "a/b:*", "max_inflight": 2, "rate": None, "burst": None,
          "source": "runtime", "by": "ops", "reason": "", "at": 5.0, "inflight": None,
          "held": 0, "added_later": True}  # fmt: skip


def test_the_limit_calls_send_their_requests_and_read_the_answers() -> None:
    seen: list[tuple[str, str, object]] = []

    def node(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.raw_path.decode(), body))
        if request.method == "DELETE":
            return httpx.Response(200, json={"removed": True, "limit": None})
        if request.url.path == "/v1/limits":
            return httpx.Response(200, json={"limits": [_LIMIT]})
        return httpx.Response(200, json=_LIMIT)

    with Client("http://a:8000", "k") as client:
        client._transport = HttpxTransport(httpx.MockTransport(node))
        [listed] = client.limits()
        assert (listed.scope, listed.target, listed.max_inflight, listed.by) == (
            "key", "a/b:*", 2, "ops",
        )  # fmt: skip
        assert client.limit("key", "a/b:*") == listed
        assert client.set_limit("key", "a/b:*", max_inflight=2) == listed
        client.set_limit("exec", "image.>", rate=2.5, burst=4, reason="slow down")
        removed = client.remove_limit("key", "a/b:*")
        assert removed.removed is True and removed.limit is None
        client.remove_limit("key", "..")
        with pytest.raises(ValueError, match="max_inflight, rate, or both"):
            client.set_limit("key", "a", reason="nothing")
    assert seen == [
        ("GET", "/v1/limits", None),
        ("GET", "/v1/limits/key/a%2Fb%3A%2A", None),
        ("PUT", "/v1/limits/key/a%2Fb%3A%2A", {"max_inflight": 2}),
        ("PUT", "/v1/limits/exec/image.%3E", {"rate": 2.5, "burst": 4, "reason": "slow down"}),
        ("DELETE", "/v1/limits/key/a%2Fb%3A%2A", None),
        ("DELETE", "/v1/limits/key/%2E%2E", None),
    ]
