"""The project's layers, as the architecture states them (docs/architecture.md, *Layers*):

- the floor, `dispatch` (the core, settings, record formats, storage, the lease, the Delta read
  side `dispatch.delta`, the SDK client, the stack's processes), imports nothing above it;
- the applications above it import the floor and not each other: `api` (the nodes), `worker`
  (the worker SDK), `streaming` (the Spark fold); `bench` may use them all;
- the top, the CLI and the demo (`TOP`), may import everything, and nothing imports them.
Imports inside functions and under `TYPE_CHECKING` count: they are dependencies too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.core.test_imports import imported_modules

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("dispatch", "api", "worker", "streaming", "bench", "notebooks")
TOP = frozenset({"dispatch.cli", "dispatch.cli_jobs", "dispatch.cli_replay", "dispatch.demo"})
ALLOWED: dict[str, frozenset[str]] = {
    "dispatch": frozenset({"dispatch"}),
    "api": frozenset({"dispatch", "api"}),
    "worker": frozenset({"dispatch", "worker"}),
    "streaming": frozenset({"dispatch", "streaming"}),
    "bench": frozenset({"dispatch", "api", "worker", "streaming", "bench"}),
}
"""For each package, the project packages its modules may import (besides `TOP`'s rules)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_imports(path: Path, importer: str) -> set[str]:
    """The project modules `path` (module `importer`) imports; a relative import counts as
    its own package."""
    found: set[str] = set()
    package = importer.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.add(package)
    for name in imported_modules(path):
        if name.split(".")[0] in PROJECT and name != "dispatch.core":
            found.add(name)
    return found


def offenses(path: Path, importer: str | None = None) -> list[str]:
    importer = importer or module_name(path)
    if importer in TOP:
        return []
    allowed = ALLOWED[importer.split(".")[0]]
    wrong: list[str] = []
    for imported in sorted(project_imports(path, importer)):
        top = imported.split(".")[0]
        if top not in allowed or any(
            imported == name or imported.startswith(name + ".") for name in TOP
        ):
            wrong.append(f"{importer} imports {imported}")
    return wrong


def sources() -> list[Path]:
    return sorted(path for package in ALLOWED for path in (ROOT / package).rglob("*.py"))


def test_every_module_imports_only_what_its_layer_may() -> None:
    files = sources()
    assert len(files) > 100
    assert [offense for path in files for offense in offenses(path)] == []


@pytest.mark.parametrize(
    ("where", "source", "offense"),
    [
        ("dispatch/x.py", "from api.node import Node\n", "dispatch.x imports api.node"),
        (
            "dispatch/x.py",
            "def f():\n    import streaming.app\n",
            "dispatch.x imports streaming.app",
        ),
        ("api/x.py", "from streaming.fold import fold_batch\n", "api.x imports streaming.fold"),
        ("worker/x.py", "from api import app\n", "worker.x imports api"),
        ("api/x.py", "from dispatch.cli import app\n", "api.x imports dispatch.cli"),
    ],
)
def test_the_check_notices_an_import_from_above(
    tmp_path: Path, where: str, source: str, offense: str
) -> None:
    path = tmp_path / "x.py"
    path.write_text(source)
    assert offense in offenses(path, where.removesuffix(".py").replace("/", "."))


def test_the_top_may_import_everything() -> None:
    cli = ROOT / "dispatch/cli.py"
    assert offenses(cli) == []
    assert any(
        name.startswith(("api", "streaming")) for name in project_imports(cli, "dispatch.cli")
    )


def test_a_module_name_is_its_path() -> None:
    assert module_name(ROOT / "dispatch/delta/__init__.py") == "dispatch.delta"
    assert module_name(ROOT / "api/routes/jobs.py") == "api.routes.jobs"
