"""The settings layer: defaults from conf/, environment overrides, errors that name the setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatch import settings as settings_module
from dispatch.core.limits import Limit
from dispatch.settings import ENV_PREFIX, PROJECT_ROOT, ConfigError, load_settings, to_environment


@pytest.fixture(autouse=True)
def _no_dispatch_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # These tests are about the file and the variables they set themselves, not the caller's.
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def test_defaults_come_from_the_conf_file() -> None:
    settings = load_settings()
    assert settings.kafka.bootstrap == "127.0.0.1:9092"
    assert settings.kafka.topics == {
        "dispatch.submit": 2,
        "dispatch.events": 1,
        "dispatch.submit.rejected": 1,
    }
    assert settings.api.ports == [8000, 8001]


def test_relative_paths_resolve_against_the_project_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")
    settings = load_settings()
    assert settings.paths.var == PROJECT_ROOT / "var"
    assert settings.paths.warehouse == str(PROJECT_ROOT / "var" / "delta")
    assert settings.paths.cache == Path.home() / ".cache" / "dispatch"


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_KAFKA__BOOTSTRAP", "127.0.0.1:19092")
    monkeypatch.setenv("DISPATCH_DISPATCHER__CAPS", '{"big-client": 500}')
    settings = load_settings()
    assert settings.kafka.port == 19092
    assert settings.dispatcher.caps == {"big-client": 500}
    # The rest of the section still comes from the file.
    assert settings.kafka.submit_topic == "dispatch.submit"


def test_an_invalid_value_names_the_setting_and_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISPATCH_DISPATCHER__DEFAULT_CAP", "0")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert "dispatcher.default_cap" in str(raised.value)
    assert "DISPATCH_DISPATCHER__DEFAULT_CAP" in str(raised.value)


def test_a_malformed_bootstrap_address_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap"):
        load_settings(kafka={"bootstrap": "localhost"})


def test_an_unknown_setting_is_a_typo_not_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf.toml"
    conf.write_text('[kafka]\nbootstrapp = "127.0.0.1:9092"\n')
    monkeypatch.setenv("DISPATCH_CONFIG", str(conf))
    with pytest.raises(ConfigError, match=r"kafka\.bootstrapp"):
        load_settings()


def test_a_missing_config_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"absent\.toml"):
        load_settings()


def test_a_lease_renewed_too_late_is_refused() -> None:
    with pytest.raises(ConfigError, match="renew_every_s"):
        load_settings(lease={"ttl_s": 5.0, "renew_every_s": 4.0, "clock_skew_margin_s": 2.0})


def test_a_timeout_cap_below_the_first_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_ack_timeout_s"):
        load_settings(dispatcher={"ack_timeout_s": 60.0, "max_ack_timeout_s": 30.0})


def test_keyword_overrides_merge_into_a_section() -> None:
    settings = load_settings(kafka={"submit_topic": "other.submit"})
    assert settings.kafka.submit_topic == "other.submit"
    assert settings.kafka.events_topic == "dispatch.events"


def test_settings_travel_to_another_process_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = load_settings(
        kafka={"submit_topic": "x.submit"},
        dispatcher={"caps": {"acme": 3}, "ack_timeout_s": 2.5},
        api={"ports": [9000]},
    )
    for name, value in to_environment(original).items():
        monkeypatch.setenv(name, value)
    assert load_settings() == original


def test_api_key_files_live_under_the_var_folder_unless_absolute() -> None:
    settings = load_settings(paths={"var": "/srv/dispatch"})
    assert settings.auth.keys_file == Path("/srv/dispatch/api-keys.json")
    assert settings.auth.dev_keys_file == Path("/srv/dispatch/dev-keys.json")
    pinned = load_settings(auth={"keys_file": "/etc/dispatch/keys.json"})
    assert pinned.auth.keys_file == Path("/etc/dispatch/keys.json")


def test_retry_delays_come_from_the_section_and_its_exec_patterns() -> None:
    config = load_settings(
        dispatcher={
            "retry_delay_s": 2.0,
            "retry_jitter": 0.0,
            "retry_by_exec": {"mail.>": {"delay_s": 30.0}, "mail.send": {"delay_s": 1.0}},
        }
    ).dispatcher.core_config()
    assert config.retry_for("image.resize").delay("j", 2) == 4.0
    mail = config.retry_for("mail.send")  # the first pattern in file order wins
    assert (mail.delay_s, mail.multiplier, mail.jitter) == (30.0, 2.0, 0.0)


@pytest.mark.parametrize(
    ("dispatcher", "named"),
    [
        ({"retry_delay_s": -1.0}, "retry_delay_s"),
        ({"retry_multiplier": 0.5}, "retry_multiplier"),
        ({"retry_by_exec": {"mail.>": {"delay_s": -1.0}}}, "retry_by_exec"),
        ({"retry_by_exec": {"mail.>.x": {"delay_s": 1.0}}}, "retry_by_exec"),
        ({"retry_by_exec": {"mail": {"delay": 1.0}}}, "retry_by_exec"),
    ],
)
def test_a_bad_retry_setting_is_refused_naming_it(
    dispatcher: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(dispatcher=dispatcher)


def test_the_dispatcher_section_becomes_the_core_policy() -> None:
    config = load_settings(
        dispatcher={"default_cap": 7, "caps": {"acme": 2}, "ack_timeout_s": 3.0}
    ).dispatcher.core_config()
    assert (config.cap_for("acme"), config.cap_for("other")) == (2, 7)
    assert config.ack_timeout(3.0, 1) == 3.0


def test_the_warehouse_follows_the_var_folder_unless_absolute() -> None:
    assert load_settings(paths={"var": "/srv/d"}).paths.warehouse == "/srv/d/delta"
    pinned = load_settings(paths={"var": "/srv/d", "warehouse": "/data/delta"})
    assert pinned.paths.warehouse == "/data/delta"


def test_a_profile_overlays_the_file_and_the_environment_still_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISPATCH_PROFILE", "cluster")
    settings = load_settings()
    # The cluster profile: three brokers at RF 3, the store served locally, a Spark cluster.
    assert settings.kafka.brokers == 3 and settings.kafka.replication_factor == 3
    assert settings.paths.warehouse == "s3://dispatch/warehouse"
    assert settings.paths.checkpoint_root() == "s3://dispatch/checkpoints"
    assert settings.storage.serve and settings.spark.cluster_workers == 2
    assert settings.api.ports == [8000, 8001, 8002]
    # What the profile leaves alone stays the file's; the environment wins over both.
    assert settings.kafka.submit_topic == "dispatch.submit"
    monkeypatch.setenv("DISPATCH_API__PORTS", "[9000]")
    assert load_settings().api.ports == [9000]


def test_an_unknown_or_misnamed_profile_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_PROFILE", "nope")
    with pytest.raises(ConfigError, match="profiles: cluster"):
        load_settings()
    monkeypatch.setenv("DISPATCH_PROFILE", "../defaults")
    with pytest.raises(ConfigError, match="lower-case name"):
        load_settings()


def test_a_profile_may_not_move_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `down` finds a stack's pid files under `var`: a profile moving it would hide them.
    monkeypatch.setattr(settings_module, "PROFILES_DIR", tmp_path)
    (tmp_path / "elsewhere.toml").write_text('[paths]\nvar = "/tmp/x"\n')
    monkeypatch.setenv("DISPATCH_PROFILE", "elsewhere")
    with pytest.raises(ConfigError, match=r"paths\.var"):
        load_settings()


def test_tenant_wait_targets_have_a_default_and_per_client_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().tenants.wait_target_for("anyone") == 5.0
    monkeypatch.setenv("DISPATCH_TENANTS__WAIT_TARGET_S", "3.5")
    monkeypatch.setenv("DISPATCH_TENANTS__WAIT_TARGETS", '{"acme": 2.0}')
    tenants = load_settings().tenants
    assert tenants.wait_target_for("acme") == 2.0
    assert tenants.wait_target_for("globex") == 3.5
    assert tenants.metrics_clients == 20


@pytest.mark.parametrize(
    ("variable", "value", "setting"),
    [
        ("DISPATCH_TENANTS__WAIT_TARGET_S", "0", "tenants.wait_target_s"),
        ("DISPATCH_TENANTS__WAIT_TARGET_S", "inf", "tenants.wait_target_s"),
        ("DISPATCH_TENANTS__WAIT_TARGETS", '{"acme": -1}', "tenants.wait_targets"),
        ("DISPATCH_TENANTS__WAIT_TARGETS", '{"acme": NaN}', "tenants.wait_targets"),
        ("DISPATCH_TENANTS__METRICS_CLIENTS", "0", "tenants.metrics_clients"),
    ],
)
def test_a_wait_target_must_be_a_positive_finite_time(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, setting: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert setting in str(raised.value)
    assert variable in str(raised.value)


def test_tenant_targets_travel_to_another_process(monkeypatch: pytest.MonkeyPatch) -> None:
    original = load_settings(tenants={"wait_targets": {"acme": 0.25}, "metrics_clients": 3})
    for name, value in to_environment(original).items():
        monkeypatch.setenv(name, value)
    assert load_settings().tenants == original.tenants


def test_the_defaults_file_holds_the_models_own_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # conf/defaults.toml documents the defaults; it must not change them (docs/settings.md is
    # generated from the model's), so a file without it loads the same settings. Each key's
    # presence, comment and value: test_settings_doc.py.
    from_file = load_settings()
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("DISPATCH_CONFIG", str(empty))
    assert load_settings() == from_file


def test_limits_by_scope_and_target_become_the_core_s_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[dispatcher.limits.<scope>."<target>"]` in a file (the shape docs/deployment.md
    shows), checked and handed to the core; a rate's burst defaults to ceil(rate)."""
    config = tmp_path / "dispatch.toml"
    config.write_text(
        (PROJECT_ROOT / "conf" / "defaults.toml").read_text()
        + "\n"
        + "\n".join(
            [
                "[dispatcher.limits.client.acme]",
                "max_inflight = 10",
                "rate = 50",
                "burst = 100",
                '[dispatcher.limits.exec."image.>"]',
                "max_inflight = 4",
                '[dispatcher.limits.key."account:*"]',
                "max_inflight = 1",
                '[dispatcher.limits.key."account:42"]',
                "rate = 2.5",
            ]
        )
    )
    monkeypatch.setenv("DISPATCH_CONFIG", str(config))
    settings = load_settings()
    limits = settings.dispatcher.core_config().limits
    assert {scope: dict(targets) for scope, targets in limits.items()} == {
        "client": {"acme": Limit(10, 50.0, 100)},
        "exec": {"image.>": Limit(4)},
        "key": {"account:*": Limit(1), "account:42": Limit(None, 2.5, 3)},
    }
    # They travel to another process as JSON, as tables do.
    for name, value in to_environment(settings).items():
        monkeypatch.setenv(name, value)
    assert load_settings() == settings
    assert load_settings().dispatcher.core_config().limits == limits


def test_no_limits_by_default() -> None:
    assert load_settings().dispatcher.limits == {}
    assert dict(load_settings().dispatcher.core_config().limits) == {}


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"queue": {"a": {"max_inflight": 1}}}, r"limits\.queue: unknown scope"),
        ({"client": {"acme": {}}}, r"dispatcher\.limits\.client\.acme .*max_inflight, rate"),
        ({"client": {"acme": {"burst": 5}}}, r"limits\.client\.acme .*burst: a burst needs a rate"),
        ({"client": {"acme": {"max_inflight": 0}}}, r"limits\.client\.acme\.max_inflight"),
        ({"client": {"acme": {"rate": 0}}}, r"limits\.client\.acme\.rate"),
        ({"client": {"acme": {"rate": 2_000_000}}}, r"limits\.client\.acme\.rate"),
        ({"client": {"acme": {"rate": 1, "burst": 0}}}, r"limits\.client\.acme\.burst"),
        ({"client": {"acme": {"max_inflight": 1, "wait": 2}}}, r"limits\.client\.acme\.wait"),
        ({"exec": {"image.>.x": {"max_inflight": 1}}}, r"limits\.exec\['image\.>\.x'\]: exec"),
        ({"key": {"a*b": {"max_inflight": 1}}}, r"limits\.key\['a\*b'\]: key"),
        ({"key": {"k" * 201: {"max_inflight": 1}}}, r"limits\.key\['kkk.*: key"),
        ({"key": {"a\tb": {"max_inflight": 1}}}, r"limits\.key\['a\\tb'\]: key: control"),
    ],
)
def test_a_bad_limit_is_refused_naming_it(limits: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(dispatcher={"limits": limits})
