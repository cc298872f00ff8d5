"""How `pytest -n N --dist loadscope` (scripts/test.sh) shares the tests between its workers.

Each pytest-xdist worker is a pytest session of its own, with its own session fixtures: its
own broker, object store and Spark driver, each started when a test first asks for it. The
scheduling below keeps what that costs small:

- Every module that uses the `spark` fixture is one work unit, `SPARK_GROUP`: one worker starts
  a Spark driver, not each. A driver is the heaviest process of the run, and the code its JIT
  compiled for one query serves every later one.
- Every other module is a work unit of its own, so its module-scoped fixtures (the real run
  feeding the notebooks, a broker cluster) run once, on one worker.
- The units go out heaviest first: the Spark unit, then the integration modules, then the unit
  modules, short ones that fill the end of the run (longest job first).

pytest-xdist's own `--dist loadgroup` would do the grouping from `xdist_group` marks, but with
pytest 9 its rename of the test ids no longer takes (it sets a private attribute pytest 9 no
longer reads), so the scheduler here groups by a table instead. The workers know which
modules use Spark (they collect); the controller, which schedules, does not collect: each
worker writes the table to a file the controller names in its `workerinput`, and the
controller reads it once every worker has collected, before it hands out the first test.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

SPARK_GROUP = "spark-session"
WORKER_INPUT_KEY = "dispatch_groups_file"
"""Where a worker finds the table's path: the controller's `workerinput` for it."""
GROUPS_FILE = pytest.StashKey[Path]()
"""The controller's path of the table, when it schedules with `GroupScheduling`."""


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def groups_of(items: list[pytest.Item]) -> dict[str, str]:
    """Each test's work unit: `SPARK_GROUP` for the modules that use the session's Spark
    driver (directly or through a fixture), its module for the others."""
    spark_modules = {module_of(item.nodeid) for item in items if "spark" in item.fixturenames}  # type: ignore[attr-defined]
    return {
        item.nodeid: SPARK_GROUP
        if module_of(item.nodeid) in spark_modules
        else module_of(item.nodeid)
        for item in items
    }


def heaviest_first(items: list[pytest.Item], groups: dict[str, str]) -> None:
    """Sort `items` in place: the Spark unit, the integration modules, the unit modules, each
    in collection order."""

    def weight(item: pytest.Item) -> int:
        if groups[item.nodeid] == SPARK_GROUP:
            return 0
        return 1 if item.nodeid.startswith("tests/integration/") else 2

    items.sort(key=weight)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
    """pytest-xdist's scope scheduling, with the work units of `groups_of` in the order the
    workers collected them (`heaviest_first`), not reordered by size."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False
        self._groups_file = config.stash[GROUPS_FILE]
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            # Called first in `schedule`, once every worker reported its collection: every
            # worker wrote the file before it reported.
            self._groups = json.loads(self._groups_file.read_text())
        return self._groups.get(nodeid, module_of(nodeid))


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def schedules_by_group(config: pytest.Config) -> bool:
    """The controller of a distributed run that `GroupScheduling` schedules."""
    return not is_worker(config) and config.getvalue("dist") == "loadscope"


def pytest_configure(config: pytest.Config) -> None:
    if schedules_by_group(config):
        folder = Path(tempfile.mkdtemp(prefix="dispatch-test-groups-"))
        config.stash[GROUPS_FILE] = folder / "groups.json"


def pytest_unconfigure(config: pytest.Config) -> None:
    groups_file = config.stash.get(GROUPS_FILE, None)
    if groups_file is not None:
        groups_file.unlink(missing_ok=True)
        groups_file.parent.rmdir()


def pytest_configure_node(node: Any) -> None:  # an xdist WorkerController (untyped)
    groups_file = node.config.stash.get(GROUPS_FILE, None)
    if groups_file is not None:
        node.workerinput[WORKER_INPUT_KEY] = str(groups_file)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> GroupScheduling | None:
    return GroupScheduling(config, log) if schedules_by_group(config) else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = groups_of(items)
    heaviest_first(items, groups)
    path = config.workerinput.get(WORKER_INPUT_KEY) if is_worker(config) else None  # type: ignore[attr-defined]
    if path is not None:
        groups_file = Path(path)
        # Every worker writes the same table; a rename makes each write whole.
        partial = groups_file.with_name(f".{os.getpid()}.json")
        partial.write_text(json.dumps(groups))
        partial.replace(groups_file)
