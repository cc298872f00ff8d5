"""The application's options and names (running it is the integration tests' job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.settings import load_settings
from streaming.app import checkpoint_dir, parse_options, topics_of
from streaming.batch import BatchWriter
from streaming.decode import Topics


def test_command_line_options() -> None:
    options, available_now = parse_options(
        ["--max-offsets-per-trigger", "7", "--available-now", "--no-maintenance"]
    )
    assert options.max_offsets_per_trigger == 7 and options.maintenance is None
    assert available_now
    defaults, later = parse_options([])
    assert defaults.maintenance is not None and not later
    assert defaults.fold_on == "executors"
    assert parse_options(["--fold-on", "driver"])[0].fold_on == "driver"


def test_an_unknown_fold_place_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_options(["--fold-on", "gpu"])
    with pytest.raises(ValueError, match="fold_on"):
        BatchWriter(Path("w"), Topics("s", "e", "r"), Path("c"), fold_on="gpu")


def test_topics_and_checkpoint_come_from_the_settings(tmp_path: Path) -> None:
    settings = load_settings(paths={"var": str(tmp_path)})
    assert topics_of(settings).all() == (
        settings.kafka.submit_topic,
        settings.kafka.events_topic,
        settings.kafka.rejected_topic,
    )
    assert checkpoint_dir(settings) == tmp_path / "checkpoints" / "streaming"
