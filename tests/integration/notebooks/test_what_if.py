"""`notebooks/what_if.ipynb`, executed headless as a user runs it (`notebooks/run.py` in a
process of its own), against a recorded history and no stack: the demo's job mix run by the
pure core under a leader loop of its own, its events written to a real Delta `events` table by
the fold's own row maker and writer (tests/unit/replay/recording.py; no Kafka, no Spark). The
notebook replays a window of it twice (delta-rs, no JVM) and is checked on what it shows:
every tenant of the window, the recorded figures `dispatch replay --json` gives for the same
window, each replay's figures as that command gives them for the same `--set`, a tighter cap
making its tenant wait longer, the plot, both runs saved to `replays`.

The other notebooks need the whole stack (test_notebooks.py and its conftest); this module
only borrows that file's helpers for reading an executed notebook.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat import NotebookNode

from dispatch.replay.table import REPLAYS
from dispatch.settings import ENV_PREFIX
from dispatch.warehouse import Warehouse
from notebooks.run import PARAMETERS_TAG, parameter_names, read_notebook
from tests.integration.notebooks.test_notebooks import (
    NOTEBOOKS,
    cell,
    execute_notebook,
    pngs,
    text,
)
from tests.unit.notebooks.test_databricks import parameters_with
from tests.unit.replay.recording import (
    RECORDED_SETTINGS,
    START,
    job_mix,
    record_run,
    write_events_table,
)

# A kernel of its own and two replays of a few hundred jobs: seconds, minutes on a busy machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NAME = "what_if"
SINCE, UNTIL = "2026-01-01T00:00:30Z", "2026-01-01T00:01:30Z"
"""A minute of the recording (START + 30 s to START + 90 s) holding acme's burst of 60 jobs:
replayed with the warm-up before it and the tail after it."""
CAPPED = "acme"
FIRST = {f"dispatcher.caps.{CAPPED}": 2}
SECOND = {f"dispatcher.caps.{CAPPED}": 1}
"""acme ran with a cap of 6 (RECORDED_SETTINGS): replay 1 holds it to 2 jobs in flight,
replay 2 to 1."""
RUNS = ("actual", "replay 1", "replay 2")
NOTEBOOK_TIMEOUT_S = 240.0


def settings_as_environment() -> dict[str, str]:
    """DISPATCH_DISPATCHER__* variables naming every setting the recording ran under, so
    `dispatch replay` takes them as the window's, whatever conf/defaults.toml says."""
    return {
        f"{ENV_PREFIX}DISPATCHER__{name.upper()}": value
        if isinstance(value, str)
        else json.dumps(value)
        for name, value in RECORDED_SETTINGS.model_dump(mode="json").items()
    }


def dispatch_replay_json(warehouse: Warehouse, changes: dict[str, int]) -> dict[str, Any]:
    """`dispatch replay --since SINCE --until UNTIL --set ... --json --no-save`, run as a user
    runs it (the venv's command, in a process of its own); its JSON."""
    command = [str(Path(sys.executable).parent / "dispatch"), "replay", "--json", "--no-save"]
    command += ["--since", SINCE, "--until", UNTIL]
    for key, value in changes.items():
        command += ["--set", f"{key}={json.dumps(value)}"]
    env = {
        **os.environ,
        f"{ENV_PREFIX}PATHS__WAREHOUSE": warehouse.location,
        **settings_as_environment(),
    }
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"dispatch replay failed:\n{done.stderr}"
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def run_what_if(folder: Path, **parameters: Any) -> NotebookNode:
    """`notebooks/run.py what_if.ipynb -o ... -p NAME JSON...` in a process of its own; the
    executed copy."""
    return execute_notebook(folder, NAME, parameters)


# --- reading the tables the notebook showed ----------------------------------------------------


class _HtmlTables(HTMLParser):
    """Every <table> of an HTML text as its rows, each row its cells' texts (th and td)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("th", "td"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def frames(notebook: NotebookNode, tag: str) -> list[list[dict[str, str]]]:
    """The pandas frames a cell displayed, as a Jupyter front end shows them (HTML): rows as
    {column: text}, the index (a named one: its name heads the second header row) first."""
    found: list[list[dict[str, str]]] = []
    for output in cell(notebook, tag).get("outputs", []):
        html = output.get("data", {}).get("text/html")
        if html is None:
            continue
        parser = _HtmlTables()
        parser.feed(html)
        for header, index, *body in parser.tables:
            columns = [index[0], *header[1:]]
            found.append([dict(zip(columns, row, strict=True)) for row in body])
    return found


def number(shown: str) -> float:
    return math.nan if shown == "NaN" else float(shown)


def as_shown(value: float | None) -> float:
    """A figure of the JSON as the notebook shows it: seconds to the ms, no value as NaN."""
    return math.nan if value is None else round(value, 3)


FIGURES = {
    "jobs": "jobs",
    "completed": "completed",
    "attempts": "attempts",
    "dead_lettered": "dead_lettered",
    "queue_wait_p50_s": "wait_p50_s",
    "queue_wait_p95_s": "wait_p95_s",
    "queue_wait_p99_s": "wait_p99_s",
    "throughput_per_s": "throughput_per_s",
}
"""The report's figures (JSON) and the notebook's columns for them."""


def differences(row: dict[str, str], figures: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The columns of a shown row that are not the figures' values: {column: (shown, JSON)}."""
    found: dict[str, tuple[str, Any]] = {}
    for name, column in FIGURES.items():
        shown, expected = number(row[column]), as_shown(figures[name])
        same = (math.isnan(shown) and math.isnan(expected)) or shown == expected
        if not same:
            found[column] = (row[column], figures[name])
    return found


# --- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Executed:
    warehouse: Warehouse
    tenants: set[str]
    """The clients of the jobs enqueued in the window, from the job mix itself."""
    jobs: int
    """The jobs enqueued in the window, from the job mix itself."""
    notebook: NotebookNode
    per_tenant: list[dict[str, str]]
    overall: list[dict[str, str]]
    first_json: dict[str, Any]
    second_json: dict[str, Any]

    def rows(self, tenant: str) -> dict[str, dict[str, str]]:
        return {row["run"]: row for row in self.per_tenant if row["tenant"] == tenant}


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Executed:
    folder = tmp_path_factory.mktemp("what-if")
    warehouse = Warehouse.at(folder / "delta")
    jobs = job_mix(seed=9)
    write_events_table(warehouse, record_run(jobs))
    in_window = [job for job in jobs if START + 30 <= job.at < START + 90]
    notebook = run_what_if(
        folder,
        warehouse=warehouse.location,
        since=SINCE,
        until=UNTIL,
        first=FIRST,
        second=SECOND,
        # Every setting the recording ran under, as the command gets them from its environment.
        ran_under=RECORDED_SETTINGS.model_dump(mode="json"),
        save=True,
    )
    per_tenant, overall = frames(notebook, "per-tenant")
    return Executed(
        warehouse,
        {job.request.client_id for job in in_window},
        len(in_window),
        notebook,
        per_tenant,
        overall,
        dispatch_replay_json(warehouse, FIRST),
        dispatch_replay_json(warehouse, SECOND),
    )


# --- the notebook as a file ----------------------------------------------------------------------


def test_the_notebook_is_saved_clean_with_one_parameters_cell_and_no_spark() -> None:
    notebook = read_notebook(NOTEBOOKS / f"{NAME}.ipynb")
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    tagged = [c for c in code if PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])]
    assert tagged == [code[0]], "the first code cell, and only it, holds the parameters"
    assert parameter_names(notebook)[0] == "warehouse"
    # delta-rs reads the table: no Spark session, no JVM to start or to stop.
    assert not [c.id for c in code if "spark" in c.source.lower()]


def test_on_databricks_every_parameter_is_a_widget_read_back_typed() -> None:
    namespace, widgets = parameters_with(
        NAME,
        {
            "first": '{"dispatcher.caps.acme": 3}',
            "ran_under": '{"ack_timeout_s": 10}',
            "version": "7",
            "seed": "3",
            "save": "true",
            "since": "2026-01-06T09:00:00Z",
        },
    )
    assert set(widgets.defaults) == set(parameter_names(read_notebook(NOTEBOOKS / f"{NAME}.ipynb")))
    assert widgets.defaults["second"] == '{"dispatcher.default_cap": 50}'
    assert namespace["first"] == {"dispatcher.caps.acme": 3}
    assert namespace["second"] == {"dispatcher.default_cap": 50}
    assert namespace["ran_under"] == {"ack_timeout_s": 10}
    assert (namespace["version"], namespace["seed"], namespace["save"]) == (7, 3, True)
    assert namespace["since"] == "2026-01-06T09:00:00Z" and namespace["until"] == ""
    # A mapping that is not a JSON object, or a flag that is not true/false, fails there.
    for wrong in ('["dispatcher.caps.acme", 3]', "{dispatcher.caps.acme: 3}"):
        with pytest.raises(ValueError, match="widget first: a JSON object"):
            parameters_with(NAME, {"first": wrong})
    with pytest.raises(ValueError, match="widget save: true or false"):
        parameters_with(NAME, {"save": "yes"})


# --- executed against the recording --------------------------------------------------------------


def test_the_table_lists_every_tenant_of_the_window_actual_and_both_replays(
    executed: Executed,
) -> None:
    assert executed.tenants == {"acme", "globex", "initech"}
    assert {row["tenant"] for row in executed.per_tenant} == executed.tenants
    for tenant in executed.tenants:
        assert [row["run"] for row in executed.per_tenant if row["tenant"] == tenant] == list(RUNS)
    assert [row["run"] for row in executed.overall] == list(RUNS)
    said = text(executed.notebook, "replays")
    assert f"replay 1: dispatcher.caps.acme=2: {executed.jobs} jobs in the window" in said
    assert f"replay 2: dispatcher.caps.acme=1: {executed.jobs} jobs in the window" in said
    shown_jobs = sum(int(row["jobs"]) for row in executed.per_tenant if row["run"] == "actual")
    assert shown_jobs == executed.jobs


def test_the_figures_are_those_of_dispatch_replay_json(executed: Executed) -> None:
    for replay, report in (("replay 1", executed.first_json), ("replay 2", executed.second_json)):
        groups = {(g["dimension"], g["key"]): g for g in report["groups"]}
        clients = {key for dimension, key in groups if dimension == "client"}
        assert clients == executed.tenants
        for tenant in clients:
            group, shown = groups[("client", tenant)], executed.rows(tenant)
            assert differences(shown["actual"], group["actual"]) == {}, (tenant, "actual")
            assert differences(shown[replay], group["simulated"]) == {}, (tenant, replay)
        everything = {row["run"]: row for row in executed.overall}
        assert differences(everything["actual"], groups[("all", "all")]["actual"]) == {}
        assert differences(everything[replay], groups[("all", "all")]["simulated"]) == {}


def test_a_tighter_cap_makes_its_tenant_wait_longer_and_the_others_less(
    executed: Executed,
) -> None:
    capped = {run: number(row["wait_p95_s"]) for run, row in executed.rows(CAPPED).items()}
    # A cap of 2, then of 1, instead of the 6 it ran with: acme's burst queues behind itself.
    assert capped["actual"] < capped["replay 1"] < capped["replay 2"], capped
    for tenant in executed.tenants - {CAPPED}:
        waits = {run: number(row["wait_p95_s"]) for run, row in executed.rows(tenant).items()}
        # The slots acme no longer holds serve the other tenants sooner.
        assert waits["replay 1"] < waits["actual"], (tenant, waits)
    # The same work either way: a cap delays jobs, it neither drops nor retries any.
    for tenant in executed.tenants:
        rows = executed.rows(tenant)
        assert {rows[run]["jobs"] for run in RUNS} == {rows["actual"]["jobs"]}
        assert {rows[run]["dead_lettered"] for run in RUNS} == {rows["actual"]["dead_lettered"]}


def test_the_plot_cell_drew_the_waits(executed: Executed) -> None:
    assert pngs(executed.notebook, "wait-plot") == 1


def test_both_runs_are_saved_to_the_replays_table(executed: Executed) -> None:
    rows = executed.warehouse.open(REPLAYS).to_pyarrow_table().to_pylist()
    runs = [json.loads(row["parameters"]) for row in rows if row["row_kind"] == "run"]
    assert sorted(run["set"] for run in runs) == [
        ["dispatcher.caps.acme=1"],
        ["dispatcher.caps.acme=2"],
    ]
    assert {run["window"]["version"] for run in runs} == {
        executed.warehouse.open("events").version()
    }
