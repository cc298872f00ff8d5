"""The notebooks run on Databricks unchanged: checked fast, without Spark or Databricks.

Databricks is not available here, so its `dbutils` is a fake with the two calls the notebooks
make, `dbutils.widgets.text(name, defaultValue)` and `dbutils.widgets.get(name)` (a job's
parameter, or what the user typed in the box, else the widget's default), and the cluster's
Spark session is a fake that records what is done to it. The cells run as a kernel runs them
(IPython's transformer turns `%matplotlib` into a call), each notebook in a namespace of its
own, as `globals()`; `dbutils` and `spark` are in it as Databricks puts them there.

The rules: every parameter is a widget with the cell's default, read back typed like the
default (a flag only from true/false, so a typo cannot turn a dry run into a real one); a
running session is used as it is (no configuration, no log level, no project settings, no
local jars) and never stopped; only a session the notebook made is stopped; the warehouse is
a URI or a path joined as text (pathlib turns `s3://b` into `s3:/b`). A session the notebook
makes is built from settings whose warehouse is the notebook's, so an `s3://` warehouse gets
S3A with the settings' storage endpoint and keys. The headless runs of
tests/integration/notebooks cover the other side: no session, the notebook makes its own.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from IPython.core.inputtransformer2 import TransformerManager
from nbformat import NotebookNode
from pyspark.sql import SparkSession

import dispatch.settings
import dispatch.streaming.session
from dispatch.delta.tables import SCHEMAS
from dispatch.settings import Settings
from dispatch.streaming.session import S3A_FILESYSTEM, spark_config
from notebooks.run import PARAMETERS_TAG, parameter_names, read_notebook

NOTEBOOKS = Path(__file__).resolve().parents[3] / "notebooks"
NAMES = ("queue_health", "job_forensics", "dlq_redrive", "throughput")
WAREHOUSE = "s3://dispatch/warehouse"
SETUP_TAG = "setup"
TEARDOWN_TAG = "teardown"

Namespace = dict[str, Any]

LOAD_SETTINGS = dispatch.settings.load_settings
"""The real one: the `forbidden` fixture replaces it, a test may call it through a spy."""


# --- fakes of what Databricks provides ------------------------------------------------------


class FakeWidgets:
    """`dbutils.widgets`: `text` makes a widget with a default, `get` reads its value (the
    job's parameter or the user's input, else the default); reading a widget that was never
    made fails, as on Databricks."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.defaults: dict[str, str] = {}

    def text(self, name: str, defaultValue: str, label: str | None = None) -> None:
        assert isinstance(defaultValue, str), f"widget {name}: default {defaultValue!r}"
        self.defaults[name] = defaultValue

    def get(self, name: str) -> str:
        if name not in self.defaults:
            raise LookupError(f"InputWidgetNotDefined: {name}")
        return self.values.get(name, self.defaults[name])


class FakeDbutils:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.widgets = FakeWidgets(values or {})


class FakeFrame:
    def __init__(self, session: FakeSession, source: str) -> None:
        self.session = session
        self.source = source

    def createOrReplaceTempView(self, name: str) -> None:
        self.session.views[name] = self.source


class FakeReader:
    def __init__(self, session: FakeSession) -> None:
        self.session = session

    def format(self, source: str) -> FakeReader:
        assert source == "delta"
        return self

    def load(self, path: str) -> FakeFrame:
        assert isinstance(path, str), f"load({path!r}): Spark takes the location as text"
        self.session.loaded.append(path)
        return FakeFrame(self.session, path)


class FakeSession:
    """A Spark session that records what a notebook's setup and teardown do to it."""

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.views: dict[str, str] = {}
        self.touched: list[str] = []
        """Session-wide changes: configuration, log level, stop."""
        self.read = FakeReader(self)
        self.conf = SimpleNamespace(set=lambda key, value: self.touched.append(f"conf {key}"))

    @property
    def sparkContext(self) -> Any:
        return SimpleNamespace(setLogLevel=lambda level: self.touched.append(f"log {level}"))

    def sql(self, text: str) -> FakeFrame:
        return FakeFrame(self, text)

    def stop(self) -> None:
        self.touched.append("stop")


class FakeIPython:
    def run_line_magic(self, name: str, line: str) -> None:
        assert (name, line) == ("matplotlib", "inline")


# --- running cells --------------------------------------------------------------------------


def notebook_of(name: str) -> NotebookNode:
    return read_notebook(NOTEBOOKS / f"{name}.ipynb")


def cell_source(notebook: NotebookNode, tag: str) -> str:
    [found] = [c for c in notebook.cells if tag in c.get("metadata", {}).get("tags", [])]
    return str(found.source)


def code_cells(notebook: NotebookNode) -> list[NotebookNode]:
    return [c for c in notebook.cells if c.cell_type == "code"]


def as_python(source: str) -> str:
    """A cell's code as the kernel runs it: IPython turns `%magic` lines into calls."""
    # IPython's transformer carries no type hints.
    python: str = TransformerManager().transform_cell(source)  # type: ignore[no-untyped-call]
    return python


def run_cell(name: str, tag: str, namespace: Namespace) -> None:
    """Execute a tagged cell as the kernel would, with `namespace` as its globals."""
    source = as_python(cell_source(notebook_of(name), tag))
    exec(compile(source, f"{name}.ipynb:{tag}", "exec"), namespace)


def defaults_of(name: str) -> dict[str, Any]:
    """The parameters cell's values as written (literals, as papermill requires)."""
    found: dict[str, Any] = {}
    for statement in ast.parse(cell_source(notebook_of(name), PARAMETERS_TAG)).body:
        if isinstance(statement, ast.Assign):
            [target] = statement.targets
            assert isinstance(target, ast.Name)
            found[target.id] = ast.literal_eval(statement.value)
    return found


def parameters_with(name: str, values: dict[str, str]) -> tuple[Namespace, FakeWidgets]:
    """The parameters cell run on Databricks, the widgets holding `values`."""
    dbutils = FakeDbutils(values)
    namespace: Namespace = {"dbutils": dbutils}
    run_cell(name, PARAMETERS_TAG, namespace)
    return namespace, dbutils.widgets


@pytest.fixture
def forbidden(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The project's settings and session factory, recorded as they are called (tests that
    allow them replace them again); no configuration file, as in a package on a cluster."""
    calls: list[str] = []

    def refused(what: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(what)
            raise AssertionError(f"{what} called on a cluster")

        return call

    monkeypatch.setenv("DISPATCH_CONFIG", "/nonexistent/defaults.toml")
    monkeypatch.setattr(dispatch.settings, "load_settings", refused("load_settings"))
    monkeypatch.setattr(dispatch.streaming.session, "spark_session", refused("spark_session"))
    # The plots' backend: no display here.
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return calls


def active_session(monkeypatch: pytest.MonkeyPatch, session: FakeSession | None) -> None:
    monkeypatch.setattr(SparkSession, "getActiveSession", lambda: session)


def set_up(name: str, namespace: Namespace) -> None:
    namespace.setdefault("get_ipython", FakeIPython)
    run_cell(name, SETUP_TAG, namespace)


# --- parameters -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_without_dbutils_the_parameters_are_the_cells_defaults(name: str) -> None:
    namespace: Namespace = {}
    run_cell(name, PARAMETERS_TAG, namespace)
    defaults = defaults_of(name)
    assert {key: namespace[key] for key in defaults} == defaults
    # notebooks/run.py injects a value for each of these names, and only for these.
    assert parameter_names(notebook_of(name)) == list(defaults)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_is_a_widget_with_its_default(name: str) -> None:
    namespace, widgets = parameters_with(name, {})
    defaults = defaults_of(name)
    assert widgets.defaults == {
        key: "" if value is None else str(value) for key, value in defaults.items()
    }
    # Read back unchanged, each value is the default itself, of the same type.
    read = {key: namespace[key] for key in defaults}
    assert read == defaults
    assert {key: type(value) for key, value in read.items()} == {
        key: type(value) for key, value in defaults.items()
    }


def test_widget_values_are_typed_like_the_defaults() -> None:
    namespace, _ = parameters_with(
        "dlq_redrive",
        {
            "warehouse": WAREHOUSE,
            "condition": "exec = 'img.resize'",
            "max_jobs": " 5 ",
            "dry_run": "False",
        },
    )
    assert (namespace["warehouse"], namespace["condition"]) == (WAREHOUSE, "exec = 'img.resize'")
    assert (namespace["max_jobs"], namespace["dry_run"]) == (5, False)
    # A number where the default is None; a job id of digits stays text.
    namespace, _ = parameters_with("job_forensics", {"as_of_version": "7", "job_id": "123"})
    assert (namespace["as_of_version"], namespace["job_id"]) == (7, "123")
    namespace, _ = parameters_with("throughput", {"last_minutes": "30"})
    assert namespace["last_minutes"] == 30


def test_a_flag_takes_only_true_or_false() -> None:
    # A typo must not read as False: for `dry_run` that would redrive for real.
    for typo in ("flase", "no", ""):
        with pytest.raises(ValueError, match="dry_run: true or false"):
            parameters_with("dlq_redrive", {"dry_run": typo})
    namespace, _ = parameters_with("dlq_redrive", {"dry_run": "TRUE"})
    assert namespace["dry_run"] is True


# --- the session ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_on_databricks_its_spark_is_used_as_it_is_and_never_stopped(
    name: str, forbidden: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = FakeSession()
    # On a Spark Connect cluster pyspark may report no active session, or another one.
    active_session(monkeypatch, None)
    namespace, _ = parameters_with(name, {"warehouse": WAREHOUSE + "/"})
    namespace["spark"] = cluster
    set_up(name, namespace)
    run_cell(name, TEARDOWN_TAG, namespace)

    assert namespace["spark"] is cluster
    assert namespace["owns_spark"] is False
    # Not the project's settings (conf/ is not on a cluster), not its session factory.
    assert forbidden == []
    # Nothing session-wide: no configuration, no log level, no stop.
    assert cluster.touched == []
    # The URI intact, each table below it.
    assert cluster.loaded == [f"{WAREHOUSE}/{table}" for table in SCHEMAS]
    assert {"jobs", "events", "stats", "dlq", "jobs_all"} <= set(cluster.views)


@pytest.mark.parametrize("name", NAMES)
def test_a_session_already_running_in_the_kernel_is_used_as_it_is(
    name: str, forbidden: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Jupyter kernel attached to a cluster, the parameters injected by notebooks/run.py.
    running = FakeSession()
    active_session(monkeypatch, running)
    namespace: Namespace = {}
    run_cell(name, PARAMETERS_TAG, namespace)
    namespace["warehouse"] = WAREHOUSE
    set_up(name, namespace)
    run_cell(name, TEARDOWN_TAG, namespace)

    assert namespace["spark"] is running and namespace["owns_spark"] is False
    assert forbidden == []
    assert running.touched == []
    assert running.loaded == [f"{WAREHOUSE}/{table}" for table in SCHEMAS]


@pytest.mark.parametrize("name", NAMES)
def test_without_a_session_the_notebook_makes_its_own_and_stops_it(
    name: str, forbidden: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    active_session(monkeypatch, None)
    made: list[FakeSession] = []
    settings = SimpleNamespace(paths=SimpleNamespace(warehouse=Path("/data/var/delta")))

    def factory(given: Any, app_name: str) -> FakeSession:
        assert given is settings
        made.append(FakeSession())
        return made[-1]

    monkeypatch.setattr(dispatch.settings, "load_settings", lambda: settings)
    monkeypatch.setattr(dispatch.streaming.session, "spark_session", factory)
    namespace: Namespace = {}
    run_cell(name, PARAMETERS_TAG, namespace)
    set_up(name, namespace)
    [own] = made
    assert namespace["spark"] is own and namespace["owns_spark"] is True
    # Empty `warehouse`: the settings' own.
    assert own.loaded == [f"/data/var/delta/{table}" for table in SCHEMAS]
    # Its own session is configured for display, then stopped by the last cell.
    assert "conf spark.sql.repl.eagerEval.enabled" in own.touched
    assert "stop" not in own.touched
    # The setup cell run again keeps it the notebook's own (it is active now).
    active_session(monkeypatch, own)
    set_up(name, namespace)
    assert made == [own] and namespace["owns_spark"] is True
    run_cell(name, TEARDOWN_TAG, namespace)
    assert own.touched[-1] == "stop"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("warehouse", [WAREHOUSE + "/", "/data/tables"])
def test_its_own_session_reaches_the_store_the_warehouse_names(
    name: str, warehouse: str, forbidden: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Headless, with an s3:// warehouse while the settings' own is a local folder: the session
    # the notebook makes must have S3A for it, with the endpoint and keys of the settings'
    # [storage] (here DISPATCH_STORAGE__* variables, as a user would set them). A folder
    # needs no S3A.
    active_session(monkeypatch, None)
    monkeypatch.delenv("DISPATCH_CONFIG")
    monkeypatch.setenv("DISPATCH_PATHS__WAREHOUSE", "/data/var/delta")
    storage = {
        "ENDPOINT_URL": "http://127.0.0.1:9000",
        "REGION": "us-east-1",
        "ACCESS_KEY_ID": "notebook-key",
        "SECRET_ACCESS_KEY": "notebook-secret",
    }
    for key, value in storage.items():
        monkeypatch.setenv(f"DISPATCH_STORAGE__{key}", value)
    loaded: list[dict[str, Any]] = []
    configs: list[dict[str, str]] = []

    def load_settings(profile: str | None = None, **overrides: Any) -> Settings:
        loaded.append(overrides)
        return LOAD_SETTINGS(profile, **overrides)

    def factory(given: Settings, app_name: str) -> FakeSession:
        # What the real factory would configure; no AWS_* variables of the test's own.
        configs.append(spark_config(given, jars=[], environ={}))
        return FakeSession()

    monkeypatch.setattr(dispatch.settings, "load_settings", load_settings)
    monkeypatch.setattr(dispatch.streaming.session, "spark_session", factory)
    namespace: Namespace = {}
    run_cell(name, PARAMETERS_TAG, namespace)
    namespace["warehouse"] = warehouse
    set_up(name, namespace)

    assert loaded == [{"paths": {"warehouse": warehouse}}]
    [config] = configs
    hadoop = {key: value for key, value in config.items() if key.startswith("spark.hadoop.")}
    if warehouse.startswith("s3://"):
        assert hadoop["spark.hadoop.fs.s3.impl"] == S3A_FILESYSTEM
        assert hadoop["spark.hadoop.fs.s3a.endpoint"] == storage["ENDPOINT_URL"]
        assert hadoop["spark.hadoop.fs.s3a.access.key"] == storage["ACCESS_KEY_ID"]
        assert hadoop["spark.hadoop.fs.s3a.secret.key"] == storage["SECRET_ACCESS_KEY"]
    else:
        assert hadoop == {}
    # The tables are read where the parameter says, not where the settings' warehouse is.
    location = warehouse.rstrip("/")
    assert namespace["spark"].loaded == [f"{location}/{table}" for table in SCHEMAS]


# --- the code, read ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_no_cell_depends_on_the_local_stack_outside_the_owned_branch(name: str) -> None:
    notebook = notebook_of(name)
    for cell in code_cells(notebook):
        tags = cell.get("metadata", {}).get("tags", [])
        source = str(cell.source)
        # Paths as pathlib objects break on URIs (`s3://b` / "t" is `s3:/b/t`).
        code = ast.parse(as_python(source))
        for node in ast.walk(code):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else []
                modules += [alias.name for alias in node.names]
                assert "pathlib" not in modules, f"{name} {tags}: imports pathlib"
        if SETUP_TAG in tags:
            continue
        # The project's settings and session factory, delta-rs readers (they bypass the
        # session's storage credentials) and session-wide changes belong to the setup cell,
        # where they run only for a session the notebook made.
        for word in ("load_settings", "spark_session", "StatsRollup", "DeltaCommits"):
            assert word not in source, f"{name} {tags}: {word}"
        assert "sparkContext" not in source and "conf.set" not in source, f"{name} {tags}"
        if TEARDOWN_TAG not in tags:
            assert ".stop()" not in source, f"{name} {tags}: stops the session"
