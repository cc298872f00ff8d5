"""The Spark session's configuration, built from the settings without starting a JVM (the
cluster itself is tests/integration/streaming/test_cluster.py's job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.settings import ConfigError, load_settings, to_environment
from streaming.session import is_local, spark_config

JARS = [Path("/cache/jars/spark/a.jar"), Path("/cache/jars/spark/b.jar")]


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
