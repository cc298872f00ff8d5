"""The jar lock: a set is used only when it holds exactly the pinned files and checksums."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dispatch.stack.jars import JAR_SETS, JarError, LockedJar, jar_paths, read_lock, verify_set


def _jar(folder: Path, name: str, content: bytes) -> LockedJar:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(content)
    return LockedJar("broker", name, hashlib.sha256(content).hexdigest())


def test_the_repository_lock_pins_both_sets_with_the_versions_we_depend_on() -> None:
    pinned = read_lock()
    assert set(pinned) == set(JAR_SETS)
    spark = {jar.file_name for jar in pinned["spark"]}
    assert "delta-spark_4.2_2.13-4.4.0.jar" in spark
    assert "spark-sql-kafka-0-10_2.13-4.2.0.jar" in spark
    # pyspark ships Jackson and Hadoop; a second copy on the classpath breaks them.
    assert not any(name.startswith(("jackson-", "hadoop-")) for name in spark)
    broker = {jar.file_name for jar in pinned["broker"]}
    assert any(name.startswith("kafka_2.13-4.") for name in broker)
    assert any(name.startswith("log4j-slf4j-impl-") for name in broker)


def test_a_complete_set_verifies(tmp_path: Path) -> None:
    pinned = [_jar(tmp_path, "a.jar", b"a"), _jar(tmp_path, "b.jar", b"b")]
    verify_set(tmp_path, pinned)


def test_a_missing_jar_is_named(tmp_path: Path) -> None:
    pinned = [_jar(tmp_path, "a.jar", b"a"), LockedJar("broker", "b.jar", "0" * 64)]
    with pytest.raises(JarError, match=r"missing b\.jar"):
        verify_set(tmp_path, pinned)


def test_a_corrupt_jar_is_named(tmp_path: Path) -> None:
    pinned = [_jar(tmp_path, "a.jar", b"a")]
    (tmp_path / "a.jar").write_bytes(b"truncated")
    with pytest.raises(JarError, match=r"a\.jar: SHA-256 differs"):
        verify_set(tmp_path, pinned)


def test_an_unexpected_jar_is_named(tmp_path: Path) -> None:
    pinned = [_jar(tmp_path, "a.jar", b"a")]
    _jar(tmp_path, "stray.jar", b"x")
    with pytest.raises(JarError, match=r"unexpected stray\.jar"):
        verify_set(tmp_path, pinned)


def test_a_set_never_fetched_tells_how_to_fetch_it(tmp_path: Path) -> None:
    with pytest.raises(JarError, match=r"run scripts/bootstrap\.sh"):
        jar_paths("broker", cache=tmp_path)


def test_a_malformed_lock_line_is_reported_with_its_number(tmp_path: Path) -> None:
    lock = tmp_path / "jars.lock"
    lock.write_text("# header\nbroker a.jar\n")
    with pytest.raises(JarError, match=r"jars\.lock:2"):
        read_lock(lock)
