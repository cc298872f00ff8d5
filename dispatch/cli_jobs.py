"""The job commands of `dispatch`: `submit`, `status ID`, `cancel`, `pause`, `resume`, `purge`,
`limits`, `dlq list`, `dlq redrive`, `worker`.

`register(app)` adds them to the `dispatch` Typer app. Output is for people (rich), or one
JSON document on stdout with `--json`; an error is one line on stderr. Exit codes (the one
table of them all is `EXIT_CODES`, shown by `dispatch --help`):

| code | meaning |
|---|---|
| 0 | done (with `--wait`: the job succeeded) |
| 1 | the request failed (API error, no node reachable) |
| 2 | bad usage or input (a flag, `--payload` that is not JSON, a bad line in `--file`) |
| 4 | `--wait`: the job ended dead or cancelled |
| 124 | `--wait` ran out of time before the job ended (as `timeout(1)`) |

With nothing listening at the nodes' URLs, a command fails at once (the client's
`fail_fast`), saying how to start a stack or name another; a node that answers, even with a
503 during an election, is retried for `CLI_RETRY_S`.

The key: `--api-key`, else `DISPATCH_API_KEY`, else the local stack's development key of the
command's role (`dispatch keys`): the client key for `submit` and `status`, the admin key for
`dlq`, the worker key for `worker`.

Run them before `dispatch/cli.py` registers them with `python -m dispatch.cli_jobs ...`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

# `dispatch` imports this module for every command: the client (urllib3, aiohttp, websockets,
# pydantic) is imported in the functions that use it, so the other commands do not pay for it.
if TYPE_CHECKING:
    from typer.models import CommandInfo

    from dispatch.client import Accepted, Client, Job, Limit, Pause, Submission

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
EXIT_JOB_FAILED = 4
EXIT_TIMEOUT = 124
EXIT_CODES: dict[int, str] = {
    0: "done (with --wait: the job succeeded)",
    1: "failure (an API error, no node reachable, a command that failed)",
    2: "bad usage or input (an option, a value, a file)",
    EXIT_NOT_RUNNING: "`dispatch status`: a process of the local stack is not running",
    EXIT_JOB_FAILED: "`submit --wait`: the job ended dead, cancelled or expired",
    EXIT_TIMEOUT: "`submit --wait --timeout`: the job had not ended in time (as timeout(1))",
}
"""Every exit code of `dispatch`, each with one meaning (shown by `dispatch --help`)."""

CLI_RETRY_S = 15.0
"""How long a command retries while a node answers but cannot serve (a 503 or a 307 during a
leader election): enough to ride out a failover (a lease lasts 10 s). With nothing listening
at all, a command fails at once instead (`fail_fast`)."""
NOT_RUNNING_HINT = (
    "is the stack running? `dispatch up --detach` starts a local one; "
    "--url or DISPATCH_URL names other nodes"
)
_REGISTERED = "_dispatch_job_commands"
STATUS_COLOURS = {"queued": "cyan", "retrying": "cyan", "running": "yellow", "cancelling": "yellow",
                  "succeeded": "green", "dead": "red", "cancelled": "magenta",
                  "expired": "magenta"}  # fmt: skip

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Node URL(s), comma-separated. Default: $DISPATCH_URL, else http://127.0.0.1:8000.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        help="Bearer API key. Default: $DISPATCH_API_KEY, else the local stack's development "
        "key for the command (`dispatch keys`).",
        show_default=False,
    ),
]


# --- plumbing -------------------------------------------------------------------------------


def _fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    # typer.echo, not rich: rich wraps long lines, and an error must stay one line.
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False))


def api_key_for(role: str, given: str | None) -> str | None:
    """The key a command uses: `--api-key`, else $DISPATCH_API_KEY, else the local stack's
    development key of `role` (client, worker or admin)."""
    from dispatch.client import default_api_key

    return given or default_api_key(role)


@contextmanager
def _client(url: str | None, api_key: str | None = None, role: str = "client") -> Iterator[Client]:
    """A client from `--url`/`--api-key` or the environment, failing fast when nothing
    listens; API and network errors become one line."""
    from dispatch.client import Client, DispatchError, Unreachable

    try:
        client = Client(
            url or None, api_key_for(role, api_key), retry_timeout_s=CLI_RETRY_S, fail_fast=True
        )
    except ValueError as error:
        _fail(f"--url: {error}", EXIT_USAGE)
    try:
        with client:
            yield client
    except Unreachable as error:
        _fail(f"{error.detail}: {NOT_RUNNING_HINT}")
    except DispatchError as error:
        _fail(str(error))


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def _short_json(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _status(status: str) -> str:
    colour = STATUS_COLOURS.get(status, "white")
    return f"[{colour}]{escape(status)}[/{colour}]"


def _show_job(job: Job) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("id", escape(job.id)),
        ("exec", escape(job.exec)),
        ("client", escape(job.client_id)),
        ("status", _status(job.status)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("payload", escape(_short_json(job.payload))),
        ("submitted", _when(job.submitted_at)),
        ("updated", _when(job.updated_at)),
    ]
    if job.priority:
        rows.append(("priority", str(job.priority)))
    if job.not_before is not None and job.status == "queued":
        rows.append(("not before", _when(job.not_before)))
    if job.status == "retrying":
        when = job.next_attempt_at
        rows.append(("next attempt", "when a worker is free" if when is None else _when(when)))
    if job.expires_at is not None and job.status in ("queued", "retrying", "expired"):
        rows.append(("expires", _when(job.expires_at)))
    if job.worker_id is not None:
        rows.append(("worker", escape(job.worker_id)))
    if job.deadline is not None and job.status in ("running", "cancelling"):
        rows.append(("deadline", _when(job.deadline)))
    if job.run_limit_at is not None:
        rows.append(("time limit", f"{job.max_run_s:g} s, at {_when(job.run_limit_at)}"))
    elif job.max_run_s is not None:
        rows.append(("time limit", f"{job.max_run_s:g} s an attempt"))
    if job.cancel_requested_at is not None:
        rows.append(("cancel asked", _when(job.cancel_requested_at)))
    if job.key is not None:
        rows.append(("key", escape(job.key)))
    if job.status == "succeeded":
        rows.append(("result", escape(_short_json(job.result))))
    if job.error:
        rows.append(("error", escape(job.error)))
    if job.dead_reason:
        rows.append(("dead reason", escape(job.dead_reason)))
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def _job_exit_code(job: Job) -> int:
    return 0 if job.status == "succeeded" else EXIT_JOB_FAILED


# --- submit ---------------------------------------------------------------------------------


def _parse_payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        _fail(f"--payload: not valid JSON ({error})", EXIT_USAGE)


def read_jobs_file(path: Path) -> list[Submission]:
    """The submissions of a JSON-lines file (blank lines skipped); a bad line raises
    ValueError naming the file and line, before anything is sent."""
    from pydantic import ValidationError

    from dispatch.client import Submission

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ValueError(f"{path}: {error.strerror or error}") from None
    jobs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            jobs.append(Submission.model_validate(json.loads(line)))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in problem['loc']) or 'line'}: {problem['msg']}"
                for problem in error.errors()
            )
            raise ValueError(f"{path}:{number}: {problems}") from None
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error})") from None
    return jobs


def submit(
    exec_name: Annotated[
        str | None,
        typer.Argument(
            metavar="[EXEC]", help="Job type, dotted: image.resize.", show_default=False
        ),
    ] = None,
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="The payload, as JSON.")
    ] = None,
    job_id: Annotated[
        str | None, typer.Option("--id", help="Job id (made here when absent).")
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", "-f", help="Submit every line of a JSON-lines file.", dir_okay=False
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job ends.")] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Give up waiting after S seconds.")
    ] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts", min=1)] = None,
    priority: Annotated[int, typer.Option("--priority", help="Higher runs first.")] = 0,
    delay: Annotated[float, typer.Option("--delay", min=0, help="Start after S seconds.")] = 0.0,
    ttl: Annotated[
        float | None,
        typer.Option("--ttl", min=0, help="Expire if not started within S seconds."),
    ] = None,
    max_run: Annotated[
        float | None,
        typer.Option(
            "--max-run", min=0, help="Stop an attempt that runs S seconds (a hard limit)."
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="A concurrency key (account:42), which key limits apply to."),
    ] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a job: `submit EXEC --payload JSON [--wait]`, or many: `submit --file jobs.jsonl`."""
    from pydantic import ValidationError

    from dispatch.client import Submission, WaitTimeout

    if file is not None:
        if exec_name is not None or payload is not None or job_id is not None or wait:
            _fail("--file submits the file's jobs: give no EXEC, --payload, --id or --wait",
                  EXIT_USAGE)  # fmt: skip
        _submit_file(file, url, api_key, as_json)
        return
    if exec_name is None:
        _fail("give an EXEC (job type) or --file", EXIT_USAGE)
    if timeout is not None and not wait:
        _fail("--timeout is how long --wait waits: add --wait", EXIT_USAGE)
    try:
        submission = Submission(
            exec=exec_name, payload=_parse_payload(payload), id=job_id, max_attempts=max_attempts,
            priority=priority, delay_s=delay, ttl_s=ttl, max_run_s=max_run, key=key,
        )  # fmt: skip
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        _fail(f"{where}: {problem['msg']}" if where else str(problem["msg"]), EXIT_USAGE)
    with _client(url, api_key) as client:
        accepted = client.submit(**submission.to_body())
        if accepted.warning:  # e.g. no worker serves the exec: the job would wait in silence
            typer.echo(f"warning: {accepted.warning}", err=True)
        if not wait:
            _show_accepted(accepted, as_json)
            return
        if not as_json:
            _show_accepted(accepted, as_json=False)
        try:
            job = client.wait(accepted.id, timeout)
        except WaitTimeout as timed_out:
            if as_json:
                _print_json(timed_out.job.model_dump())
            _fail(timed_out.detail, EXIT_TIMEOUT)
    if as_json:
        _print_json(job.model_dump())
    else:
        _show_job(job)
    raise typer.Exit(_job_exit_code(job))


def _show_accepted(accepted: Accepted, as_json: bool) -> None:
    if as_json:
        _print_json(accepted.model_dump())
    elif accepted.existing:
        Console().print(f"job {escape(accepted.id)} already exists: {_status(accepted.status)}")
    else:
        Console().print(f"accepted job {escape(accepted.id)}: {_status(accepted.status)}")


def _submit_file(path: Path, url: str | None, api_key: str | None, as_json: bool) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from dispatch.client import DispatchError

    try:
        jobs = read_jobs_file(path)
    except ValueError as error:
        _fail(str(error), EXIT_USAGE)
    if not jobs:
        _fail(f"{path}: no jobs in the file", EXIT_USAGE)
    accepted: list[Accepted] = []
    progress = Progress(
        TextColumn("submitting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=as_json,
    )  # fmt: skip
    with _client(url, api_key) as client, progress:
        task = progress.add_task("submit", total=len(jobs))

        def advance(answers: list[Accepted]) -> None:
            accepted.extend(answers)
            progress.advance(task, len(answers))

        try:
            client.submit_many(jobs, on_batch=advance)
        except DispatchError as error:
            progress.stop()
            _fail(f"{error} ({len(accepted)} of {len(jobs)} jobs were accepted before it)")
    existing = sum(1 for answer in accepted if answer.existing)
    if as_json:
        _print_json({"submitted": len(accepted), "new": len(accepted) - existing,
                     "existing": existing, "ids": [answer.id for answer in accepted]})  # fmt: skip
    else:
        Console().print(
            f"submitted {len(accepted)} jobs ({len(accepted) - existing} new, "
            f"{existing} already known)"
        )


# --- status and the dead-letter queue -------------------------------------------------------


def job_status(job_id: str, url: str | None, as_json: bool, api_key: str | None = None) -> None:
    """`dispatch status ID`: one job's status, attempts, result or error."""
    with _client(url, api_key) as client:
        job = client.get(job_id)
    if as_json:
        _print_json(job.model_dump())
    else:
        _show_job(job)


def _status_command(stack_status: Callable[[], None] | None) -> Callable[..., None]:
    def status(
        job_id: Annotated[
            str | None,
            typer.Argument(metavar="[ID]", help="A job id: show that job.", show_default=False),
        ] = None,
        url: UrlOption = None,
        api_key: ApiKeyOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Show a job (`status ID`), or which processes of the local stack run (`status`,
        exit code 3 when one is not)."""
        if job_id is not None:
            job_status(job_id, url, as_json, api_key)
        elif stack_status is not None:
            if url is not None or api_key is not None or as_json:
                _fail("--url, --api-key and --json apply to `status ID` only", EXIT_USAGE)
            stack_status()
        else:
            _fail("give a job ID", EXIT_USAGE)

    return status


def dlq_list(
    exec_name: Annotated[str | None, typer.Option("--exec", help="Only jobs of this exec.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List dead-lettered jobs, oldest first (an admin command: the admin development key
    by default)."""
    with _client(url, api_key, "admin") as client:
        jobs = client.dlq(exec_name, limit)
    if as_json:
        _print_json([job.model_dump() for job in jobs])
        return
    if not jobs:
        Console().print(
            "the dead-letter queue is empty" + (f" for {exec_name}" if exec_name else "")
        )
        return
    table = Table()
    for name in ("id", "exec", "client", "attempts", "reason"):
        table.add_column(name, no_wrap=True)  # short words: wrapping them only hurts
    table.add_column("error", overflow="fold", ratio=1)
    table.add_column("updated", no_wrap=True)
    for job in jobs:
        table.add_row(
            escape(job.id), escape(job.exec), escape(job.client_id), str(job.attempts),
            escape(job.dead_reason or "-"), escape(job.error or "-"), _when(job.updated_at),
        )  # fmt: skip
    Console().print(table)


def dlq_redrive(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="A dead job's id.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Requeue a dead job with its attempts reset (an admin command: the admin development
    key by default)."""
    with _client(url, api_key, "admin") as client:
        job = client.redrive(job_id)
    if as_json:
        _print_json(job.model_dump())
    else:
        Console().print(f"redriven job {escape(job.id)}: {_status(job.status)}, attempts reset")


# --- cancel ---------------------------------------------------------------------------------


def cancel(
    job_id: Annotated[
        str | None,
        typer.Argument(metavar="[ID]", help="The job to cancel.", show_default=False),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the job's error).")] = "",
    exec_pattern: Annotated[
        str | None,
        typer.Option("--exec", help="Admins: cancel the jobs of this exec pattern (image.>)."),
    ] = None,
    client_id: Annotated[
        str | None, typer.Option("--client", help="Admins: cancel this client's jobs.")
    ] = None,
    status: Annotated[
        str,
        typer.Option("--status", help="With --exec/--client: queued (a purge), running, or any."),
    ] = "queued",
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10_000, help="Most jobs one call cancels.")
    ] = 1_000,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a job: `cancel ID` (queued: at once; running: its worker is told to stop, and
    it ends cancelled when the worker confirms). Admins cancel many: `cancel --exec
    'report.>' [--client C] [--status queued|running|any]`."""
    if (job_id is None) == (exec_pattern is None and client_id is None):
        _fail("give an ID, or --exec and/or --client (not both)", EXIT_USAGE)
    if status not in ("queued", "running", "any"):
        _fail("--status: queued, running or any", EXIT_USAGE)
    if job_id is not None:
        with _client(url, api_key) as client:
            job = client.cancel(job_id, reason=reason or None)
        if as_json:
            _print_json(job.model_dump())
        else:
            Console().print(f"job {escape(job.id)}: {_status(job.status)}")
        return
    with _client(url, api_key, "admin") as client:
        answer = client.cancel_many(
            exec=exec_pattern, client_id=client_id, status=status, limit=limit,
            reason=reason or None,
        )  # fmt: skip
    if as_json:
        _print_json(answer)
    else:
        Console().print(
            f"cancelled {answer['cancelled']} queued job(s); told the workers of "
            f"{answer['cancelling']} running job(s) to stop"
        )


# --- pause, resume, purge --------------------------------------------------------------------


def _scope_of(exec_pattern: str | None, client_id: str | None) -> tuple[str, str]:
    if (exec_pattern is None) == (client_id is None):
        _fail("give --exec PATTERN or --client ID (one of the two)", EXIT_USAGE)
    return ("exec", exec_pattern) if exec_pattern is not None else ("client", client_id or "")


ExecOption = Annotated[
    str | None,
    typer.Option("--exec", help="An exec pattern: image.resize, image.* (one token), image.>."),
]
ClientOption = Annotated[str | None, typer.Option("--client", help="A client id (a tenant).")]


def _show_pauses(pauses: list[Pause], as_json: bool) -> None:
    if as_json:
        _print_json([pause.model_dump() for pause in pauses])
        return
    if not pauses:
        Console().print("nothing is paused")
        return
    table = Table("scope", "target", "since", "by", "reason")
    for pause in pauses:
        table.add_row(pause.scope, escape(pause.target), _when(pause.at),
                      escape(pause.by or "-"), escape(pause.reason))  # fmt: skip
    Console().print(table)


def pause(
    exec_pattern: ExecOption = None,
    client_id: ClientOption = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept with the pause).")] = "",
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Pause an exec pattern's queues or a client's jobs: nothing new starts (running jobs
    finish; submissions still queue) until `resume`. Without options: list the pauses. An
    admin command (the admin development key by default)."""
    with _client(url, api_key, "admin") as client:
        if exec_pattern is None and client_id is None:
            _show_pauses(client.pauses(), as_json)
            return
        scope, target = _scope_of(exec_pattern, client_id)
        _show_pauses(client.pause(scope, target, reason=reason or None), as_json)


def resume(
    exec_pattern: ExecOption = None,
    client_id: ClientOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """End a pause (exactly this one: resuming image.* leaves image.> paused); what it held
    starts at once. An admin command."""
    scope, target = _scope_of(exec_pattern, client_id)
    with _client(url, api_key, "admin") as client:
        _show_pauses(client.resume(scope, target), as_json)


def purge(
    exec_pattern: ExecOption = None,
    client_id: ClientOption = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in each job's error).")] = "",
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 10_000,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel the queued jobs of an exec pattern or a client (running ones finish), at most
    --limit a call. An admin command; pause first to stop new ones from starting."""
    _scope_of(exec_pattern, client_id)
    with _client(url, api_key, "admin") as client:
        answer = client.cancel_many(
            exec=exec_pattern, client_id=client_id, status="queued", limit=limit,
            reason=reason or None,
        )  # fmt: skip
    if as_json:
        _print_json(answer)
    else:
        Console().print(f"purged {answer['cancelled']} queued job(s)")


# --- limits ---------------------------------------------------------------------------------

LIMIT_SCOPES = ("client", "exec", "key")


def _limit_scope(scope: str) -> str:
    if scope not in LIMIT_SCOPES:
        _fail(f"SCOPE: client, exec or key, not {scope!r}", EXIT_USAGE)
    return scope


def _knob(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _show_limits(limits: list[Limit], as_json: bool) -> None:
    if as_json:
        _print_json([limit.model_dump() for limit in limits])
        return
    if not limits:
        Console().print("no limits are in force")
        return
    table = Table("scope", "target", "max inflight", "rate/s", "burst", "inflight", "held",
                  "source", "by", "reason")  # fmt: skip
    for limit in limits:
        table.add_row(
            limit.scope, escape(limit.target), _knob(limit.max_inflight), _knob(limit.rate),
            _knob(limit.burst), _knob(limit.inflight), str(limit.held), limit.source,
            escape(limit.by or "-"), escape(limit.reason),
        )  # fmt: skip
    Console().print(table)


ScopeArgument = Annotated[
    str, typer.Argument(metavar="SCOPE", help="client, exec or key.", show_default=False)
]
TargetArgument = Annotated[
    str,
    typer.Argument(
        metavar="TARGET",
        help="A client id; an exec pattern (image.>); a key (account:42) or key pattern "
        "(account:*).",
        show_default=False,
    ),
]


def limits_list(
    context: typer.Context,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Runtime limits: `limits` lists every limit in force (runtime and settings', with the
    jobs each counts running and holds back), `limits set` sets one, `limits rm` removes
    one. Admin commands (the admin development key by default)."""
    if context.invoked_subcommand is not None:
        return
    with _client(url, api_key, "admin") as client:
        _show_limits(client.limits(), as_json)


def limits_set(
    scope: ScopeArgument,
    target: TargetArgument,
    max_inflight: Annotated[
        int | None, typer.Option("--max-inflight", help="Jobs running at once (>= 1).")
    ] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Starts per second (> 0).")] = None,
    burst: Annotated[
        int | None,
        typer.Option("--burst", help="Starts at once after a quiet spell (with --rate)."),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept with the limit).")] = "",
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Set a runtime limit of a client, an exec pattern (one budget for all it matches) or a
    concurrency key (a pattern ending in * gives each key its own): --max-inflight jobs
    running at once and/or --rate starts a second. It replaces the limit of the same scope
    and target (the settings' one too, until `limits rm`)."""
    _limit_scope(scope)
    if max_inflight is None and rate is None:
        _fail("give --max-inflight, --rate, or both", EXIT_USAGE)
    if burst is not None and rate is None:
        _fail("--burst: only with --rate", EXIT_USAGE)
    with _client(url, api_key, "admin") as client:
        limit = client.set_limit(
            scope, target, max_inflight=max_inflight, rate=rate, burst=burst, reason=reason
        )
    _show_limits([limit], as_json)


def limits_rm(
    scope: ScopeArgument,
    target: TargetArgument,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove a runtime limit: the settings' limit of the same scope and target (if any)
    applies again, and what it held starts."""
    _limit_scope(scope)
    with _client(url, api_key, "admin") as client:
        answer = client.remove_limit(scope, target)
    if as_json:
        _print_json(answer.model_dump())
        return
    said = "removed" if answer.removed else "no runtime limit was set for"
    Console().print(f"{said} {scope} {escape(target)}")
    if answer.limit is not None:
        Console().print("in force now, from the settings:")
        _show_limits([answer.limit], as_json=False)


# --- worker ---------------------------------------------------------------------------------


def load_app(reference: str) -> Any:
    """The WorkerApp at `module:attribute` (a callable there is called to make one). The
    current directory is importable, as with `python -m`."""
    from dispatch.worker.sdk import WorkerApp

    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--app: expected module:attribute, got {reference!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"--app: cannot import {module_name!r}: {error}") from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"--app: {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(found, WorkerApp) and callable(found):
        found = found()
    if not isinstance(found, WorkerApp):
        raise ValueError(f"--app: {reference} is a {type(found).__name__}, not a WorkerApp")
    return found


def worker(
    app_reference: Annotated[
        str, typer.Option("--app", help="The WorkerApp to run, as module:attribute.")
    ],
    subjects: Annotated[
        list[str] | None,
        typer.Option(
            "--subjects",
            "-s",
            help="Subject patterns to take (job.assign.image.*), repeated or comma-separated. "
            "Default: every handler's.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", min=1, help="Jobs at once.")
    ] = None,
    transport: Annotated[
        str | None, typer.Option("--transport", help="ws (WebSocket) or rest (long-poll).")
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option("--grace", min=0, help="Seconds running jobs get to finish on SIGTERM."),
    ] = None,
    worker_id: Annotated[str | None, typer.Option("--worker-id", help="Default: unique.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Run a worker process: take jobs for the app's handlers until SIGTERM or Ctrl-C. With
    no node reachable yet, it says so at once and keeps trying."""
    from dispatch.client import DispatchError
    from dispatch.worker.sdk import RunOptions, WorkerError

    if transport is not None and transport not in ("ws", "rest"):
        _fail(f"--transport: expected ws or rest, got {transport!r}", EXIT_USAGE)
    patterns = [part.strip() for item in subjects or [] for part in item.split(",") if part.strip()]
    try:
        app = load_app(app_reference)
        options: RunOptions = {
            "urls": url,
            "api_key": api_key_for("worker", api_key),
            "worker_id": worker_id,
            "subjects": patterns or None,
            "concurrency": concurrency,
            "transport": "rest" if transport == "rest" else "ws" if transport else None,
            "grace_s": grace,
        }
        app.options(**options)  # checked here, so a mistake is one line and exit code 2
    except (ValueError, WorkerError) as error:
        _fail(str(error), EXIT_USAGE)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        app.run(**options)
    except WorkerError as error:
        _fail(str(error), EXIT_USAGE)
    except DispatchError as error:
        _fail(str(error))


# --- registration ---------------------------------------------------------------------------


def _command_name(info: CommandInfo) -> str | None:
    if info.name:
        return info.name
    callback = info.callback
    return callback.__name__.replace("_", "-") if callback is not None else None


def register(app: typer.Typer) -> None:
    """Add the job commands to `app` (again: nothing). `status` keeps its stack view
    without an ID and shows a job with one."""
    if getattr(app, _REGISTERED, False):
        return
    stack_status = None
    for info in list(app.registered_commands):
        if _command_name(info) == "status":
            stack_status = info.callback
            app.registered_commands.remove(info)
    app.command("submit")(submit)
    app.command("status")(_status_command(stack_status))
    app.command("cancel")(cancel)
    app.command("pause")(pause)
    app.command("resume")(resume)
    app.command("purge")(purge)
    limits = typer.Typer(
        help=limits_list.__doc__,
        rich_markup_mode="markdown",
    )
    limits.callback(invoke_without_command=True)(limits_list)
    limits.command("set")(limits_set)
    limits.command("rm")(limits_rm)
    app.add_typer(limits, name="limits")
    dlq = typer.Typer(
        help="Read and repair the dead-letter queue.",
        no_args_is_help=True,
        rich_markup_mode="markdown",  # as `dispatch` itself (dispatch/cli.py)
    )
    dlq.command("list")(dlq_list)
    dlq.command("redrive")(dlq_redrive)
    app.add_typer(dlq, name="dlq")
    app.command("worker")(worker)
    setattr(app, _REGISTERED, True)
