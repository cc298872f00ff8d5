"""The work units scripts/test.sh's workers share (tests/scheduling.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from tests.scheduling import (
    GROUPS_FILE,
    SPARK_GROUP,
    GroupScheduling,
    groups_of,
    heaviest_first,
)


@dataclass
class Collected:
    """What the grouping reads of a collected test."""

    nodeid: str
    fixturenames: list[str] = field(default_factory=list)


def items(*collected: Collected) -> list[pytest.Item]:
    return cast("list[pytest.Item]", list(collected))


UNIT = Collected("tests/unit/test_wire.py::test_a")
API = Collected("tests/integration/api/test_jobs.py::test_b", ["topics"])
FOLD = Collected("tests/integration/streaming/test_app.py::test_c", ["topics", "spark"])
FOLD_WITHOUT_SPARK = Collected("tests/integration/streaming/test_app.py::test_d", ["settings"])
NOTEBOOK = Collected("tests/integration/notebooks/test_notebooks.py::test_e[x]", ["spark"])


def test_every_module_using_spark_is_one_unit_and_the_others_one_unit_per_module() -> None:
    groups = groups_of(items(UNIT, API, FOLD, FOLD_WITHOUT_SPARK, NOTEBOOK))
    assert groups == {
        UNIT.nodeid: "tests/unit/test_wire.py",
        API.nodeid: "tests/integration/api/test_jobs.py",
        # A module's tests stay together, those that do not use Spark too: its module
        # fixtures run once.
        FOLD.nodeid: SPARK_GROUP,
        FOLD_WITHOUT_SPARK.nodeid: SPARK_GROUP,
        NOTEBOOK.nodeid: SPARK_GROUP,
    }


def test_the_spark_unit_goes_first_then_integration_then_unit_modules() -> None:
    collected = items(UNIT, API, FOLD, NOTEBOOK, FOLD_WITHOUT_SPARK)
    heaviest_first(collected, groups_of(collected))
    assert [item.nodeid for item in collected] == [
        FOLD.nodeid,
        NOTEBOOK.nodeid,
        FOLD_WITHOUT_SPARK.nodeid,
        API.nodeid,
        UNIT.nodeid,
    ]


class ControllerConfig:
    """What xdist's scope scheduling reads of the controller's config: two workers."""

    def __init__(self) -> None:
        self.option = SimpleNamespace(tx=["popen"] * 2, loadscopereorder=True)
        self.stash = pytest.Stash()

    def getvalue(self, name: str) -> object:
        return getattr(self.option, name)


def test_the_scheduler_reads_the_units_the_workers_wrote(tmp_path: Path) -> None:
    groups_file = tmp_path / "groups.json"
    groups_file.write_text(json.dumps(groups_of(items(API, FOLD, NOTEBOOK))))
    config = ControllerConfig()
    config.stash[GROUPS_FILE] = groups_file
    scheduling = GroupScheduling(cast("pytest.Config", config))
    assert scheduling._split_scope(FOLD.nodeid) == SPARK_GROUP
    assert scheduling._split_scope(NOTEBOOK.nodeid) == SPARK_GROUP
    assert scheduling._split_scope(API.nodeid) == "tests/integration/api/test_jobs.py"
    # A test the table does not know (none should be) is scheduled with its module.
    assert scheduling._split_scope(UNIT.nodeid) == "tests/unit/test_wire.py"
    assert config.option.loadscopereorder is False
