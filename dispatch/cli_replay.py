"""`dispatch replay`: a recorded window replayed through the pure core with other settings.

`register_replay_command(app)` adds it to a Typer app (`dispatch/cli.py` does, for `dispatch`).
Output: a rich table (actual -> simulated per exec and per tenant), or one JSON document with
`--json`; every run is also appended to the Delta table `replays` unless `--no-save`. An error
is one line on stderr. Exit codes: 0 done; 1 the window could not be read; 2 bad usage (a
`--set` naming no setting or giving a bad value, a bad time, a bad fleet). See docs/replay.md.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Annotated, NoReturn

import typer
from rich.console import Console

EXIT_ERROR = 1
EXIT_USAGE = 2

# `dispatch` imports this module for every command, and importing any `dispatch.replay` module
# imports the whole package (pyarrow, the core, the settings), so `replay` imports it when it
# runs. The defaults its `--help` shows are copies, which tests/unit/replay/test_cli_replay.py
# checks against the package's.
DEFAULT_TAIL_S = 3600.0  # dispatch.replay.source's
DEFAULT_WARMUP_S = 600.0  # dispatch.replay.source's
DEFAULT_SUBJECTS = ("job.assign.>",)  # dispatch.replay.fleet's
REPLAYS = "replays"  # dispatch.replay.table's


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def parse_time(text: str, option: str) -> float:
    """An ISO 8601 time as unix seconds; a time without a zone is UTC."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        _fail(f"{option} {text!r}: expected an ISO 8601 time, e.g. 2026-01-01T09:00:00Z", 2)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def replay(
    since: Annotated[
        str | None, typer.Option(help="Start of the window (ISO 8601; no zone: UTC).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="End of the window, exclusive (ISO 8601; no zone: UTC).")
    ] = None,
    version: Annotated[
        int | None,
        typer.Option(help="Read `events` as of this Delta version (time travel).", min=0),
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="Dispatcher group (default: dispatcher.group).")
    ] = None,
    tail_s: Annotated[
        float, typer.Option(help="Seconds after --until still read for the window's jobs.")
    ] = DEFAULT_TAIL_S,
    warmup_s: Annotated[
        float,
        typer.Option(
            help="Seconds before --since whose jobs are replayed, not reported "
            "(the backlog the window starts with).",
            min=0,
        ),
    ] = DEFAULT_WARMUP_S,
    assignments: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A setting for the replay, key=value (repeatable): dispatcher.default_cap=50, "
            "dispatcher.caps.acme=10, dispatcher.ack_timeout_s=5, dispatcher.max_run_s=600, "
            "jobs.exec_priority.EXEC=3, dispatcher.pause.exec.PATTERN=true (held for the whole "
            "replay; false: never), dispatcher.pause.client.CLIENT=true, "
            "dispatcher.limits.client.CLIENT.rate=50, "
            "dispatcher.limits.exec.PATTERN.max_inflight=4, "
            "dispatcher.limits.key.PREFIX*.max_inflight=1 (the recorded runtime limits of that "
            "target are left out)...",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Simulate N identical workers (default: the recorded fleet).", min=1),
    ] = None,
    slots: Annotated[
        int | None,
        typer.Option(
            help="Slots (credit) per worker with --workers (default: recorded median).", min=1
        ),
    ] = None,
    subjects: Annotated[
        str, typer.Option(help="Subject patterns of --workers workers, comma-separated.")
    ] = ",".join(DEFAULT_SUBJECTS),
    seed: Annotated[int, typer.Option(help="Seed of the draws for jobs never run.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    save: Annotated[
        bool, typer.Option("--save/--no-save", help=f"Append the run to the `{REPLAYS}` table.")
    ] = True,
) -> None:
    """Replay a recorded window with other settings; compare queue waits, throughput,
    attempts and dead letters, actual against simulated, per exec and per tenant."""
    from dispatch.replay.overrides import OverrideError
    from dispatch.replay.render import report_table
    from dispatch.replay.run import ReplayRequest, run_replay
    from dispatch.replay.source import WindowError
    from dispatch.replay.table import append_replay
    from dispatch.settings import ConfigError, load_settings
    from dispatch.warehouse import Warehouse

    try:
        settings = load_settings()
    except ConfigError as error:
        _fail(str(error), EXIT_USAGE)
    request = ReplayRequest(
        since=None if since is None else parse_time(since, "--since"),
        until=None if until is None else parse_time(until, "--until"),
        version=version,
        group=group or settings.dispatcher.group,
        tail_s=tail_s,
        warmup_s=warmup_s,
        assignments=tuple(assignments or ()),
        workers=workers,
        slots=slots,
        subjects=tuple(part.strip() for part in subjects.split(",") if part.strip()),
        seed=seed,
    )
    warehouse = Warehouse.of(settings)
    try:
        report = run_replay(warehouse, settings.dispatcher, request)
    except OverrideError as error:
        _fail(str(error), EXIT_USAGE)
    except WindowError as error:
        _fail(str(error), EXIT_ERROR)
    except ValueError as error:  # a fleet the core refuses (bad subjects)
        _fail(str(error), EXIT_USAGE)
    saved: int | None = None
    if save:
        saved = append_replay(warehouse, report, uuid.uuid4().hex, dt.datetime.now(dt.UTC))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), sort_keys=True))
        return
    console = Console()
    if not report.groups:
        console.print("no job was enqueued in the window")
    else:
        console.print(report_table(report))
    console.print(f"{report.input_events} events read, {report.simulated_events} simulated")
    if saved is not None:
        console.print(f"saved to {warehouse.table(REPLAYS)} (version {saved})")


def register_replay_command(app: typer.Typer) -> None:
    """Add `replay` to `app`."""
    app.command("replay")(replay)
