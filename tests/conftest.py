"""Shared fixtures for the real services: one Kafka broker and one Spark session per test
session, a topic namespace and a Delta warehouse folder per test.

The services start lazily, on the first test that asks for them, and stop by the pid this
session started, even when tests fail.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dispatch.settings import ENV_PREFIX, Settings, load_settings, with_namespace
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.ports import free_port
from tests.s3_server import s3_server

__all__ = ["s3_server"]  # the session's S3-compatible server, a fixture (tests/s3_server.py)

# How the tests are shared between pytest-xdist's workers (scripts/test.sh runs two).
pytest_plugins = ["tests.scheduling"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Every JVM the tests start, here or in the processes they spawn (which inherit this), runs on
# the client compiler: the suite's JVMs live seconds to minutes, and on two cores C2's
# compilations cost more than they win back (docs/deployment.md, *JVM start-up*).
os.environ.setdefault(f"{ENV_PREFIX}JVM__QUICK_START", "true")
# The Spark drivers the tests spawn (folds of a test's stack, notebooks) too: they live a
# minute or two. Never the session's own driver below, which folds for the whole run.
os.environ.setdefault(f"{ENV_PREFIX}JVM__QUICK_START_DRIVER", "true")
# Failed attempts retry at once, as before retry delays existed: most tests fail a job to see
# what follows, not to wait for it. The tests of delays set their own (and a stack's
# processes inherit this, as the JVM settings above).
os.environ.setdefault(f"{ENV_PREFIX}DISPATCHER__RETRY_DELAY_S", "0")

_namespace_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings of this test session's stack: its own data folder and free ports."""
    var = tmp_path_factory.mktemp("var")
    return load_settings(
        paths={"var": str(var), "warehouse": str(var / "delta")},
        kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
    )


@pytest.fixture(scope="session")
def kafka_broker(stack_settings: Settings) -> Iterator[Broker]:
    """The one real Kafka broker (KRaft, from the cached jars) of this test session."""
    broker = Broker(stack_settings)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark(stack_settings: Settings) -> Iterator[SparkSession]:
    """The one real Spark session (Delta + Kafka connector) of this test session."""
    from dispatch.streaming.session import spark_session

    jvm = stack_settings.jvm.model_copy(update={"quick_start_driver": False})
    own = stack_settings.model_copy(update={"jvm": jvm})
    session = spark_session(own, app_name="dispatch-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def settings(request: pytest.FixtureRequest, stack_settings: Settings, tmp_path: Path) -> Settings:
    """Per-test settings: topics in a namespace of this test, a warehouse folder of its own."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:80].strip("-")
    namespace = f"t{next(_namespace_numbers)}-{slug}"
    return with_namespace(stack_settings, namespace, tmp_path)


@pytest.fixture
def topics(kafka_broker: Broker, settings: Settings) -> Settings:
    """Per-test settings whose three topics exist on the session's broker."""
    create_topics(settings.kafka)
    return settings
