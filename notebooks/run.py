"""Run a notebook of this folder headless, papermill style, on this project's Python.

    .venv/bin/python notebooks/run.py notebooks/dlq_redrive.ipynb -o /tmp/redrive.ipynb \\
        -p condition "exec = 'image.resize'" -p dry_run false

Each notebook takes its parameters in one code cell tagged `parameters`; `-p NAME VALUE`
values are injected in a new cell right after it (tagged `injected-parameters`, as papermill
does), so the notebook's own defaults stay visible above. A VALUE is read as JSON when it
parses (`false`, `3`, `null`, `[1, 2]`, `'"007"'`) and as a plain string otherwise. A NAME the
parameters cell does not assign is refused (a typo must not be silently ignored).

The kernel is the interpreter running this script (the project's `.venv`), started from a
kernel spec made here, so no kernel spec has to be installed for the user. The kernel is
always shut down at the end, even when a cell fails; any process it left behind (a Spark JVM
whose notebook did not reach `spark.stop()`) is waited for, then killed by its pid.
The executed copy is written to `-o` (default `var/notebooks/NAME.ipynb`), also when a cell
failed, to show where; its metadata `dispatch_run` records the parameters, the time taken,
the error and any process that had to be killed. Exit code 1 when a cell failed.

No papermill: it is not a dependency, and this is the one feature of it the notebooks need.
"""

from __future__ import annotations

import argparse
import ast
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

    def create_kernel_manager(self) -> KernelManager:
        # Owned by nbclient (created here, not passed in), so nbclient shuts it down when the
        # run ends, also after a failing cell.
        self.km = AsyncKernelManager(
            kernel_name=KERNEL_NAME, kernel_spec_manager=_ThisPythonSpecs()
        )
        return self.km


@dataclass
class Executed:
    notebook: NotebookNode
    """The executed notebook; `metadata["dispatch_run"]` says how it ran (parameters, seconds,
    kernel, killed, error)."""
    seconds: float
    killed: list[int]
    """Kernel descendants still alive after the kernel's shutdown, killed by pid (a clean
    notebook leaves none: its last cell stops Spark and the JVM exits with the kernel)."""


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
    notebook = inject_parameters(read_notebook(path), parameters or {})
    processes = _Processes()
    client = _Client(
        notebook,
        processes,
        timeout=int(timeout_s),
        startup_timeout=int(startup_timeout_s),
        kernel_name=KERNEL_NAME,
        shutdown_kernel="graceful",
        resources={"metadata": {"path": str(path.parent)}},
    )
    started = time.monotonic()
    record: dict[str, Any] = {"parameters": dict(parameters or {}), "kernel": sys.executable}
    try:
        client.execute(env=dict(env if env is not None else os.environ))
    except CellExecutionError as error:
        record["error"] = f"{error.ename}: {error.evalue}"
        raise
    except BaseException as error:
        record["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        killed = processes.reap(reap_grace_s)
        record.update(seconds=round(time.monotonic() - started, 1), killed=killed)
        client.nb.metadata["dispatch_run"] = record
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            write_notebook(client.nb, output)
    return Executed(client.nb, record["seconds"], killed)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit code 1 when a cell failed (its error on stderr)."""
    parser = argparse.ArgumentParser(prog="notebooks/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument(
        "-o", "--output", type=Path, help="the executed copy (default: var/notebooks/NAME)"
    )
    parser.add_argument(
        "-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE")
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per cell")
    options = parser.parse_args(argv)
    parameters = {name: _value(value) for name, value in options.parameter}
    output: Path = options.output or load_settings().paths.var / "notebooks" / options.notebook.name
    try:
        # A typo in a name, or a missing notebook, is refused before a kernel starts.
        inject_parameters(read_notebook(options.notebook), parameters)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    try:
        executed = execute(options.notebook, parameters, output=output, timeout_s=options.timeout_s)
    except CellExecutionError as error:
        print(f"{options.notebook} failed; executed copy: {output}\n{error}", file=sys.stderr)
        return 1
    if executed.killed:
        print(f"killed processes the kernel left behind: {executed.killed}", file=sys.stderr)
    print(f"executed {options.notebook} in {executed.seconds:.0f} s -> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
