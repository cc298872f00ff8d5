"""The project's layers, as the architecture states them (docs/architecture.md, *Layers*):

- the floor, `dispatch` less the four packages below (the core, settings, record formats,
  storage, the lease, the Delta read side `dispatch.delta`, the SDK client, the stack's
  processes), imports nothing above it;
- the applications above it import the floor and not each other: `dispatch.api` (the nodes),
  `dispatch.worker` (the worker SDK), `dispatch.streaming` (the Spark fold); `dispatch.bench`
  may use them all. Each lives in the repository's top-level folder of its name (`api/`, ...),
  which `dispatch/` reaches through a symbolic link;
- the top, the CLI and the demo (`TOP`), may import everything, and nothing imports them.
Imports inside functions and under `TYPE_CHECKING` count: they are dependencies too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.core.test_imports import imported_modules

ROOT = Path(__file__).resolve().parents[2]
APPLICATIONS = ("api", "worker", "streaming", "bench")
PROJECT = ("dispatch", "notebooks")
TOP = frozenset({"dispatch.cli", "dispatch.cli_jobs", "dispatch.cli_replay", "dispatch.demo"})
ALLOWED: dict[str, frozenset[str]] = {
    "dispatch": frozenset({"dispatch"}),
    "api": frozenset({"dispatch", "api"}),
    "worker": frozenset({"dispatch", "worker"}),
    "streaming": frozenset({"dispatch", "streaming"}),
    "bench": frozenset({"dispatch", "api", "worker", "streaming", "bench"}),
}
"""For each layer, the layers its modules may import (besides `TOP`'s rules)."""


def layer_of(module: str) -> str:
    """`dispatch.api.leader` -> `api`; `dispatch.settings` -> `dispatch`."""
    parts = module.split(".")
    if parts[0] == "dispatch" and len(parts) > 1 and parts[1] in APPLICATIONS:
        return parts[1]
    return parts[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in APPLICATIONS:
        parts.insert(0, "dispatch")
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
    allowed = ALLOWED[layer_of(importer)]
    wrong: list[str] = []
    for imported in sorted(project_imports(path, importer)):
        if layer_of(imported) not in allowed or any(
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
        (
            "dispatch/x.py",
            "from dispatch.api.node import Node\n",
            "dispatch.x imports dispatch.api.node",
        ),
        (
            "dispatch/x.py",
            "def f():\n    import dispatch.streaming.app\n",
            "dispatch.x imports dispatch.streaming.app",
        ),
        (
            "dispatch/api/x.py",
            "from dispatch.streaming.fold import fold_batch\n",
            "dispatch.api.x imports dispatch.streaming.fold",
        ),
        (
            "dispatch/worker/x.py",
            "from dispatch.api import app\n",
            "dispatch.worker.x imports dispatch.api",
        ),
        (
            "dispatch/api/x.py",
            "from dispatch.cli import app\n",
            "dispatch.api.x imports dispatch.cli",
        ),
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
        layer_of(name) in ("api", "streaming") for name in project_imports(cli, "dispatch.cli")
    )


def test_a_module_name_is_its_path() -> None:
    assert module_name(ROOT / "dispatch/delta/__init__.py") == "dispatch.delta"
    assert module_name(ROOT / "api/routes/jobs.py") == "dispatch.api.routes.jobs"
    assert layer_of("dispatch.api.routes.jobs") == "api"
    assert layer_of("dispatch.client") == "dispatch"
