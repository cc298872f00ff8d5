"""The light install (the project without its `server` extra) in a fresh virtualenv: it has
the client SDK, the worker SDK and the CLI's job commands, none of the server's packages, and
it submits a job to a real node and runs a worker that does it (docs/sdk.md, *Installing*)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.cli import SERVER_PACKAGES
from tests.integration.api.conftest import RunningNode, broker_api_node, broker_api_settings

pytestmark = pytest.mark.integration
__all__ = ["broker_api_node", "broker_api_settings"]  # the node on the session's real broker

ROOT = Path(__file__).resolve().parents[3]
NOT_SOURCES = (".git", ".venv", "var", "build", "*.egg-info", "__pycache__", "*_cache", "tests")

WORKER = """\
from dispatch.worker import Assignment, WorkerApp

app = WorkerApp("light")


@app.handler("light.double")
def double(job: Assignment) -> int:
    return 2 * job.payload
"""

CLIENT = """\
import json, sys
from dispatch.client import Client

with Client() as client:
    client.submit("light.double", 21, id="light-1")
    job = client.wait("light-1", timeout_s=60)
print(json.dumps({"status": job.status, "result": job.result}))
"""


def _size_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 1e6


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the project installed from a wheel built as a user's pip builds
    it, no extra, its pins from constraints.txt; pip's cache is bootstrap's, so a warm run
    downloads nothing. The wheel is built from a copy of the sources: setuptools leaves a
    `build/` folder beside them, whose stale files a later build would pick up."""
    folder = tmp_path_factory.mktemp("light")
    sources, wheels = folder / "src", folder / "wheels"
    shutil.copytree(ROOT, sources, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    cache = Path(os.environ.get("DISPATCH_PATHS__CACHE", Path.home() / ".cache" / "dispatch"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
         "--cache-dir", str(cache / "pip"), "-w", str(wheels), str(sources)],
        check=True, timeout=300,
    )  # fmt: skip
    venv.create(folder / "venv", with_pip=True)
    python = folder / "venv" / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--cache-dir", str(cache / "pip"), "-c", str(ROOT / "constraints.txt"),
         *map(str, wheels.glob("dispatch-*.whl"))],
        check=True, timeout=600,
    )  # fmt: skip
    return python


def _run(
    program: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(program), *args], capture_output=True, text=True, timeout=120, check=False,
        env=env, cwd=cwd,
    )  # fmt: skip


def test_the_light_install_has_no_server_package(light_venv: Path, tmp_path: Path) -> None:
    # httpx too: the SDK is on urllib3 and aiohttp, httpx is the stack's and the tests'.
    absent = sorted(SERVER_PACKAGES | {"httpx"})
    found = _run(
        light_venv, "-c",
        "import importlib.util, json, sys\n"
        f"print(json.dumps(sorted(n for n in {absent!r} if importlib.util.find_spec(n))))",
        cwd=tmp_path,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == []
    site = light_venv.parents[1] / "lib" / "python3.11" / "site-packages"
    # pip and setuptools come with every virtualenv; the rest is what the light install adds.
    size = _size_mb(site) - sum(
        _size_mb(path) for path in site.iterdir() if path.name.startswith(("pip", "setuptools"))
    )
    print(f"light install: {size:.0f} MB in site-packages besides pip and setuptools")
    assert size < 60, f"{size:.0f} MB"


def test_a_server_command_in_the_light_install_says_what_to_install(
    light_venv: Path, tmp_path: Path
) -> None:
    done = _run(light_venv.parent / "dispatch", "up", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "needs the server install" in done.stderr and "[server]" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def light_worker(
    light_venv: Path, broker_api_node: RunningNode, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "DISPATCH_URL": broker_api_node.url,
           "DISPATCH_API_KEY": broker_api_node.keys["worker"]}  # fmt: skip
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [str(light_venv.parent / "dispatch"), "worker", "--app", "worker:app"],
            env=env, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield worker
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)


def test_the_light_install_submits_and_runs_a_job(
    light_venv: Path,
    broker_api_node: RunningNode,
    light_worker: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    env = {**os.environ, "DISPATCH_URL": broker_api_node.url,
           "DISPATCH_API_KEY": broker_api_node.keys["client"]}  # fmt: skip
    done = _run(light_venv, "-c", CLIENT, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + (tmp_path / "worker.log").read_text()
    assert json.loads(done.stdout) == {"status": "succeeded", "result": 42}
    assert light_worker.poll() is None
