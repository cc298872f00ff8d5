"""Run a notebook of this folder headless, papermill style, on this project's Python.

    .venv/bin/python notebooks/run.py notebooks/dlq_redrive.ipynb -o /tmp/redrive.ipynb \\
        -p condition "exec = 'image.resize'" -p dry_run false

Each notebook takes its parameters in one code cell tagged `parameters`; `-p NAME VALUE`
values are injected in a new cell right after it (tagged `injected-parameters`, as papermill
does), so the notebook's own defaults stay visible above. A VALUE is read as JSON when it
parses (`false`, `3`, `null`, `[1, 2]`, `'"007"'`) and as a plain string otherwise. A NAME the
parameters cell does not assign is refused (a typo must not be silently ignored).

Several notebooks run one after the other in one kernel, as a Databricks job's notebooks
share its cluster: the later ones find the Spark JVM started and warm, and start in seconds.

    .venv/bin/python notebooks/run.py notebooks/queue_health.ipynb \
        notebooks/throughput.ipynb -o /tmp/executed -p warehouse /data/delta

Each gets the `-p` values its parameters cell assigns; before each one after the first, the
kernel's variables are cleared and a Spark session the previous one left running is stopped
(and reported). A failing notebook does not stop the ones after it.

The kernel is the interpreter running this script (the project's `.venv`), started from a
kernel spec made here, so no kernel spec has to be installed for the user. The kernel is
always shut down at the end, even when a cell fails; any process it left behind (a Spark JVM
whose kernel did not exit) is waited for, then killed by its pid.
The executed copy is written to `-o` (default `var/notebooks/NAME.ipynb`; with several
notebooks, `-o` is their folder), also when a cell failed, to show where; its metadata
`dispatch_run` records the parameters, the time taken, the error, whether it left a Spark
session running, and any process that had to be killed. Exit code 1 when a cell failed.

No papermill: it is not a dependency, and this is the one feature of it the notebooks need.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import copy
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager, KernelManager
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat import NotebookNode

from dispatch.settings import load_settings

KERNEL_NAME = "dispatch-venv"
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"


class _ThisPythonSpecs(KernelSpecManager):
    """Kernel specs that always answer an ipykernel on `sys.executable`, whatever specs the
    user has installed (a user-level `python3` spec may point at another interpreter)."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            name=KERNEL_NAME,
            display_name=f"dispatch ({sys.executable})",
            language="python",
        )


# nbformat's functions carry no type hints.
def read_notebook(path: Path) -> NotebookNode:
    notebook: NotebookNode = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    return notebook


def write_notebook(notebook: NotebookNode, path: Path) -> None:
    nbformat.write(notebook, path)  # type: ignore[no-untyped-call]


def parameter_names(notebook: NotebookNode) -> list[str]:
    """The names the `parameters` cell assigns, in order."""
    source = _parameters_cell(notebook).source
    names: list[str] = []
    for statement in ast.parse(source).body:
        targets: list[ast.expr] = []
        if isinstance(statement, ast.Assign):
            targets = list(statement.targets)
        elif isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        names += [target.id for target in targets if isinstance(target, ast.Name)]
    return names


def _parameters_cell(notebook: NotebookNode) -> NotebookNode:
    for cell in notebook.cells:
        if cell.cell_type == "code" and PARAMETERS_TAG in cell.get("metadata", {}).get("tags", []):
            found: NotebookNode = cell
            return found
    raise ValueError("the notebook has no code cell tagged 'parameters'")


def inject_parameters(notebook: NotebookNode, parameters: Mapping[str, Any]) -> NotebookNode:
    """A copy of `notebook` with a cell assigning `parameters` right after the `parameters`
    cell (replacing an earlier injected cell). Values must be Python literals (`repr`)."""
    known = parameter_names(notebook)
    unknown = sorted(set(parameters) - set(known))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; the notebook takes {known}")
    injected = copy.deepcopy(notebook)
    injected.cells = [
        cell
        for cell in injected.cells
        if INJECTED_TAG not in cell.get("metadata", {}).get("tags", [])
    ]
    lines = ["# Parameters injected by notebooks/run.py"]
    for name, value in parameters.items():
        literal = repr(value)
        # repr must give back the same value, or the kernel would run something else.
        if ast.literal_eval(literal) != value:
            raise ValueError(f"parameter {name}: {value!r} is not a Python literal")
        lines.append(f"{name} = {literal}")
    cell: NotebookNode = nbformat.v4.new_code_cell("\n".join(lines) + "\n")  # type: ignore[no-untyped-call]
    cell.metadata["tags"] = [INJECTED_TAG]
    position = injected.cells.index(_parameters_cell(injected)) + 1
    injected.cells.insert(position, cell)
    return injected


# --- the kernel's processes --------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process from /proc, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def _descendants(root: int) -> set[tuple[int, int]]:
    """Every live descendant of `root` as (pid, start time); empty without /proc."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        stat = _proc_stat(int(entry.name))
        if stat is not None:
            parents.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found: set[tuple[int, int]] = set()
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def _alive(process: tuple[int, int]) -> bool:
    stat = _proc_stat(process[0])
    # Same pid and same start time: not a new process that reused the pid.
    return stat is not None and stat[1] == process[1]


@dataclass
class _Processes:
    """Descendants of the kernel (its Spark JVM), noted after every cell while it runs."""

    kernel_pid: int | None = None
    seen: set[tuple[int, int]] = field(default_factory=set)

    def note(self, km: KernelManager | None) -> None:
        if km is not None and isinstance(km.provisioner, LocalProvisioner):
            self.kernel_pid = km.provisioner.pid
        if self.kernel_pid is not None:
            self.seen |= _descendants(self.kernel_pid)

    def reap(self, grace_s: float) -> list[int]:
        """Wait up to `grace_s` for the noted processes to end (a JVM ends when its Python
        parent is gone), then kill the rest by pid; returns the pids it had to kill."""
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in self.seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed = []
        for process in sorted(self.seen):
            if _alive(process):
                os.kill(process[0], signal.SIGKILL)
                killed.append(process[0])
        return killed


class _Client(NotebookClient):
    """nbclient with the kernel on this interpreter; notes the kernel's processes."""

    def __init__(self, notebook: NotebookNode, processes: _Processes, **options: Any) -> None:
        super().__init__(notebook, **options)
        self.processes = processes
        self.on_notebook_start = self._note
        self.on_cell_executed = self._note
        self.on_cell_error = self._note

    def _note(self, **_hook_arguments: Any) -> None:
        self.processes.note(self.km)


@dataclass
class Executed:
    notebook: NotebookNode
    """The executed notebook; `metadata["dispatch_run"]` says how it ran (parameters, seconds,
    kernel, killed, error, left_spark_session)."""
    seconds: float
    killed: list[int]
    """Kernel descendants still alive after the kernel's shutdown, killed by pid (a clean
    notebook leaves none: its last cell stops Spark and the JVM exits with the kernel)."""
    error: str | None = None
    """The failing cell's error (`execute_all` goes on with the next notebook)."""


@dataclass(frozen=True)
class NotebookRun:
    """One notebook of `execute_all`: where it is, its parameters, where its copy goes."""

    path: Path
    parameters: Mapping[str, Any] = field(default_factory=dict)
    output: Path | None = None


LEFT_SESSION_MARK = "dispatch-run: stopped a Spark session the previous notebook left running"

_BETWEEN_NOTEBOOKS = f"""\
import sys as _sys

_sql = _sys.modules.get("pyspark.sql")
_left = _sql.SparkSession.getActiveSession() if _sql is not None else None
if _left is not None:
    _left.stop()
    print({LEFT_SESSION_MARK!r})
get_ipython().run_line_magic("reset", "-f")
"""
"""Run by `execute_all` before each notebook after the first, in a cell that is removed from
the executed copy: the kernel as the notebook would find a fresh one (no variable of the
notebook before, no Spark session: one that was left running is stopped and reported), but
with its modules imported and its Spark JVM warm."""


def execute(
    path: Path,
    parameters: Mapping[str, Any] | None = None,
    *,
    output: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
    startup_timeout_s: float = 120.0,
    reap_grace_s: float = 30.0,
) -> Executed:
    """Execute the notebook at `path` (cwd: its folder) with `parameters` injected, and write
    it to `output` (also when a cell failed); raises `nbclient.exceptions.CellExecutionError`
    if a cell fails. `env` replaces the kernel's environment (default: this process's)."""
    [executed] = execute_all(
        [NotebookRun(path, parameters or {}, output)],
        env=env,
        timeout_s=timeout_s,
        startup_timeout_s=startup_timeout_s,
        reap_grace_s=reap_grace_s,
        raise_on_error=True,
    )
    return executed


def execute_all(
    runs: Sequence[NotebookRun],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
    startup_timeout_s: float = 120.0,
    reap_grace_s: float = 30.0,
    raise_on_error: bool = False,
) -> list[Executed]:
    """Execute several notebooks one after the other in **one** kernel, as the notebooks of a
    Databricks job share its cluster: the second and later find the modules imported and the
    Spark JVM started (a new session on it takes a second or two; a new JVM tens of seconds).
    Before each notebook after the first, the kernel's variables are cleared and a Spark
    session left running is stopped (`_BETWEEN_NOTEBOOKS`, recorded as `left_spark_session`
    on the notebook that left it). A notebook that fails does not stop the ones after it
    (`Executed.error`), unless `raise_on_error` (the first `CellExecutionError` is raised
    once every notebook ran and the kernel is shut down). Every copy is written to its
    `output` (also when a cell failed); `killed` (the kernel's processes left after its
    shutdown) goes on the last notebook."""
    notebooks = [inject_parameters(read_notebook(run.path), run.parameters) for run in runs]
    return asyncio.run(
        _execute_all(
            runs, notebooks, dict(env if env is not None else os.environ),
            timeout_s, startup_timeout_s, reap_grace_s, raise_on_error,
        )
    )  # fmt: skip


async def _execute_all(
    runs: Sequence[NotebookRun],
    notebooks: Sequence[NotebookNode],
    env: dict[str, str],
    timeout_s: float,
    startup_timeout_s: float,
    reap_grace_s: float,
    raise_on_error: bool,
) -> list[Executed]:
    processes = _Processes()
    km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=_ThisPythonSpecs())
    done: list[tuple[NotebookRun, NotebookNode, dict[str, Any]]] = []
    first_error: CellExecutionError | None = None
    try:
        for index, (run, notebook) in enumerate(zip(runs, notebooks, strict=True)):
            if index > 0:
                between = nbformat.v4.new_code_cell(_BETWEEN_NOTEBOOKS)  # type: ignore[no-untyped-call]
                notebook.cells.insert(0, between)
            client = _Client(
                notebook,
                processes,
                km=km,
                timeout=int(timeout_s),
                startup_timeout=int(startup_timeout_s),
                kernel_name=KERNEL_NAME,
                resources={"metadata": {"path": str(run.path.parent)}},
            )
            record: dict[str, Any] = {
                "parameters": dict(run.parameters), "kernel": sys.executable, "killed": [],
                "left_spark_session": False,
            }  # fmt: skip
            started = time.monotonic()
            try:
                await client.async_execute(env=env)
            except CellExecutionError as error:
                record["error"] = f"{error.ename}: {error.evalue}"
                first_error = first_error or error
            except BaseException as error:  # a timeout, an interrupt: recorded, then raised
                record["error"] = f"{type(error).__name__}: {error}"
                raise
            finally:
                record["seconds"] = round(time.monotonic() - started, 1)
                if client.kc is not None:
                    client.kc.stop_channels()
                if index > 0:
                    between_cell = client.nb.cells.pop(0)
                    left = LEFT_SESSION_MARK in json.dumps(between_cell.get("outputs", []))
                    if done and left:
                        done[-1][2]["left_spark_session"] = True
                done.append((run, client.nb, record))
    finally:
        if km.has_kernel:
            await km.shutdown_kernel()
        killed = processes.reap(reap_grace_s)
        if done:
            done[-1][2]["killed"] = killed
        for run, notebook, record in done:
            notebook.metadata["dispatch_run"] = record
            if run.output is not None:
                run.output.parent.mkdir(parents=True, exist_ok=True)
                write_notebook(notebook, run.output)
    if raise_on_error and first_error is not None:
        raise first_error
    return [
        Executed(notebook, record["seconds"], record["killed"], record.get("error"))
        for _, notebook, record in done
    ]


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit code 1 when a cell failed (its error on stderr)."""
    parser = argparse.ArgumentParser(prog="notebooks/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", type=Path, nargs="+", metavar="notebook")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="the executed copy (default: var/notebooks/NAME); with several notebooks, the "
        "folder of their copies",
    )
    parser.add_argument(
        "-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE")
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per cell")
    options = parser.parse_args(argv)
    parameters = {name: _value(value) for name, value in options.parameter}
    try:
        runs = _runs(options.notebooks, parameters, options.output)
    except (OSError, ValueError) as error:
        # A typo in a name, or a missing notebook, is refused before a kernel starts.
        parser.error(str(error))
    executed = execute_all(runs, timeout_s=options.timeout_s)
    for run, result in zip(runs, executed, strict=True):
        if result.error is not None:
            print(
                f"{run.path} failed; executed copy: {run.output}\n{result.error}", file=sys.stderr
            )
        else:
            print(f"executed {run.path} in {result.seconds:.0f} s -> {run.output}")
        if result.killed:
            print(f"killed processes the kernel left behind: {result.killed}", file=sys.stderr)
    return 1 if any(result.error for result in executed) else 0


def _runs(
    paths: Sequence[Path], parameters: Mapping[str, Any], output: Path | None
) -> list[NotebookRun]:
    """Each notebook with the parameters its `parameters` cell assigns; a name that no
    notebook assigns is refused (a typo must not be silently ignored)."""
    notebooks = [read_notebook(path) for path in paths]
    names = [set(parameter_names(notebook)) for notebook in notebooks]
    unknown = sorted(set(parameters) - set().union(*names))
    if unknown:
        takes = {path.name: sorted(taken) for path, taken in zip(paths, names, strict=True)}
        raise ValueError(f"unknown parameter(s) {unknown}; the notebooks take {takes}")
    folder = load_settings().paths.var / "notebooks"
    if len(paths) > 1 and output is not None:
        folder = output
    runs = []
    for path, notebook, taken in zip(paths, notebooks, names, strict=True):
        own = {name: value for name, value in parameters.items() if name in taken}
        inject_parameters(notebook, own)  # a copy; values that are not literals: refused
        single = output if len(paths) == 1 else None
        runs.append(NotebookRun(path, own, single or folder / path.name))
    return runs


if __name__ == "__main__":
    sys.exit(main())
