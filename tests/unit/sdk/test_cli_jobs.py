"""The job commands' pure parts: reading a JSON-lines file, finding a worker app,
registering on the `dispatch` app, and usage errors (none of these needs a node)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dispatch.cli import app as dispatch_app
from dispatch.cli_jobs import (
    EXIT_ERROR,
    EXIT_USAGE,
    api_key_for,
    load_app,
    read_jobs_file,
    register,
)
from dispatch.worker.examples import app as demo_app
from dispatch.worker.sdk import WorkerApp


def test_a_jobs_file_is_read_whole_before_anything_is_sent(tmp_path: Path) -> None:
    good = tmp_path / "jobs.jsonl"
    good.write_text('{"exec": "a.b", "payload": 1}\n\n  \n{"exec": "c.d", "id": "x"}\n')
    jobs = read_jobs_file(good)
    assert [(job.exec, job.payload, job.id) for job in jobs] == [
        ("a.b", 1, None),
        ("c.d", None, "x"),
    ]
    for content, message in [
        ('{"exec": "a.b"}\n{"exec": ', "jobs.jsonl:2: not valid JSON"),
        ('{"payload": 1}\n', "jobs.jsonl:1: exec: Field required"),
        ('{"exec": "a.b", "max_attempts": 0}\n', "jobs.jsonl:1: max_attempts: Input should be"),
        ("[1, 2]\n", "jobs.jsonl:1: line: Input should be"),
    ]:
        good.write_text(content)
        with pytest.raises(ValueError, match=message):
            read_jobs_file(good)
    with pytest.raises(ValueError, match=r"missing\.jsonl"):
        read_jobs_file(tmp_path / "missing.jsonl")


def test_a_worker_app_is_found_by_module_and_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_app("dispatch.worker.examples:app") is demo_app
    (tmp_path / "my_workers.py").write_text(
        "from dispatch.worker.sdk import WorkerApp\n"
        "def make():\n"
        "    app = WorkerApp('made')\n"
        "    app.add_handler('x.y', lambda job: None)\n"
        "    return app\n"
        "not_an_app = 42\n"
    )
    monkeypatch.chdir(tmp_path)  # the current directory is importable, as with python -m
    made = load_app("my_workers:make")
    assert isinstance(made, WorkerApp) and made.name == "made"
    for reference, message in [
        ("my_workers", "expected module:attribute"),
        ("no_such_module:app", "cannot import"),
        ("my_workers:missing", "has no attribute"),
        ("my_workers:not_an_app", "is a int, not a WorkerApp"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_app(reference)


def _names(app: typer.Typer) -> list[str]:
    return [info.name or (info.callback.__name__ if info.callback else "?")
            for info in app.registered_commands]  # fmt: skip


def test_register_adds_the_commands_once_and_keeps_the_stack_status() -> None:
    app = typer.Typer()
    shown: list[str] = []

    @app.command()
    def status() -> None:
        shown.append("stack")

    register(app)
    register(app)  # again: nothing
    assert sorted(_names(app)) == [
        "cancel", "pause", "purge", "resume", "status", "submit", "worker",
    ]  # fmt: skip
    assert [group.name for group in app.registered_groups] == ["limits", "dlq"]
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 0 and shown == ["stack"]


runner = CliRunner()
register(dispatch_app)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["submit", "demo.echo", "--payload", "{nope"], "--payload: not valid JSON"),
        (["submit"], "give an EXEC"),
        (["submit", "x.y", "--timeout", "3"], "add --wait"),
        (["submit", "x.y", "--file", "jobs.jsonl"], "--file submits the file's jobs"),
        (["submit", "--file", "/nonexistent/jobs.jsonl"], "/nonexistent/jobs.jsonl"),
        (["submit", "x.y", "--url", "ftp://nowhere"], "--url: expected a node URL"),
        (["status", "--json"], "--url, --api-key and --json apply to `status ID` only"),
        (["worker", "--app", "dispatch.worker.examples"], "expected module:attribute"),
        (["resume"], "give --exec PATTERN or --client ID"),
        (["pause", "--exec", "a.*", "--client", "acme"], "give --exec PATTERN or --client ID"),
        (["purge"], "give --exec PATTERN or --client ID"),
        (["limits", "set", "queue", "x", "--max-inflight", "1"], "SCOPE: client, exec or key"),
        (["limits", "rm", "tenant", "x"], "SCOPE: client, exec or key"),
        (["limits", "set", "key", "a"], "give --max-inflight, --rate, or both"),
        (["limits", "set", "key", "a", "--max-inflight", "1", "--burst", "2"],
         "--burst: only with --rate"),
        (["submit", "x.y", "--key", ""], "key: String should have at least 1 character"),
        (["cancel"], "give an ID, or --exec and/or --client"),
        (["cancel", "x", "--status", "done"], "--status: queued, running or any"),
        (["worker", "--app", "dispatch.worker.examples:nothing"], "has no attribute"),
        (["worker", "--app", "dispatch.worker.examples:app", "--subjects", "job.assign.x.*"],
         "not covered by a handler"),
        (["worker", "--app", "dispatch.worker.examples:app",
          "-s", "job.assign.demo.echo,demo.sleep"],
         "subject pattern such as"),
        (["worker", "--app", "dispatch.worker.examples:app", "--transport", "pigeon"],
         "--transport"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_with_exit_code_2(args: list[str], message: str) -> None:
    result = runner.invoke(dispatch_app, args)
    assert result.exit_code == EXIT_USAGE, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line, line


def test_an_empty_jobs_file_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = runner.invoke(dispatch_app, ["submit", "--file", str(empty)])
    assert result.exit_code == EXIT_USAGE and "no jobs in the file" in result.stderr


# --- nothing listening: fail at once, saying what to do -------------------------------------


@pytest.mark.parametrize(
    "args",
    [["submit", "demo.echo"], ["submit", "demo.echo", "--wait"], ["status", "some-id"],
     ["dlq", "list"], ["dlq", "redrive", "some-id"], ["limits"],
     ["limits", "set", "key", "a", "--max-inflight", "1"], ["limits", "rm", "key", "a"]],
)  # fmt: skip
def test_with_nothing_listening_a_command_fails_within_a_second(args: list[str]) -> None:
    from dispatch.stack.ports import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    result = runner.invoke(dispatch_app, [*args, "--url", url, "--api-key", "k"])
    assert time.monotonic() - started < 1.0
    assert result.exit_code == EXIT_ERROR, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: no node answers at {url} (connection refused)"), line
    assert "`dispatch up --detach`" in line and "DISPATCH_URL" in line, line


def test_each_command_takes_the_development_key_of_its_role(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without --api-key or DISPATCH_API_KEY: submit and status use the client key, the
    admin commands the admin key, a worker the worker key; --api-key wins over them all."""
    dev_keys = tmp_path / "dev-keys.json"
    dev_keys.write_text(json.dumps({"admin": "A", "client": "C", "worker": "W"}))
    monkeypatch.delenv("DISPATCH_API_KEY", raising=False)
    monkeypatch.setenv("DISPATCH_AUTH__DEV_KEYS_FILE", str(dev_keys))
    assert [api_key_for(role, None) for role in ("client", "admin", "worker")] == ["C", "A", "W"]
    assert api_key_for("admin", "given") == "given"
    monkeypatch.setenv("DISPATCH_API_KEY", "from-env")
    assert api_key_for("admin", None) == "from-env"
