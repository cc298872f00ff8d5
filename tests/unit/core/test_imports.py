"""The core imports nothing but the standard library (it also runs inside Spark UDFs)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import dispatch.core

CORE = Path(dispatch.core.__file__).parent


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.add("dispatch.core")  # relative imports stay inside the package
            elif node.module:
                names.add(node.module)
    return names


def test_the_core_imports_only_the_standard_library() -> None:
    files = sorted(CORE.glob("*.py"))
    assert len(files) > 10
    offenders = {
        f"{path.name}: {name}"
        for path in files
        for name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name != "dispatch.core"
        and not name.startswith("dispatch.core.")
    }
    assert offenders == set()


def test_the_check_would_notice_a_third_party_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import pyspark\nfrom kafka import KafkaProducer\nfrom . import sibling\n")
    assert imported_modules(bad) == {"pyspark", "kafka", "dispatch.core"}
