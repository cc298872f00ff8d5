"""The application's options and names (running it is the integration tests' job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.settings import load_settings
from dispatch.storage import Location
from dispatch.streaming.app import checkpoint_dir, fold_place, parse_options, topics_of
from dispatch.streaming.batch import BatchWriter
from dispatch.streaming.decode import Topics
from dispatch.warehouse import Warehouse


def test_command_line_options() -> None:
    options, available_now = parse_options(
        ["--max-offsets-per-trigger", "7", "--available-now", "--no-maintenance"]
    )
    assert options.max_offsets_per_trigger == 7 and options.maintenance is None
    assert available_now
    defaults, later = parse_options([])
    assert defaults.maintenance is not None and not later
    assert defaults.fold_on == "auto"
    assert parse_options(["--fold-on", "executors"])[0].fold_on == "executors"


def test_auto_folds_on_the_driver_locally_and_on_the_executors_of_a_cluster() -> None:
    assert fold_place("auto", "local[2]") == "driver"
    assert fold_place("auto", "local") == "driver"
    assert fold_place("auto", "spark://10.0.0.1:7077") == "executors"
    assert fold_place("executors", "local[2]") == "executors"
    assert fold_place("driver", "spark://10.0.0.1:7077") == "driver"


def test_an_unknown_fold_place_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_options(["--fold-on", "gpu"])
    with pytest.raises(ValueError, match="fold_on"):
        BatchWriter(Warehouse.at("w"), Topics("s", "e", "r"), Location.at("c"), fold_on="gpu")


def test_topics_and_checkpoint_come_from_the_settings(tmp_path: Path) -> None:
    settings = load_settings(paths={"var": str(tmp_path)})
    assert topics_of(settings).all() == (
        settings.kafka.submit_topic,
        settings.kafka.events_topic,
        settings.kafka.rejected_topic,
    )
    assert checkpoint_dir(settings).uri == str(tmp_path / "checkpoints" / "streaming")
