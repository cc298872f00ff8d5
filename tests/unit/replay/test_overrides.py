"""`--set key=value` against the typed settings."""

from __future__ import annotations

import re

import pytest

from dispatch.core.limits import Limit
from dispatch.replay.overrides import OverrideError, apply_overrides, parse_assignment
from dispatch.settings import DispatcherSettings

BASE = DispatcherSettings(default_cap=100, caps={"globex": 7})


def test_dispatcher_settings_are_changed_and_reach_the_core() -> None:
    policy = apply_overrides(
        BASE,
        [
            "dispatcher.default_cap=50",
            "dispatcher.caps.acme=10",
            "dispatcher.ack_timeout_s=5",
            "dispatcher.backoff_multiplier=1.5",
            "dispatcher.max_attempts=2",
        ],
    )
    config = policy.core_config()
    assert config.default_cap == 50
    assert dict(config.caps) == {"globex": 7, "acme": 10}
    assert (config.ack_timeout_s, config.backoff_multiplier, config.max_attempts) == (5, 1.5, 2)
    assert config.worker_expiry_s is None  # simulated workers are never silent


def test_a_later_assignment_wins_and_caps_can_be_replaced_whole() -> None:
    policy = apply_overrides(
        BASE,
        ["dispatcher.default_cap=5", "dispatcher.default_cap=6", 'dispatcher.caps={"acme": 2}'],
    )
    assert policy.dispatcher.default_cap == 6
    assert policy.dispatcher.caps == {"acme": 2}


def test_priorities_by_client_win_over_priorities_by_exec() -> None:
    policy = apply_overrides(
        BASE, ["jobs.exec_priority.image.resize=3", "jobs.client_priority.acme=-2"]
    )
    assert policy.priority_of("image.resize", "globex", 0) == 3
    assert policy.priority_of("image.resize", "acme", 0) == -2
    assert policy.priority_of("mail.send", "globex", 1) == 1


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("dispatcher.defualt_cap=5", "--set dispatcher.defualt_cap: unknown setting"),
        ("dispatcher.default_cap=zero", "--set dispatcher.default_cap: Input should be"),
        ("dispatcher.default_cap=0", "--set dispatcher.default_cap: Input should be greater"),
        ("dispatcher.caps.acme=0", "--set dispatcher.caps: Value error, every cap"),
        ("dispatcher.ack_timeout_s=900", "max_ack_timeout_s must be at least ack_timeout_s"),
        ("dispatcher.worker_expiry_s=3", "--set dispatcher.worker_expiry_s: does not change"),
        ("dispatcher.max_attempts.x=3", "dispatcher.max_attempts has no sub-keys"),
        ("kafka.bootstrap=x:1", "--set kafka.bootstrap: unknown setting"),
        ("jobs.exec_priority.x=high", "--set jobs.exec_priority.x: expected an integer"),
        ("jobs.colour.x=1", "--set jobs.colour.x: unknown setting"),
        ("default_cap", "expected key=value"),
    ],
)
def test_a_wrong_key_or_value_names_the_key(assignment: str, message: str) -> None:
    with pytest.raises(OverrideError, match=message.replace(".", r"\.").replace("(", r"\(")):
        apply_overrides(BASE, [assignment])


def test_values_are_json_when_they_parse_else_text() -> None:
    assert parse_assignment("a=10") == ("a", 10)
    assert parse_assignment("a=2.5") == ("a", 2.5)
    assert parse_assignment("a=acme") == ("a", "acme")
    assert parse_assignment(" a =x=y") == ("a", "x=y")


def test_the_policy_records_itself_as_plain_json() -> None:
    policy = apply_overrides(BASE, ["dispatcher.caps.acme=10", "jobs.client_priority.acme=1"])
    document = policy.to_dict()
    assert document["dispatcher"]["caps"] == {"globex": 7, "acme": 10}
    assert document["jobs"]["client_priority"] == {"acme": 1}
    assert "worker_expiry_s" not in document["dispatcher"]


def test_time_limits_and_the_cancel_grace_reach_the_core() -> None:
    policy = apply_overrides(
        BASE,
        [
            "dispatcher.max_run_s=600",
            "dispatcher.max_run_by_exec.report.>=900",
            'dispatcher.retry_by_exec.payments.>={"delay_s": 10}',
            "dispatcher.cancel_grace_s=5",
        ],
    )
    config = policy.core_config()
    assert (config.max_run_for("image.resize"), config.max_run_for("report.daily")) == (600, 900)
    assert config.retry_for("payments.refund").delay_s == 10
    assert config.cancel_grace_s == 5
    replaced = apply_overrides(BASE, ['dispatcher.max_run_by_exec={"a.>": 60}'])
    assert replaced.dispatcher.max_run_by_exec == {"a.>": 60}
    with pytest.raises(OverrideError, match=r"dispatcher\.max_run_by_exec\.<exec pattern>"):
        apply_overrides(BASE, ["dispatcher.max_run_by_exec=60"])
    with pytest.raises(OverrideError, match=r"--set dispatcher\.cancel_grace_s"):
        apply_overrides(BASE, ["dispatcher.cancel_grace_s=0"])


def test_what_if_pauses_are_checked_and_recorded() -> None:
    policy = apply_overrides(
        BASE,
        [
            "dispatcher.pause.exec.image.>=true",
            "dispatcher.pause.client.acme=true",
            "dispatcher.pause.client.acme=false",
        ],
    )
    assert dict(policy.pauses) == {("exec", "image.>"): True, ("client", "acme"): False}
    assert policy.to_dict()["dispatcher"]["pause"] == {
        "client": {"acme": False},
        "exec": {"image.>": True},
    }
    assert "pause" not in apply_overrides(BASE, ()).to_dict()["dispatcher"]


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("dispatcher.pause.exec.a.>=1", "expected true or false"),
        ("dispatcher.pause.queue.a=true", "dispatcher.pause.exec.<pattern>"),
        ("dispatcher.pause.exec=true", "dispatcher.pause.exec.<pattern>"),
        ("dispatcher.pause.exec.a.>.b=true", "dispatcher.pause.exec.a.>.b: exec"),
    ],
)
def test_a_wrong_what_if_pause_names_the_key(assignment: str, message: str) -> None:
    with pytest.raises(OverrideError, match=re.escape(message)):
        apply_overrides(BASE, [assignment])


LIMITED = DispatcherSettings(
    limits={"client": {"acme": {"max_inflight": 10}}, "key": {"account:*": {"max_inflight": 1}}}
)


def test_what_if_limits_set_knobs_and_reach_the_core() -> None:
    """`dispatcher.limits.<scope>.<target>.<knob>=V` changes one knob of the settings' limit
    (the others stay), a JSON object sets a whole limit, `null` drops a knob or a limit; the
    targets named are those whose recorded runtime limits the replay leaves out."""
    policy = apply_overrides(
        LIMITED,
        [
            "dispatcher.limits.client.acme.rate=50",
            "dispatcher.limits.exec.image.>.max_inflight=4",
            'dispatcher.limits.key.account:7={"rate": 2.5}',
            "dispatcher.limits.key.account:*=null",
            "dispatcher.limits.exec.billing.rate.max_inflight=2",  # a pattern ending in `rate`
        ],
    )
    limits = policy.core_config().limits
    assert {scope: dict(targets) for scope, targets in limits.items()} == {
        "client": {"acme": Limit(10, 50.0, 50)},
        "exec": {"image.>": Limit(4), "billing.rate": Limit(2)},
        "key": {"account:7": Limit(None, 2.5, 3)},
    }
    assert policy.limit_targets == {
        ("client", "acme"), ("exec", "image.>"), ("key", "account:7"), ("key", "account:*"),
        ("exec", "billing.rate"),
    }  # fmt: skip
    assert policy.to_dict()["dispatcher"]["limits"]["client"] == {
        "acme": {"max_inflight": 10, "rate": 50.0}
    }
    # Dropping the last knob drops the limit.
    dropped = apply_overrides(LIMITED, ["dispatcher.limits.client.acme.max_inflight=null"])
    assert "client" not in dropped.core_config().limits
    assert apply_overrides(LIMITED, ()).limit_targets == frozenset()
    whole = apply_overrides(LIMITED, ['dispatcher.limits={"exec": {"a.*": {"max_inflight": 1}}}'])
    assert dict(whole.core_config().limits) == {"exec": {"a.*": Limit(1)}}
    assert whole.limit_targets == {("exec", "a.*"), ("client", "acme"), ("key", "account:*")}


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("dispatcher.limits.queue.a.rate=1", "dispatcher.limits.<client|exec|key>"),
        ("dispatcher.limits.client=3", "dispatcher.limits.<client|exec|key>"),
        ("dispatcher.limits=3", "dispatcher.limits.<client|exec|key>"),
        ("dispatcher.limits.client.acme=3", "dispatcher.limits.<client|exec|key>"),
        ("dispatcher.limits.exec.a.>.b.rate=1", "--set dispatcher.limits.exec.a.>.b.rate: exec"),
        ("dispatcher.limits.key.a*b.rate=1", "key 'a*b': key: '*' is kept for key patterns"),
        ("dispatcher.limits.client.acme.rate=0", "--set dispatcher.limits.client.acme.rate:"),
        ("dispatcher.limits.client.acme.burst=5", "a burst needs a rate"),
        ("dispatcher.limits.client.acme.max_inflight=x", "dispatcher.limits.client.acme"),
        ('dispatcher.limits.client.acme={"wait": 1}', "dispatcher.limits.client.acme.wait"),
    ],
)
def test_a_wrong_what_if_limit_names_the_key(assignment: str, message: str) -> None:
    with pytest.raises(OverrideError, match=re.escape(message)):
        apply_overrides(BASE, [assignment])
