"""Class-data-sharing archives for the JVMs the project starts, and the options to use them.

A Kafka broker or a Spark driver spends most of its start loading, parsing and verifying the
same tens of thousands of classes from the same jars every time. A JVM can instead map them
from an archive a previous run wrote at its exit (JDK 13+ dynamic archives,
`-XX:ArchiveClassesAtExit`, read back with `-XX:SharedArchiveFile`). JDK 17 cannot write one
on first use by itself (`-XX:+AutoCreateSharedArchive` is JDK 19), so bootstrap trains one per
role (`python -m dispatch.streaming.class_training`): a broker that takes transactions and
consumer groups, a Spark driver that reads Kafka in a streaming query and writes, merges and
reads Delta, each stopped cleanly so it writes its archive.

An archive is only valid for the exact jars and Java it was made with (the JVM checks the
classpath's sizes and times, and ignores an archive that does not match, with a warning). Its
file name therefore carries a fingerprint of both: after an upgrade of pyspark, the jar pins
or Java, the old one is simply not found, and bootstrap makes a new one. A missing archive
costs only speed: the JVM starts as it always did.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dispatch.settings import Settings

ARCHIVE_SUFFIX = ".jsa"
QUICK_START_OPTION = "-XX:TieredStopAtLevel=1"
CODE_CACHE_OPTION = "-XX:ReservedCodeCacheSize=240m"
"""With the client compiler alone a JVM reserves 48 MB for compiled code instead of 240 MB; a
Spark driver fills that in minutes, and its code cache sweeper then spent more CPU flushing
and recompiling than the compiler itself (BENCHMARKS.md, *JVM start-up*). Reserved address
space only: memory is committed as code is compiled."""
QUICK_START_OPTIONS = (QUICK_START_OPTION, CODE_CACHE_OPTION)
KEPT_PER_ROLE = 3
"""Archives kept per role, the newest made: checkouts on one machine (a developer's, a CI
clone) share the cache but not the Spark driver's jars (each has its own venv); keeping one
made each bootstrap delete the other checkout's archive and train again (a minute or two)."""

BROKER = "kafka-broker"
SPARK_DRIVER = "spark-driver"
ROLES = (BROKER, SPARK_DRIVER)


class ClassSharingError(Exception):
    """An archive could not be made; the message says why."""


def archive_dir(settings: Settings) -> Path:
    return settings.paths.cache / "cds"


def _java() -> Path:
    java = shutil.which("java")
    if java is None:
        raise ClassSharingError("Java is not installed (Java 17+ is needed): run bootstrap")
    return Path(java).resolve()


def fingerprint(classpath: Sequence[Path]) -> str:
    """What an archive is valid for: the Java binary and every jar, by path, size and time
    (what the JVM itself compares)."""
    digest = hashlib.sha256()
    for path in (_java(), *classpath):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_path(settings: Settings, role: str, classpath: Sequence[Path]) -> Path:
    return archive_dir(settings) / f"{role}-{fingerprint(classpath)}{ARCHIVE_SUFFIX}"


def quick_start_options(settings: Settings) -> list[str]:
    """The client compiler alone (and the code cache it would otherwise shrink), when
    `jvm.quick_start` asks for it."""
    return list(QUICK_START_OPTIONS) if settings.jvm.quick_start else []


def java_options(settings: Settings, role: str, classpath: Sequence[Path]) -> list[str]:
    """The options a JVM of `role` on `classpath` starts with: its archive when one was made
    for these jars (and `jvm.class_sharing` allows it), and `quick_start_options` except for
    the Spark driver, which plans and compiles every query: the client compiler's code made
    Spark's own work twice as slow there (BENCHMARKS.md, *JVM start-up*), unless
    `jvm.quick_start_driver` asks for it."""
    quick = role != SPARK_DRIVER or settings.jvm.quick_start_driver
    options = quick_start_options(settings) if quick else []
    if settings.jvm.class_sharing:
        archive = archive_path(settings, role, classpath)
        if archive.is_file():
            options.append(f"-XX:SharedArchiveFile={archive}")
    return options


def dump_options(partial: Path) -> list[str]:
    """Options that make a JVM write its archive to `partial` as it exits (quietly: it warns
    about every class it cannot archive, from signed jars or old class-file versions)."""
    return [f"-XX:ArchiveClassesAtExit={partial}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]


def spark_driver_classpath() -> list[Path]:
    """The jars on a pyspark driver's classpath (`spark-class` puts `$SPARK_HOME/jars/*`
    there; the Delta and Kafka jars come later, through `spark.jars`, and are not checked)."""
    from dispatch.stack.spark_cluster import spark_home

    return sorted((spark_home() / "jars").glob("*.jar"))


@contextmanager
def dumping(final: Path) -> Iterator[Path]:
    """A temporary path for a JVM to write its archive to; it becomes `final` only when the
    body returns (the JVM has exited and written it whole), so no JVM ever maps half a file."""
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.{os.getpid()}.partial")
    try:
        yield partial
        if not partial.is_file() or partial.stat().st_size == 0:
            raise ClassSharingError(f"the JVM exited without writing {partial}")
        partial.replace(final)
        role = final.stem.rsplit("-", 1)[0]
        others = [
            path
            for path in final.parent.glob(f"{role}-*{ARCHIVE_SUFFIX}")
            if path != final and path.stem.rsplit("-", 1)[0] == role
        ]
        others.sort(key=lambda path: path.stat().st_mtime_ns, reverse=True)
        for stale in others[KEPT_PER_ROLE - 1 :]:
            # Archives of jars gone, or of checkouts not bootstrapped lately (50-200 MB each).
            stale.unlink(missing_ok=True)
    finally:
        partial.unlink(missing_ok=True)
