"""CoreConfig: validation naming the field, caps per client, and the backoff formula."""

from __future__ import annotations

import pytest

from dispatch.core import CoreConfig, ack_timeout


def test_defaults_match_conf_defaults_toml() -> None:
    config = CoreConfig()
    assert (config.default_cap, config.ack_timeout_s, config.backoff_multiplier) == (100, 30.0, 2.0)
    assert (config.max_ack_timeout_s, config.max_attempts, config.worker_expiry_s) == (
        600.0,
        5,
        15.0,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("default_cap", 0),
        ("default_cap", 1.5),
        ("ack_timeout_s", 0),
        ("ack_timeout_s", float("nan")),
        ("backoff_multiplier", 0.5),
        ("max_attempts", 0),
        ("max_attempts", True),
        ("worker_expiry_s", -1.0),
        ("max_ack_timeout_s", 1.0),
    ],
)
def test_invalid_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        CoreConfig(**{field: value})  # type: ignore[arg-type]


def test_caps_are_validated_and_frozen() -> None:
    with pytest.raises(ValueError, match=r"caps\['x'\]"):
        CoreConfig(caps={"x": 0})
    caps = {"big": 10}
    config = CoreConfig(caps=caps, default_cap=3)
    caps["big"] = 1
    assert config.cap_for("big") == 10 and config.cap_for("other") == 3
    with pytest.raises(TypeError):
        config.caps["big"] = 2  # type: ignore[index]


def test_backoff_starts_at_the_first_timeout_and_grows_exponentially_to_the_cap() -> None:
    config = CoreConfig(ack_timeout_s=10.0, backoff_multiplier=3.0, max_ack_timeout_s=100.0)
    assert [config.ack_timeout(10.0, attempt) for attempt in range(1, 6)] == [
        10.0,
        30.0,
        90.0,
        100.0,
        100.0,
    ]


def test_backoff_keeps_a_first_timeout_longer_than_the_cap() -> None:
    assert ack_timeout(50.0, 1, 2.0, 20.0) == 50.0
    assert ack_timeout(50.0, 3, 2.0, 20.0) == 50.0


def test_backoff_does_not_overflow_for_huge_attempts() -> None:
    assert ack_timeout(1.0, 10_000, 2.0, 600.0) == 600.0
    assert ack_timeout(1.0, 10_000, 1.0, 600.0) == 1.0
