"""Every notebook of `notebooks/`, executed headless as a user runs it (`notebooks/run.py`
in a process of its own: nbclient, a kernel on this venv's Python, the notebook's own Spark
JVM), against tables made by a real run (see conftest.py), and checked on what its outputs
show. A notebook whose cell fails makes the runner exit non-zero, which fails its test.
`queue_health` also runs against the same tables in an object store (the session's S3Proxy),
given as an `s3://` warehouse, the store's endpoint and keys in its environment only.

The four notebooks on the run's local warehouse run together, in one kernel and one Spark
JVM (`notebooks/run.py` with several notebooks), the redrive last; the object-store run
before them, in a kernel of its own: its check compares the DLQ with the leader's, which the
redrive changes. The tests run in file order.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nbformat
import pyarrow.fs as pafs
import pytest
from kafka import KafkaConsumer, TopicPartition
from nbformat import NotebookNode

from dispatch.core.events import Redriven
from dispatch.delta import tables as t
from dispatch.delta.tables import SCHEMAS
from dispatch.event_records import decode_batch
from dispatch.settings import ENV_PREFIX, to_environment
from dispatch.warehouse import Warehouse
from notebooks.run import PARAMETERS_TAG, inject_parameters, parameter_names, read_notebook
from tests.integration.notebooks.conftest import EXPECTED_STATUS, Produced
from tests.s3_server import BUCKET, S3Server

# Each notebook starts a kernel and a Spark JVM of its own: minutes on a busy 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NOTEBOOKS = Path(__file__).resolve().parents[3] / "notebooks"
NAMES = ("queue_health", "job_forensics", "dlq_redrive", "throughput")
NOTEBOOK_TIMEOUT_S = 600.0


# --- reading an executed notebook --------------------------------------------------------------


def cell(notebook: NotebookNode, tag: str) -> NotebookNode:
    found: list[NotebookNode] = [
        c for c in notebook.cells if tag in c.get("metadata", {}).get("tags", [])
    ]
    assert len(found) == 1, f"{len(found)} cells tagged {tag!r}"
    return found[0]


def text(notebook: NotebookNode, tag: str) -> str:
    """What the tagged cell printed and showed as text (stdout, and each result's text/plain)."""
    parts: list[str] = []
    for output in cell(notebook, tag).get("outputs", []):
        if output["output_type"] == "stream" and output["name"] == "stdout":
            parts.append(output["text"])
        elif output["output_type"] in ("execute_result", "display_data"):
            parts.append(output["data"].get("text/plain", ""))
    return "\n".join(parts)


def tables(notebook: NotebookNode, tag: str) -> list[list[dict[str, str]]]:
    """The tables a cell showed, as Spark prints them (`show()`, or a DataFrame displayed with
    eager evaluation): rows as {column: text}, NULL as "NULL"."""
    found: list[list[dict[str, str]]] = []
    header: list[str] | None = None
    for line in text(notebook, tag).splitlines():
        if line.startswith("|"):
            values = [value.strip() for value in line.strip().strip("|").split("|")]
            if header is None:
                header = values
                found.append([])
            else:
                found[-1].append(dict(zip(header, values, strict=True)))
        elif not line.startswith("+"):
            header = None
    return found


def table(notebook: NotebookNode, tag: str) -> list[dict[str, str]]:
    [only] = tables(notebook, tag)
    return only


def column(rows: list[dict[str, str]], key: str, value: str) -> dict[str, str]:
    return {row[key]: row[value] for row in rows}


def html_table(notebook: NotebookNode, tag: str) -> list[dict[str, str]]:
    """The one table a cell displayed as HTML (what a Jupyter front end shows of a DataFrame:
    Spark's eager evaluation's `<table>`), rows as {column: text}."""
    [html] = [
        output["data"]["text/html"]
        for output in cell(notebook, tag).get("outputs", [])
        if "text/html" in output.get("data", {})
    ]
    header, *rows = [
        re.findall(r"<t[hd]>(.*?)</t[hd]>", row, re.DOTALL)
        for row in re.findall(r"<tr>(.*?)</tr>", html, re.DOTALL)
    ]
    return [dict(zip(header, row, strict=True)) for row in rows]


def pngs(notebook: NotebookNode, tag: str) -> int:
    return sum(
        "image/png" in output.get("data", {}) for output in cell(notebook, tag).get("outputs", [])
    )


def notebook_environment(produced: Produced, folder: Path) -> dict[str, str]:
    """The kernel's environment: settings from conf/ and the environment like any user's,
    its Spark scratch folders under the test's own var, jars from the same cache.
    The notebook's JVM lives a minute or two: it runs on the client compiler, as every driver
    the tests spawn does (`jvm.quick_start_driver`, tests/conftest.py)."""
    return {
        **os.environ,
        "DISPATCH_PATHS__VAR": str(folder / "var"),
        "DISPATCH_PATHS__CACHE": str(produced.settings.paths.cache),
    }


def run_notebook(
    produced: Produced,
    folder: Path,
    name: str,
    environment: Mapping[str, str] | None = None,
    **parameters: Any,
) -> NotebookNode:
    """Run a notebook as a user does, `notebooks/run.py NAME.ipynb -p ...` in a process of its
    own (which starts the kernel, which starts the notebook's Spark JVM), and return the
    executed copy.

    `warehouse` is the run's unless a parameter says otherwise; `environment` adds variables
    to the process's (and so the kernel's)."""
    env = {**notebook_environment(produced, folder), **(environment or {})}
    return execute_notebook(folder, name, {"warehouse": produced.warehouse, **parameters}, env=env)


def run_runner(
    folder: Path, names: Sequence[str], parameters: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[int, str]:
    """`notebooks/run.py NAME.ipynb... -o ... -p NAME JSON...` in a process of its own (it
    starts the kernel): one notebook's copy goes to `folder/NAME.ipynb`, several notebooks'
    too (`-o` is then their folder). Returns the exit code and the output."""
    paths = [str(NOTEBOOKS / f"{name}.ipynb") for name in names]
    output = folder / f"{names[0]}.ipynb" if len(names) == 1 else folder
    command = [sys.executable, str(NOTEBOOKS / "run.py"), *paths, "-o", str(output)]
    for key, value in parameters.items():
        command += ["-p", key, json.dumps(value)]
    log = folder / f"{'+'.join(names)}.log"
    with log.open("wb") as sink:
        runner = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        code = runner.wait(NOTEBOOK_TIMEOUT_S * len(names))
    finally:
        # Timed out, or the test was interrupted: the kernel exits within a second of its
        # parent (ipykernel's parent poller), and a JVM with the kernel (its stdin closes).
        if runner.poll() is None:
            runner.kill()
            runner.wait(30)
    return code, log.read_text()


def executed_copy(folder: Path, name: str, log: str) -> NotebookNode:
    """The executed copy of `name`, once every cell ran and nothing was left behind."""
    output = folder / f"{name}.ipynb"
    assert output.is_file(), f"{name} was not run:\n{log[-6000:]}"
    notebook = read_notebook(output)
    record = notebook.metadata["dispatch_run"]
    assert record.get("error") is None, f"{name} failed: {record['error']}\n{log[-6000:]}"
    # An error shown without failing its cell (a display formatter's) is still an error.
    shown_errors = [
        c.get("metadata", {}).get("tags")
        for c in notebook.cells
        if any(o["output_type"] == "error" for o in c.get("outputs", []))
    ]
    assert shown_errors == [], f"{name}: cells showing an error: {shown_errors}"
    # The notebook stopped whatever it started (a Spark session it made), so nothing had to
    # be stopped for the next notebook, nor killed with the kernel.
    assert not record["left_spark_session"], f"{name} left its Spark session running"
    assert record["killed"] == [], f"{name}: the kernel left processes behind: {record['killed']}"
    return notebook


def execute_notebook(
    folder: Path,
    name: str,
    parameters: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> NotebookNode:
    """One notebook in a runner (and a kernel) of its own; its executed copy."""
    code, log = run_runner(folder, [name], parameters, env if env is not None else os.environ)
    notebook = executed_copy(folder, name, log)
    assert code == 0, f"{name}: the runner exited {code}:\n{log[-6000:]}"
    return notebook


@dataclass(frozen=True)
class Together:
    """The four notebooks on the run's local warehouse, executed in one runner: one kernel,
    one Spark JVM (notebooks/run.py), in this order, the redrive last."""

    folder: Path
    log: str
    live_dlq: list[str]
    """The leader's DLQ when they started (the redrive, last, changes it)."""

    def notebook(self, name: str) -> NotebookNode:
        return executed_copy(self.folder, name, self.log)


TOGETHER = ("queue_health", "job_forensics", "throughput", "dlq_redrive")
REDRIVEN = ["oom-1", "oom-2"]
"""img.resize jobs dead of OutOfMemoryError in phase A: oom-1 and oom-2. Not oom-3 (died
after the window), bad-1 (another error), mail-oom-1 (another exec), nor the others."""


@pytest.fixture(scope="module")
def together(produced: Produced, tmp_path_factory: pytest.TempPathFactory) -> Together:
    """A user's notebooks share a kernel and its Spark JVM as a Databricks job's share its
    cluster; here that saves three JVM starts and warm-ups (a minute of CPU each on this
    machine). The object-store run has an environment of its own, and a kernel with it."""
    folder = tmp_path_factory.mktemp("notebooks")
    parameters = {
        "warehouse": produced.warehouse,
        # job_forensics
        "job_id": "retry-1",
        "as_of_version": produced.version_after_a,
        # dlq_redrive
        "api_url": produced.node.url,
        "api_key": produced.node.keys["admin"],
        "condition": "exec = 'img.resize' AND error_class = 'OutOfMemoryError'",
        "died_after": utc(produced.phase_a_started),
        "died_before": utc(produced.phase_a_ended),
        "dry_run": False,
    }
    before = leader_dlq(produced)
    _, log = run_runner(folder, TOGETHER, parameters, notebook_environment(produced, folder))
    return Together(folder, log, before)


def utc(moment: dt.datetime) -> str:
    """A time as the notebooks take them: UTC, no zone suffix."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


# --- the notebooks as files ----------------------------------------------------------------------


EVERY_NOTEBOOK = tuple(sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb")))
"""`NAMES` (the Spark notebooks executed here) and the others (`what_if`: delta-rs only)."""


@pytest.mark.parametrize("name", EVERY_NOTEBOOK)
def test_the_notebook_is_saved_clean_with_one_parameters_cell(name: str) -> None:
    notebook = read_notebook(NOTEBOOKS / f"{name}.ipynb")
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    # No outputs, no execution counts: diffs show changes of the code only.
    assert all(not c.outputs and c.execution_count is None for c in code)
    tagged = [c for c in code if PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])]
    assert tagged == [code[0]], "the first code cell, and only it, holds the parameters"
    assert "warehouse" in parameter_names(notebook)
    if name in NAMES:
        # The last cell stops the session the notebook made, never one it found running (a
        # Databricks cluster's): tests/unit/notebooks checks what sets `owns_spark`.
        assert code[-1].source.strip() == "if owns_spark:\n    spark.stop()"


def test_every_notebook_is_checked_here() -> None:
    assert set(NAMES) < set(EVERY_NOTEBOOK) and "what_if" in EVERY_NOTEBOOK


def test_parameters_go_in_a_cell_after_the_parameters_cell_and_typos_are_refused() -> None:
    notebook = read_notebook(NOTEBOOKS / "job_forensics.ipynb")
    injected = inject_parameters(notebook, {"job_id": "j'1", "as_of_version": 3})
    index = next(
        i for i, c in enumerate(injected.cells) if PARAMETERS_TAG in c.metadata.get("tags", [])
    )
    added = injected.cells[index + 1]
    assert added.metadata["tags"] == ["injected-parameters"]
    assert added.source.splitlines()[1:] == ['job_id = "j\'1"', "as_of_version = 3"]
    # Injected again: the earlier injected cell is replaced, not kept.
    again = inject_parameters(injected, {"job_id": "other"})
    assert len(again.cells) == len(notebook.cells) + 1
    with pytest.raises(ValueError, match="unknown parameter"):
        inject_parameters(notebook, {"jobid": "j1"})


# --- executed against the run's tables ---------------------------------------------------------


def test_queue_health_reads_an_object_store_warehouse(
    produced: Produced, s3_server: S3Server, tmp_path: Path
) -> None:
    # The run's tables, file for file, become objects under s3://dispatch/<prefix>/.
    prefix = f"notebooks/{tmp_path.name}/warehouse"
    for name in SCHEMAS:
        upload(Path(produced.warehouse) / name, s3_server, f"{prefix}/{name}")
    uri = s3_server.uri(prefix)
    local_jobs = Warehouse.at(produced.warehouse).open(t.JOBS)
    stored_jobs = Warehouse.at(uri, s3_server.settings()).open(t.JOBS)
    assert stored_jobs.version() == local_jobs.version()
    assert stored_jobs.to_pyarrow_table().num_rows == len(EXPECTED_STATUS)

    # Only the warehouse parameter names the store; its endpoint and keys reach the kernel as
    # any user's settings do (DISPATCH_STORAGE__*); the run's settings name a local folder.
    storage = produced.settings.model_copy(update={"storage": s3_server.settings()})
    environment = {
        key: value
        for key, value in to_environment(storage).items()
        if key.startswith(f"{ENV_PREFIX}STORAGE__")
    }
    notebook = run_notebook(produced, tmp_path, "queue_health", environment, warehouse=uri)

    assert f"{uri}: views " in text(notebook, "setup")
    check_queue_health(notebook, leader_dlq(produced))


def test_queue_health_shows_depth_in_flight_oldest_and_the_dlq(together: Together) -> None:
    check_queue_health(together.notebook("queue_health"), together.live_dlq)


def upload(folder: Path, server: S3Server, key: str) -> None:
    """Every file under `folder` as an object under `key` of the server's bucket, put through
    the S3 API. Not a copy into the server's own folder: S3Proxy then serves the files without
    an ETag, which S3A's reader refuses (delta-rs does not mind)."""
    storage = server.settings()
    endpoint = urlsplit(storage.endpoint_url)
    s3 = pafs.S3FileSystem(
        access_key=storage.access_key_id,
        secret_key=storage.secret_access_key,
        region=storage.region,
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
    )
    pafs.copy_files(
        str(folder),
        f"{BUCKET}/{key}",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=s3,
    )


def leader_dlq(produced: Produced) -> list[str]:
    """The ids of the jobs in the leader's DLQ now."""
    with produced.node.client("admin") as admin:
        return sorted(job["id"] for job in admin.get("/v1/dlq").json()["jobs"])


def check_queue_health(notebook: NotebookNode, live_dlq: list[str]) -> None:
    """What `queue_health` must show of the run's tables, wherever they are; `live_dlq` is
    the leader's DLQ when it ran."""
    statuses = column(table(notebook, "statuses"), "status", "jobs")
    assert statuses == {
        status: str(count) for status, count in Counter(EXPECTED_STATUS.values()).items()
    }
    # A Jupyter front end shows the HTML form of a displayed DataFrame: the same table.
    for tag in ("statuses", "depth-by-exec", "in-flight", "oldest-queued", "dlq-size"):
        assert html_table(notebook, tag) == table(notebook, tag), tag
    by_exec = table(notebook, "depth-by-exec")
    assert [(row["exec"], row["queued"]) for row in by_exec] == [
        ("video.encode", "3"),
        ("report.build", "1"),
    ]
    assert column(table(notebook, "depth-by-client"), "client_id", "queued") == {
        "acme": "3",
        "globex": "1",
    }
    in_flight = table(notebook, "in-flight")
    assert [(row["worker_id"], row["running"], row["execs"]) for row in in_flight] == [
        ("w1", "2", "img.resize"),
        ("w2", "1", "report.build"),
    ]
    assert "Oldest queued job: q-1 (video.encode, client acme)" in text(notebook, "oldest-queued")
    assert [row["id"] for row in table(notebook, "oldest-queued")] == ["q-1", "q-2", "q-3", "q-4"]

    dead = sorted(job_id for job_id, status in EXPECTED_STATUS.items() if status == "dead")
    assert f"DLQ size: {len(dead)} dead job(s)" in text(notebook, "dlq-size")
    assert live_dlq == dead, "the leader's DLQ when the notebook ran"
    breakdown = {
        (row["exec"], row["dead_reason"]): row["dead"] for row in table(notebook, "dlq-size")
    }
    assert breakdown == {
        ("img.resize", "permanent_failure"): "4",
        ("mail.send", "permanent_failure"): "1",
        ("report.build", "ack_timeout"): "1",
        ("report.build", "retries_exhausted"): "1",
    }


def test_job_forensics_shows_the_history_and_the_state_as_of_a_past_version(
    produced: Produced, together: Together
) -> None:
    version = produced.version_after_a
    notebook = together.notebook("job_forensics")

    [now] = table(notebook, "job-now")
    assert (now["status"], now["attempts"], now["exec"]) == ("succeeded", "2", "mail.send")
    [arrival] = table(notebook, "arrival")
    assert arrival["kind"] == "submit" and '"id":"retry-1"' in arrival["body"]
    history = table(notebook, "history")
    assert [(row["type"], row["attempt"], row["reason"]) for row in history] == [
        ("enqueued", "NULL", "NULL"),
        ("assigned", "1", "NULL"),
        ("requeued", "1", "failed"),
        ("assigned", "2", "NULL"),
        ("completed", "2", "NULL"),
    ]
    offsets = [(int(row["offset"]), int(row["idx"])) for row in history]
    assert offsets == sorted(offsets), "the history is in log order"

    as_of = text(notebook, "as-of")
    assert f"then = jobs version {version} (MERGE, streaming batch 0)" in as_of
    assert "reads the same rows as versionAsOf: True" in as_of
    then_now = {
        row["status"]: (row["jobs_then"], row["jobs_now"])
        for row in table(notebook, "status-then-now")
    }
    assert then_now == {
        "cancelled": ("1", "1"),
        "dead": ("4", "7"),
        "queued": ("3", "4"),
        "running": ("0", "3"),
        "succeeded": ("6", "7"),
    }
    changed = {
        row["id"]: (row["status_then"], row["status_now"]) for row in table(notebook, "changed")
    }
    assert changed.pop("retry-1") == ("queued", "succeeded")
    assert changed == {
        job_id: ("(not yet)", EXPECTED_STATUS[job_id])
        for job_id in ("flaky-1", "oom-3", "q-3", "q-4", "run-1", "run-2", "run-3", "slow-1")
    }
    assert [
        (row["as_of"], row["status"], row["attempts"]) for row in table(notebook, "job-then-now")
    ] == [(f"then (v{version})", "queued", "1"), ("now", "succeeded", "2")]
    since = [row["type"] for row in table(notebook, "since-then")]
    assert since == ["assigned", "completed"]


def test_throughput_shows_totals_percentiles_and_plots(together: Together) -> None:
    notebook = together.notebook("throughput")

    totals = {row["exec"]: row for row in table(notebook, "totals-by-exec")}
    counters = ("submitted", "started", "retries", "completed", "dead", "cancelled")
    assert {name: tuple(row[c] for c in counters) for name, row in totals.items()} == {
        "img.resize": ("10", "10", "0", "4", "4", "0"),
        "mail.send": ("5", "5", "1", "3", "1", "1"),
        "report.build": ("4", "4", "1", "0", "2", "0"),
        "video.encode": ("3", "0", "0", "0", "0", "0"),
    }
    assert column(table(notebook, "totals-by-client"), "client_id", "submitted") == {
        "acme": "16",
        "globex": "6",
    }
    # One queue wait per attempt started.
    waits = table(notebook, "wait-by-exec")
    assert column(waits, "exec", "n") == {"img.resize": "10", "mail.send": "5", "report.build": "4"}
    assert all(float(row["p50"]) <= float(row["p95"]) <= float(row["p99"]) for row in waits)
    for tag in ("throughput-plot", "wait-plot", "wait-over-time"):
        assert pngs(notebook, tag) == 1, f"{tag} drew no plot"


def test_dlq_redrive_redrives_exactly_the_selection_through_the_api(
    produced: Produced, together: Together
) -> None:
    notebook = together.notebook("dlq_redrive")
    selected = REDRIVEN

    assert "DLQ size: 7 dead job(s)" in text(notebook, "dlq-size")
    causes = {
        (row["exec"], row["error_class"], row["dead_reason"]): row["dead"]
        for row in table(notebook, "by-cause")
    }
    assert causes[("img.resize", "OutOfMemoryError", "permanent_failure")] == "3"
    assert [row["id"] for row in table(notebook, "selection")] == selected
    assert "2 of 2 selected job(s) are dead on the leader now" in text(notebook, "live-check")
    assert [
        (row["id"], row["outcome"], row["status_now"], row["attempts_now"])
        for row in table(notebook, "redrive")
    ] == [(job_id, "redriven", "queued", "0") for job_id in selected]

    # The leader agrees: the selection is queued again with fresh attempts (no worker has
    # credit, so it stays queued), and every other job is as the run left it.
    with produced.node.client("admin") as admin:
        jobs = {job_id: admin.get(f"/v1/jobs/{job_id}").json() for job_id in EXPECTED_STATUS}
        live_dlq = {job["id"] for job in admin.get("/v1/dlq").json()["jobs"]}
    assert {job_id: (jobs[job_id]["status"], jobs[job_id]["attempts"]) for job_id in selected} == {
        job_id: ("queued", 0) for job_id in selected
    }
    assert {job_id: job["status"] for job_id, job in jobs.items() if job_id not in selected} == {
        job_id: status for job_id, status in EXPECTED_STATUS.items() if job_id not in selected
    }
    assert live_dlq == {"oom-3", "bad-1", "mail-oom-1", "slow-1", "flaky-1"}

    # ...and logged it: a `redriven` event per job in dispatch.events, as any decision.
    assert sorted(redriven_in_log(produced)) == selected


def redriven_in_log(produced: Produced) -> list[str]:
    """The job ids of every `redriven` event committed to the events topic."""
    topic = produced.settings.kafka.events_topic
    consumer = KafkaConsumer(
        bootstrap_servers=produced.settings.kafka.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        found: list[str] = []
        while any(consumer.position(p) < end[p] for p in partitions):
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    events = decode_batch(record.value).events
                    found += [e.job_id for e in events if isinstance(e, Redriven)]
        return found
    finally:
        consumer.close()
