"""`notebooks/run.py` with several notebooks: one kernel, each notebook finding it as fresh
(no variable of the one before; a Spark session it left running stopped and reported), a
failing notebook not stopping the ones after it, parameters to the notebooks that take them.

Small notebooks written here, run by the command as a user runs it: a real kernel, no Spark
(the module standing for `pyspark.sql` is the notebooks' own; the four Spark notebooks run
together in test_notebooks.py, where a session left running fails their test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat import NotebookNode

from notebooks.run import PARAMETERS_TAG, read_notebook

pytestmark = pytest.mark.integration

RUNNER = Path(__file__).resolve().parents[3] / "notebooks" / "run.py"


def write(folder: Path, name: str, parameters: str, *cells: str) -> Path:
    notebook = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    first = nbformat.v4.new_code_cell(parameters)  # type: ignore[no-untyped-call]
    first.metadata["tags"] = [PARAMETERS_TAG]
    notebook.cells = [first] + [nbformat.v4.new_code_cell(c) for c in cells]  # type: ignore[no-untyped-call]
    path = folder / f"{name}.ipynb"
    nbformat.write(notebook, path)  # type: ignore[no-untyped-call]
    return path


def printed(notebook: NotebookNode) -> str:
    return "".join(
        output.get("text", "")
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output["output_type"] == "stream"
    )


# A stand-in for `pyspark.sql` with an active session, which the notebook "forgets" to stop.
LEAVE_A_SESSION = """\
import sys, types
class Session:
    active = None
    @classmethod
    def getActiveSession(cls):
        return cls.active
    def stop(self):
        print("stopped by the runner")
        Session.active = None
Session.active = Session()
sys.modules["pyspark.sql"] = types.SimpleNamespace(SparkSession=Session)
"""


def test_notebooks_share_a_kernel_but_not_their_variables_nor_a_session_left_running(
    tmp_path: Path,
) -> None:
    first = write(tmp_path, "first", "label = ''", "secret = 42", LEAVE_A_SESSION, "import os")
    failing = write(tmp_path, "failing", "", "raise ValueError('this notebook fails')")
    last = write(
        tmp_path,
        "last",
        "label = ''\nlimit = 0",
        "print('secret' in globals(), 'os' in globals(), label, limit)",
        "import sys\nprint(sys.modules['pyspark.sql'].SparkSession.active)",
    )
    out = tmp_path / "out"
    command = [sys.executable, str(RUNNER), str(first), str(failing), str(last), "-o", str(out)]
    command += ["-p", "label", '"hello"', "-p", "limit", "3"]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert ran.returncode == 1, ran.stdout + ran.stderr  # one notebook failed
    assert "failing.ipynb failed" in ran.stderr and "this notebook fails" in ran.stderr

    executed = {name: read_notebook(out / f"{name}.ipynb") for name in ("first", "failing", "last")}
    records = {name: notebook.metadata["dispatch_run"] for name, notebook in executed.items()}
    # Each notebook got the parameters it takes, and only those.
    assert records["first"]["parameters"] == {"label": "hello"}
    assert records["failing"]["parameters"] == {}
    assert records["last"]["parameters"] == {"label": "hello", "limit": 3}
    # The session the first notebook left running was stopped before the next, and said so.
    assert records["first"]["left_spark_session"] is True
    assert records["failing"]["error"] == "ValueError: this notebook fails"
    # The last notebook ran after the failing one, in the same kernel (the module the first
    # one imported is still imported) with none of the variables before it.
    assert records["last"].get("error") is None
    assert printed(executed["last"]) == "False False hello 3\nNone\n"
    # The runner's own cell is not in the copies: each has its cells and the injected one.
    assert [len(notebook.cells) for notebook in executed.values()] == [5, 3, 4]
    assert records["last"]["killed"] == []


def test_a_parameter_no_notebook_takes_is_refused_before_a_kernel_starts(tmp_path: Path) -> None:
    first = write(tmp_path, "first", "label = ''")
    second = write(tmp_path, "second", "limit = 0")
    command = [sys.executable, str(RUNNER), str(first), str(second), "-o", str(tmp_path / "out")]
    ran = subprocess.run(
        [*command, "-p", "lable", json.dumps("typo")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 2
    assert "unknown parameter(s) ['lable']" in ran.stderr
    assert "'first.ipynb': ['label']" in ran.stderr and "'second.ipynb': ['limit']" in ran.stderr
    assert not (tmp_path / "out").exists()
