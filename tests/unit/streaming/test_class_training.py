"""The training run's own stack: throwaway, on free ports, on the user's jar cache, reading
no archive (a JVM cannot read one and write one at once). The runs themselves start a broker
and a Spark driver: bootstrap makes them, and tests/integration/stack/test_class_sharing.py
checks that the session's JVMs map what they wrote."""

from __future__ import annotations

from pathlib import Path

from dispatch.settings import load_settings
from dispatch.streaming.class_training import training_settings


def test_the_training_stack_is_throwaway_and_reads_no_archive(tmp_path: Path) -> None:
    user = load_settings(
        paths={"var": str(tmp_path / "var"), "cache": str(tmp_path / "cache")},
        jvm={"class_sharing": True, "quick_start": True},
    )
    plain = training_settings(user, tmp_path / "scratch")
    assert plain.paths.var == tmp_path / "scratch" / "var"
    assert plain.paths.cache == user.paths.cache
    assert plain.jar_cache == user.jar_cache
    assert plain.jvm.class_sharing is False
    assert plain.jvm.quick_start is True
    assert plain.kafka.bootstrap != user.kafka.bootstrap
