"""The README's *Your first job in one minute*, run verbatim on a fresh stack of its own: its
shell blocks in one bash script from a folder of the user's (where its Python blocks are saved
under the names their first lines give), with the checkout's `.venv` beside them, as a user who
cloned the repository and ran the bootstrap has it. Only the environment differs: the stack's
folder and ports are free ones, so the run disturbs no other stack on the machine."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.stack.ports import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Your first job in one minute"
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def first_job_blocks(readme: str) -> list[tuple[str, str]]:
    """The section's fenced blocks in order, as (language, text)."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    return [(m[1], m[2]) for m in BLOCK.finditer(readme[start : end if end > 0 else None])]


def test_the_section_has_shell_and_python_blocks() -> None:
    blocks = first_job_blocks((ROOT / "README.md").read_text())
    languages = [language for language, _ in blocks]
    assert languages.count("bash") >= 2 and languages.count("python") >= 2
    for language, text in blocks:
        if language == "python":
            assert re.match(r"# [\w.]+\.py\n", text), f"a Python block names its file:\n{text}"


@pytest.fixture
def user_folder(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    folder = tmp_path / "checkout"
    folder.mkdir()
    (folder / ".venv").symlink_to(Path(sys.executable).parents[1])
    var = tmp_path / "var"
    ports = [free_port(), free_port()]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")},
        "PATH": "/usr/local/bin:/usr/bin:/bin",  # the venv is not on it until activated
        "DISPATCH_PATHS__VAR": str(var),
        "DISPATCH_KAFKA__BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "DISPATCH_KAFKA__CONTROLLER_PORT": str(free_port()),
        "DISPATCH_API__PORTS": json.dumps(ports),
        "DISPATCH_URL": ",".join(f"http://127.0.0.1:{port}" for port in ports),
        "COLUMNS": "200",
    }
    try:
        yield folder, env
    finally:
        # The README's last line stops the stack; this stops it when the run failed before.
        subprocess.run(
            [str(Path(sys.executable).parent / "dispatch"), "down"],
            env=env, capture_output=True, timeout=120, check=False,
        )  # fmt: skip


def test_the_first_job_runs_as_the_readme_says(user_folder: tuple[Path, dict[str, str]]) -> None:
    folder, env = user_folder
    script: list[str] = []
    for language, text in first_job_blocks((ROOT / "README.md").read_text()):
        if language == "python":
            name = text.split("\n", 1)[0].removeprefix("# ").strip()
            (folder / name).write_text(text)
        else:
            script.append(text)
    run = subprocess.Popen(
        ["bash", "-e", "-c", "\n".join(script)],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its background worker is in the group stopped below
    )  # fmt: skip
    try:
        out, err = run.communicate(timeout=420)
    finally:
        # What the script left running (its `&` worker if it failed before `kill %1`).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(10)
    assert run.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert '"hello": "world"' in out, out
    assert "5" in out.splitlines(), out
