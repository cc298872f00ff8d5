"""The JVMs' class-data-sharing options: which archive a JVM starts on (the one made for its
exact jars, or none), the compiler switch, and how an archive is published (whole, or not at
all; older archives of the same role removed). No JVM here: tests/integration/stack/
test_class_sharing.py checks that the session's JVMs really map theirs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dispatch.settings import JvmSettings, Settings, load_settings
from dispatch.stack import class_sharing
from dispatch.stack.broker import Broker
from dispatch.stack.class_sharing import (
    KEPT_PER_ROLE,
    QUICK_START_OPTION,
    QUICK_START_OPTIONS,
    ClassSharingError,
    archive_path,
    dumping,
    java_options,
)


def settings_in(tmp_path: Path, **jvm: bool) -> Settings:
    return load_settings(
        paths={"var": str(tmp_path / "var"), "cache": str(tmp_path / "cache")}, jvm=jvm
    )


@pytest.fixture
def jars(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "jars"
    folder.mkdir()
    made = [folder / "a.jar", folder / "b.jar"]
    for jar in made:
        jar.write_bytes(b"PK jar " + jar.name.encode())
    return made


def test_a_jvm_starts_on_the_archive_made_for_its_jars_and_only_then(
    tmp_path: Path, jars: list[Path]
) -> None:
    settings = settings_in(tmp_path, quick_start=False)
    assert java_options(settings, "role", jars) == []
    archive = archive_path(settings, "role", jars)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    assert java_options(settings, "role", jars) == [f"-XX:SharedArchiveFile={archive}"]
    # Another role, or the same jars with one changed (an upgrade): not that archive.
    assert java_options(settings, "other", jars) == []
    stat = jars[1].stat()
    os.utime(jars[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert archive_path(settings, "role", jars) != archive
    assert java_options(settings, "role", jars) == []


def test_class_sharing_off_never_names_an_archive(tmp_path: Path, jars: list[Path]) -> None:
    settings = settings_in(tmp_path, class_sharing=False, quick_start=True)
    archive = archive_path(settings, "role", jars)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    assert java_options(settings, "role", jars) == list(QUICK_START_OPTIONS)


def test_quick_start_is_off_unless_asked(tmp_path: Path, jars: list[Path]) -> None:
    assert JvmSettings().quick_start is False
    assert QUICK_START_OPTION not in java_options(
        settings_in(tmp_path, quick_start=False), "r", jars
    )
    assert QUICK_START_OPTION in java_options(settings_in(tmp_path, quick_start=True), "r", jars)


def test_the_spark_driver_keeps_the_optimising_compiler(tmp_path: Path, jars: list[Path]) -> None:
    settings = settings_in(tmp_path, quick_start=True, quick_start_driver=False)
    assert java_options(settings, class_sharing.SPARK_DRIVER, jars) == []
    assert java_options(settings, class_sharing.BROKER, jars) == list(QUICK_START_OPTIONS)


def test_a_short_lived_driver_may_take_the_client_compiler_with_quick_start(
    tmp_path: Path, jars: list[Path]
) -> None:
    assert JvmSettings().quick_start_driver is False
    both = settings_in(tmp_path, quick_start=True, quick_start_driver=True)
    assert java_options(both, class_sharing.SPARK_DRIVER, jars) == list(QUICK_START_OPTIONS)
    driver_only = settings_in(tmp_path, quick_start=False, quick_start_driver=True)
    assert java_options(driver_only, class_sharing.SPARK_DRIVER, jars) == []


def test_an_archive_is_published_whole_and_the_oldest_of_its_role_go(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    folder.mkdir()
    # Three older archives of the role (other jars: another checkout, an older pyspark),
    # made an hour, two and three ago.
    older = [folder / f"kafka-broker-{n}{n}{n}{n}000000000000.jsa" for n in range(3)]
    for hours, path in enumerate(older, start=1):
        path.write_bytes(b"old")
        made = time.time() - 3600 * hours
        os.utime(path, (made, made))
    other_role = folder / "spark-driver-0000000000000000.jsa"
    other_role.write_bytes(b"other")
    os.utime(other_role, (0, 0))
    final = folder / "kafka-broker-1111111111111111.jsa"
    with dumping(final) as partial:
        assert partial.parent == folder and partial != final
        partial.write_bytes(b"new")
        assert not final.exists()
    assert final.read_bytes() == b"new"
    assert [path.exists() for path in older] == [True] * (KEPT_PER_ROLE - 1) + [False] * (
        len(older) - KEPT_PER_ROLE + 1
    )
    assert other_role.exists()
    assert not partial.exists()


def test_a_jvm_that_wrote_nothing_publishes_nothing(tmp_path: Path) -> None:
    final = tmp_path / "cds" / "kafka-broker-1111111111111111.jsa"
    with pytest.raises(ClassSharingError, match="without writing"), dumping(final):
        pass
    assert not final.exists()


def test_a_failed_run_leaves_no_partial_file(tmp_path: Path) -> None:
    final = tmp_path / "cds" / "kafka-broker-1111111111111111.jsa"
    with pytest.raises(RuntimeError), dumping(final) as partial:
        partial.write_bytes(b"half")
        raise RuntimeError("the workload failed")
    assert list(final.parent.iterdir()) == []


def test_the_broker_command_carries_the_options_and_its_own_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jars: list[Path]
) -> None:
    settings = settings_in(tmp_path, quick_start=True)
    monkeypatch.setattr(Broker, "_jars", lambda self: jars)
    archive = archive_path(settings, class_sharing.BROKER, jars)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    started: list[list[str]] = []
    broker = Broker(settings, java_options=["-XX:ArchiveClassesAtExit=/x.jsa"])
    monkeypatch.setattr(broker, "check_ports", lambda: None)
    monkeypatch.setattr(broker, "prepare", lambda: None)
    monkeypatch.setattr(broker.process, "start", started.append)
    broker.launch()
    [command] = started
    assert QUICK_START_OPTION in command
    assert f"-XX:SharedArchiveFile={archive}" in command
    assert command.index("-XX:ArchiveClassesAtExit=/x.jsa") == command.index("-cp") - 1
