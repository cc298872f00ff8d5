"""The Spark session's configuration, built from the settings without starting a JVM (the
cluster itself is tests/integration/streaming/test_cluster.py's job)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from dispatch.settings import ConfigError, Settings, StorageSettings, load_settings, to_environment
from dispatch.stack.jars import JarError, read_lock
from dispatch.streaming.session import (
    S3A_FILESYSTEM,
    SIMPLE_CREDENTIALS,
    TEMPORARY_CREDENTIALS,
    configure_object_storage,
    is_local,
    s3a_config,
    session_jars,
    spark_config,
)

JARS = [Path("/cache/jars/spark/a.jar"), Path("/cache/jars/spark/b.jar")]
SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key"
"""Spark 4.2.0's default `spark.redaction.regex` (a Java regex that Python reads alike)."""
SERVER = {
    "endpoint_url": "http://127.0.0.1:9000",
    "region": "eu-west-3",
    "access_key_id": "AKID",
    "secret_access_key": "SECRET",
}


def test_local_defaults_are_loopback_and_leave_executors_alone(tmp_path: Path) -> None:
    config = spark_config(load_settings(paths={"var": str(tmp_path)}), JARS, python="/venv/py")
    assert config["spark.master"] == "local[2]"
    assert config["spark.driver.host"] == "127.0.0.1"
    assert config["spark.driver.bindAddress"] == "127.0.0.1"
    assert config["spark.jars"] == "/cache/jars/spark/a.jar,/cache/jars/spark/b.jar"
    assert config["spark.driver.memory"] == "2g"
    # Local mode has no executor JVMs: nothing to size, no interpreter to name.
    assert "spark.executor.memory" not in config
    assert "spark.pyspark.python" not in config


def test_the_ui_and_its_rest_api_are_off_unless_asked_for(tmp_path: Path) -> None:
    config = spark_config(load_settings(paths={"var": str(tmp_path)}), JARS)
    assert config["spark.ui.enabled"] == "false"
    asked = load_settings(paths={"var": str(tmp_path)}, spark={"ui_enabled": True, "ui_port": 4999})
    config = spark_config(asked, JARS)
    assert config["spark.ui.enabled"] == "true" and config["spark.ui.port"] == "4999"


def test_driver_addresses_come_from_the_settings(tmp_path: Path) -> None:
    settings = load_settings(
        paths={"var": str(tmp_path)},
        spark={"driver_host": "10.1.2.3", "driver_bind_address": "0.0.0.0"},
    )
    config = spark_config(settings, JARS)
    assert config["spark.driver.host"] == "10.1.2.3"
    assert config["spark.driver.bindAddress"] == "0.0.0.0"


def test_a_standalone_master_sets_the_executors_python_and_heap(tmp_path: Path) -> None:
    settings = load_settings(
        paths={"var": str(tmp_path)},
        spark={"master": "spark://10.1.2.3:7077", "executor_memory": "512m"},
    )
    config = spark_config(settings, JARS, python="/venv/bin/python")
    assert config["spark.master"] == "spark://10.1.2.3:7077"
    assert config["spark.pyspark.python"] == "/venv/bin/python"
    assert config["spark.executor.memory"] == "512m"
    assert "-Duser.timezone=UTC" in config["spark.executor.extraJavaOptions"]


def test_the_cluster_settings_travel_by_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `dispatch streaming` started by the stack (or by hand) reads.
    monkeypatch.setenv("DISPATCH_SPARK__MASTER", "spark://127.0.0.1:7077")
    monkeypatch.setenv("DISPATCH_SPARK__DRIVER_HOST", "192.168.0.9")
    monkeypatch.setenv("DISPATCH_SPARK__EXECUTOR_MEMORY", "768m")
    settings = load_settings(paths={"var": str(tmp_path)})
    config = spark_config(settings, JARS)
    assert config["spark.master"] == "spark://127.0.0.1:7077"
    assert config["spark.driver.host"] == "192.168.0.9"
    assert config["spark.executor.memory"] == "768m"
    environment = to_environment(settings)
    assert environment["DISPATCH_SPARK__DRIVER_BIND_ADDRESS"] == "127.0.0.1"
    assert environment["DISPATCH_SPARK__EXECUTOR_MEMORY"] == "768m"


@pytest.mark.parametrize(
    "spark",
    [{"executor_memory": "lots"}, {"driver_host": ""}, {"driver_bind_address": ""}],
)
def test_bad_cluster_settings_fail_at_load(tmp_path: Path, spark: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"spark\."):
        load_settings(paths={"var": str(tmp_path)}, spark=spark)


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[2,3]", True),
        ("local-cluster[2,1,1024]", False),
        ("spark://127.0.0.1:7077", False),
        ("yarn", False),
    ],
)
def test_which_masters_are_local(master: str, local: bool) -> None:
    assert is_local(master) is local


# --- S3A: Spark's filesystem for s3:// locations -------------------------------------------------


def on_s3(tmp_path: Path, storage: dict[str, Any], **paths: str) -> Settings:
    """Settings with the warehouse (unless `paths` say otherwise) on S3."""
    locations = {"var": str(tmp_path), "warehouse": "s3://dispatch/wh", **paths}
    return load_settings(paths=locations, storage=storage)


def test_a_local_warehouse_and_checkpoints_set_no_hadoop_keys(tmp_path: Path) -> None:
    environ = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET"}
    config = spark_config(load_settings(paths={"var": str(tmp_path)}), JARS, environ=environ)
    assert not [key for key in config if key.startswith("spark.hadoop.")]


@pytest.mark.parametrize(
    "paths",
    [
        {"warehouse": "s3://dispatch/wh"},
        {"warehouse": "s3a://dispatch/wh"},
        {"warehouse": "delta", "checkpoints": "s3://dispatch/checkpoints"},
    ],
)
def test_either_location_on_s3_sets_every_s3a_key(tmp_path: Path, paths: dict[str, str]) -> None:
    settings = on_s3(tmp_path, SERVER, **paths)
    config = spark_config(settings, JARS, environ={})
    hadoop = {
        key.removeprefix("spark.hadoop."): value
        for key, value in config.items()
        if key.startswith("spark.hadoop.")
    }
    assert hadoop == s3a_config(settings.storage, environ={})
    assert hadoop["fs.s3.impl"] == S3A_FILESYSTEM


def test_an_http_server_gets_path_style_plain_http_and_its_keys() -> None:
    config = s3a_config(StorageSettings.model_validate(SERVER), environ={})
    assert config["fs.s3.impl"] == S3A_FILESYSTEM
    assert config["fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert config["fs.s3a.connection.ssl.enabled"] == "false"
    assert config["fs.s3a.path.style.access"] == "true"
    assert config["fs.s3a.endpoint.region"] == "eu-west-3"
    assert config["fs.s3a.access.key"] == "AKID"
    assert config["fs.s3a.secret.key"] == "SECRET"
    assert config["fs.s3a.aws.credentials.provider"] == SIMPLE_CREDENTIALS
    assert "fs.s3a.session.token" not in config
    # The AWS SDK's default request checksums stay off: many S3-compatible servers refuse them.
    assert config["fs.s3a.checksum.generation"] == "false"
    assert config["fs.s3a.checksum.validation"] == "false"
    assert config["fs.s3a.request.md5.header"] == "true"


def test_an_https_server_with_virtual_hosts() -> None:
    storage = StorageSettings.model_validate(
        {**SERVER, "endpoint_url": "https://s3.example.net", "virtual_hosted_style": True}
    )
    config = s3a_config(storage, environ={})
    assert config["fs.s3a.endpoint"] == "https://s3.example.net"
    assert config["fs.s3a.connection.ssl.enabled"] == "true"
    assert config["fs.s3a.path.style.access"] == "false"


def test_aws_itself_leaves_endpoint_and_addressing_to_s3a() -> None:
    config = s3a_config(StorageSettings(region="eu-west-1"), environ={})
    assert config["fs.s3a.endpoint.region"] == "eu-west-1"
    for key in ("fs.s3a.endpoint", "fs.s3a.path.style.access", "fs.s3a.connection.ssl.enabled"):
        assert key not in config


def test_without_keys_anywhere_the_default_provider_chain_stays() -> None:
    config = s3a_config(StorageSettings(), environ={})
    for key in ("fs.s3a.aws.credentials.provider", "fs.s3a.access.key", "fs.s3a.secret.key"):
        assert key not in config
    # No region either: S3A finds the bucket's region itself.
    assert "fs.s3a.endpoint.region" not in config


def test_empty_settings_fall_back_on_the_aws_environment_variables() -> None:
    environ = {
        "AWS_ENDPOINT_URL_S3": "http://localhost:9000",
        "AWS_ENDPOINT_URL": "http://ignored:1",
        "AWS_DEFAULT_REGION": "ap-south-1",
        "AWS_ACCESS_KEY_ID": "ENV-AKID",
        "AWS_SECRET_ACCESS_KEY": "ENV-SECRET",
        "AWS_SESSION_TOKEN": "ENV-TOKEN",
    }
    config = s3a_config(StorageSettings(), environ=environ)
    assert config["fs.s3a.endpoint"] == "http://localhost:9000"
    assert config["fs.s3a.endpoint.region"] == "ap-south-1"
    assert config["fs.s3a.access.key"] == "ENV-AKID"
    assert config["fs.s3a.secret.key"] == "ENV-SECRET"
    assert config["fs.s3a.session.token"] == "ENV-TOKEN"
    assert config["fs.s3a.aws.credentials.provider"] == TEMPORARY_CREDENTIALS


def test_the_settings_win_over_the_environment(tmp_path: Path) -> None:
    environ = {
        "AWS_ENDPOINT_URL": "http://elsewhere:1",
        "AWS_REGION": "ap-south-1",
        "AWS_ACCESS_KEY_ID": "ENV-AKID",
        "AWS_SECRET_ACCESS_KEY": "ENV-SECRET",
    }
    config = spark_config(on_s3(tmp_path, SERVER), JARS, environ=environ)
    assert config["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert config["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-3"
    assert config["spark.hadoop.fs.s3a.access.key"] == "AKID"
    assert config["spark.hadoop.fs.s3a.secret.key"] == "SECRET"


def test_a_server_without_a_region_is_signed_for_us_east_1() -> None:
    storage = StorageSettings(endpoint_url="http://127.0.0.1:9000")
    assert s3a_config(storage, environ={})["fs.s3a.endpoint.region"] == "us-east-1"


def test_plain_http_beyond_loopback_needs_allow_http() -> None:
    remote = {**SERVER, "endpoint_url": "http://s3.internal:9000"}
    with pytest.raises(ValueError, match="plain HTTP"):
        s3a_config(StorageSettings.model_validate(remote), environ={})
    allowed = StorageSettings.model_validate({**remote, "allow_http": True})
    assert s3a_config(allowed, environ={})["fs.s3a.connection.ssl.enabled"] == "false"
    by_environment = s3a_config(
        StorageSettings.model_validate(remote), environ={"AWS_ALLOW_HTTP": "true"}
    )
    assert by_environment["fs.s3a.endpoint"] == "http://s3.internal:9000"


def test_half_a_key_pair_is_refused() -> None:
    with pytest.raises(ValueError, match="both an access key id and a secret"):
        s3a_config(StorageSettings(access_key_id="AKID"), environ={})


def test_timeouts_and_retries_come_from_the_settings_at_s3a_minimum() -> None:
    defaults = s3a_config(StorageSettings(), environ={})
    # connect 5 s, request 10 s, retries within 15 s: S3A takes no less than 15 s for any.
    assert defaults["fs.s3a.connection.establish.timeout"] == "15000ms"
    assert defaults["fs.s3a.connection.timeout"] == "15000ms"
    assert defaults["fs.s3a.connection.request.timeout"] == "15000ms"
    assert defaults["fs.s3a.attempts.maximum"] == "3"
    assert defaults["fs.s3a.retry.limit"] == "3"
    slow = StorageSettings(
        connect_timeout_s=20, request_timeout_s=30.5, retry_timeout_s=25, max_retries=0
    )
    config = s3a_config(slow, environ={})
    assert config["fs.s3a.connection.establish.timeout"] == "20000ms"
    assert config["fs.s3a.connection.timeout"] == "30500ms"
    assert config["fs.s3a.connection.request.timeout"] == "30500ms"
    assert config["fs.s3a.attempts.maximum"] == "0"


def test_spark_redacts_every_secret_key() -> None:
    storage = StorageSettings.model_validate({**SERVER, "session_token": "TOKEN"})
    config = s3a_config(storage, environ={})
    secrets = {"AKID", "SECRET", "TOKEN"}
    carriers = {f"spark.hadoop.{key}" for key, value in config.items() if value in secrets}
    assert len(carriers) == 3
    redacted = re.compile(SPARK_REDACTION_REGEX)
    assert all(redacted.search(key) for key in carriers)


# --- the session's jars ----------------------------------------------------------------------


def cache_with(folder: Path, *jar_sets: str) -> Path:
    """A jar cache holding `jar_sets` as `jar_paths` checks them (stamp and file names)."""
    pinned = read_lock()
    for jar_set in jar_sets:
        (folder / "jars" / jar_set).mkdir(parents=True)
        (folder / "jars" / jar_set / ".verified").write_text("")
        for jar in pinned[jar_set]:
            (folder / "jars" / jar_set / jar.file_name).write_bytes(b"")
    return folder


def test_the_s3_jars_join_every_session_when_cached(tmp_path: Path) -> None:
    cache = cache_with(tmp_path / "cache", "spark", "s3")
    jars = session_jars(load_settings(paths={"var": str(tmp_path), "cache": str(cache)}))
    names = {path.name for path in jars}
    assert "hadoop-aws-3.5.0.jar" in names
    assert {path.parent.name for path in jars} == {"spark", "s3"}


def test_a_local_session_starts_without_the_s3_jars(tmp_path: Path) -> None:
    cache = cache_with(tmp_path / "cache", "spark")
    jars = session_jars(load_settings(paths={"var": str(tmp_path), "cache": str(cache)}))
    assert jars and {path.parent.name for path in jars} == {"spark"}


def test_a_session_on_s3_requires_the_s3_jars(tmp_path: Path) -> None:
    cache = cache_with(tmp_path / "cache", "spark")
    settings = load_settings(
        paths={"var": str(tmp_path), "cache": str(cache), "checkpoints": "s3://dispatch/ck"}
    )
    with pytest.raises(JarError, match="s3 jars"):
        session_jars(settings)


# --- a running session pointed at S3 ---------------------------------------------------------


class FakeHadoopConfiguration:
    """What `configure_object_storage` calls on the JVM's Hadoop Configuration."""

    def __init__(self, s3a_loadable: bool) -> None:
        self.s3a_loadable = s3a_loadable
        self.values: dict[str, str] = {}

    def getClassByNameOrNull(self, name: str) -> object | None:
        return object() if self.s3a_loadable and name == S3A_FILESYSTEM else None

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


def session_with(hadoop: FakeHadoopConfiguration) -> SparkSession:
    jsc = SimpleNamespace(hadoopConfiguration=lambda: hadoop)
    return cast(SparkSession, SimpleNamespace(sparkContext=SimpleNamespace(_jsc=jsc)))


def test_a_running_session_gets_the_s3a_keys(tmp_path: Path) -> None:
    hadoop = FakeHadoopConfiguration(s3a_loadable=True)
    settings = on_s3(tmp_path, SERVER)
    configure_object_storage(session_with(hadoop), settings)
    assert hadoop.values == s3a_config(settings.storage)


def test_a_running_session_is_left_alone_without_s3(tmp_path: Path) -> None:
    hadoop = FakeHadoopConfiguration(s3a_loadable=True)
    configure_object_storage(session_with(hadoop), load_settings(paths={"var": str(tmp_path)}))
    assert hadoop.values == {}


def test_a_running_session_without_the_s3a_classes_is_refused(tmp_path: Path) -> None:
    hadoop = FakeHadoopConfiguration(s3a_loadable=False)
    with pytest.raises(JarError, match="s3 jar set"):
        configure_object_storage(session_with(hadoop), on_s3(tmp_path, SERVER))
    assert hadoop.values == {}
