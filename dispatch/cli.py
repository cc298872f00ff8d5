"""The `dispatch` command."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from dispatch.cli_jobs import EXIT_CODES, EXIT_USAGE
from dispatch.cli_jobs import register as register_job_commands
from dispatch.cli_replay import register_replay_command
from dispatch.stack.process import ProcessError

# Every `dispatch` process imports this module (`up` starts several), so the settings and the
# stack (kafka-python, httpx) are imported in the commands that use them: each command pays
# only for its own. dispatch.stack.process is standard library only.
if TYPE_CHECKING:
    from dispatch.settings import Settings
    from dispatch.stack.local import ComponentStatus, LocalStack


def _exit_codes_epilog() -> str:
    # One line per code, each its own paragraph: help is rendered as Markdown (see `app`).
    return "Exit codes:\n\n" + "\n".join(
        f"- **{code}** {meaning}" for code, meaning in EXIT_CODES.items()
    )


# Markdown, not rich's markup: rich mode keeps a docstring's line breaks in the command list
# (a help text broke mid-sentence); Markdown joins a paragraph's lines and shows `code`.
app = typer.Typer(
    help="A job dispatcher centred on Spark Structured Streaming.",
    epilog=_exit_codes_epilog(),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)
console = Console()
errors = Console(stderr=True)


def _settings(profile: str = "") -> Settings:
    return _settings_and_profile(profile)[0]


def _settings_and_profile(profile: str = "") -> tuple[Settings, str]:
    """The settings with `profile`'s overlay (conf/profiles/), and the profile's name; without
    one, DISPATCH_PROFILE's, else the profile the stack under `var` was started with, so that
    `dispatch down` and `status` act on what `dispatch up --profile ...` started."""
    from dispatch.settings import ConfigError, load_settings, profile_name

    try:
        chosen = profile or profile_name()
        if not chosen:
            from dispatch.stack.plan import recorded_profile

            chosen = recorded_profile(load_settings())
        return load_settings(chosen), chosen
    except (ConfigError, ProcessError) as error:
        errors.print(f"[red]error:[/red] {error}", markup=True, highlight=False)
        raise typer.Exit(2) from error


def _fail(error: Exception, code: int = 1) -> typer.Exit:
    errors.print(f"[red]error:[/red] {error}", markup=True, highlight=False)
    return typer.Exit(code)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dispatch")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"dispatch {_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """A job dispatcher centred on Spark Structured Streaming."""


@app.command()
def up(
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Start in the background and return.")
    ] = False,
    streaming: Annotated[
        bool, typer.Option(help="Run the Structured Streaming fold into Delta.")
    ] = True,
    workers: Annotated[
        int, typer.Option(min=0, max=64, help="Demo workers (dispatch.worker.examples) to run.")
    ] = 0,
    profile: Annotated[
        str,
        typer.Option(
            help="Settings overlay from conf/profiles/ (e.g. `cluster`: 3 brokers, an object "
            "store, a Spark cluster, 3 API nodes); `down` and `status` remember it."
        ),
    ] = "",
) -> None:
    """Start the local stack (Kafka broker in KRaft mode, topics, the streaming fold, a leader
    and a standby API node, demo workers; with `--profile cluster` the cluster's parts too);
    Ctrl-C stops it."""
    from dispatch.stack.jars import JarError
    from dispatch.stack.local import LocalStack, StopSignals
    from dispatch.stack.plan import StackPlan

    settings, chosen = _settings_and_profile(profile)
    plan = StackPlan(streaming=streaming, workers=workers, profile=chosen)
    stack = LocalStack(settings, plan)
    with StopSignals() as signals:
        try:
            created = stack.up()
        except (ProcessError, JarError) as error:
            stack.down()
            raise _fail(error) from error
        _print_status(stack)
        if created:
            console.print(f"created topics: {', '.join(created)}")
        if detach:
            console.print("running in the background; `dispatch down` stops it")
            return
        console.print("press Ctrl-C to stop")
        reason = stack.wait_until_stopped(signals)
        console.print(f"stopping ({reason})")
        stack.down()
    if reason not in ("SIGINT", "SIGTERM"):
        raise typer.Exit(1)


@app.command()
def demo() -> None:
    """The tour: a stack of its own, a mix of jobs, a leader killed, the state read from Delta."""
    from dispatch.demo import run_demo
    from dispatch.stack.jars import JarError

    settings = _settings()
    try:
        code = run_demo(settings)
    except (ProcessError, JarError) as error:
        raise _fail(error) from error
    raise typer.Exit(code)


@app.command()
def down() -> None:
    """Stop every process of the local stack started by `dispatch up --detach`."""
    from dispatch.stack.local import LocalStack

    stack = LocalStack(_settings())
    try:
        stopped = stack.down()
    except ProcessError as error:
        raise _fail(error) from error
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def restart(
    component: Annotated[
        str, typer.Argument(help="broker, streaming, node or workers.", show_default=False)
    ],
    port: Annotated[
        int | None, typer.Argument(help="For `node`: the port of the node to restart.")
    ] = None,
) -> None:
    """Restart one component of a stack started by `dispatch up --detach` (stopped by its
    recorded pid, started again with the same settings); the others keep running."""
    from dispatch.stack.local import LocalStack

    if (component == "node") != (port is not None):
        raise _fail(ValueError("give a PORT with `node`, and only with `node`"), EXIT_USAGE)
    stack = LocalStack(_settings())
    try:
        restarted = stack.restart(component, port)
    except ProcessError as error:
        raise _fail(error) from error
    console.print(f"restarted: {', '.join(restarted)}" if restarted else "nothing to restart")


@app.command()
def status() -> None:
    """Show which processes of the local stack are running. Exit code 3 if any is not."""
    from dispatch.stack.local import LocalStack

    stack = LocalStack(_settings())
    try:
        components = _print_status(stack)
    except ProcessError as error:
        raise _fail(error) from error
    if not all(component.running for component in components):
        raise typer.Exit(3)


def _print_status(stack: LocalStack) -> list[ComponentStatus]:
    components = stack.status()
    table = Table("component", "state", "pid", "address", "log")
    for component in components:
        state = "[green]running[/green]" if component.running else "[red]stopped[/red]"
        table.add_row(
            component.name,
            state,
            str(component.pid or "-"),
            component.address,
            str(component.log_file),
        )
    console.print(table)
    return components


@app.command()
def serve(
    port: Annotated[int, typer.Option(help="Port on the configured api.host.")] = 8000,
    node_id: Annotated[str | None, typer.Option(help="Name of this node.")] = None,
) -> None:
    """Run one API node (leader of its dispatcher group) in the foreground."""
    from dispatch.api.server import serve as serve_node

    serve_node(_settings(), port, node_id)


@app.command()
def keys(
    role: Annotated[str | None, typer.Option(help="Print only this role's key.")] = None,
) -> None:
    """Print the local development API keys (created on first use; only hashes in config)."""
    from dispatch.auth import ensure_dev_keys

    dev_keys = ensure_dev_keys(_settings().auth)
    if role is not None:
        if role not in dev_keys:
            raise _fail(ValueError(f"--role: expected one of {', '.join(dev_keys)}"), EXIT_USAGE)
        console.print(dev_keys[role], highlight=False)
        return
    for name, key in dev_keys.items():
        console.print(f"{name:7} {key}", highlight=False)


@app.command()
def bench(
    jobs: Annotated[int, typer.Option(min=1, help="No-op jobs to run.")] = 20_000,
    workers: Annotated[int, typer.Option(min=1, help="WebSocket workers.")] = 4,
    batch: Annotated[
        int, typer.Option(min=1, max=10_000, help="Jobs per submit request (1: POST /v1/jobs).")
    ] = 500,
    clients: Annotated[
        int, typer.Option(min=1, max=1024, help="Concurrent submitters (keep-alive connections).")
    ] = 4,
    payload_bytes: Annotated[int, typer.Option(min=0, help="Payload size of each job.")] = 64,
    rate: Annotated[
        float | None, typer.Option(help="Submit at this many jobs/s (open loop), not all at once.")
    ] = None,
    warmup_jobs: Annotated[
        int,
        typer.Option(
            min=0,
            help="Jobs run first the same way and left out of the figures (a fresh broker's "
            "transactions are slow until its JIT warmed up).",
        ),
    ] = 10_000,
    sdk_loop: Annotated[
        int, typer.Option(min=0, help="Then time this many sequential `Client.submit` calls.")
    ] = 0,
    sdk_threads: Annotated[
        int, typer.Option(min=1, help="The SDK loop's calls over this many threads, one Client.")
    ] = 1,
    sdk_async: Annotated[
        int,
        typer.Option(min=0, help="The SDK loop as this many concurrent tasks on one AsyncClient."),
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """End-to-end jobs/s and latency percentiles, beside raw kafka-python on the same broker."""
    import json

    from dispatch.bench.e2e import (
        cpu_tables,
        jobs_per_transaction,
        run_bench,
        sdk_loop_mode,
        sdk_loop_name,
    )
    from dispatch.bench.stats import steal_percent

    try:
        mode = sdk_loop_mode(sdk_threads, sdk_async)
        if mode != "sequential" and not sdk_loop:
            raise ValueError("--sdk-threads and --sdk-async need --sdk-loop N")
    except ValueError as error:
        raise _fail(error, EXIT_USAGE) from None
    result = run_bench(
        _settings(), jobs=jobs, workers=workers, batch=batch, payload_bytes=payload_bytes,
        rate=rate, clients=clients, warmup_jobs=warmup_jobs, sdk_loop=sdk_loop,
        sdk_threads=sdk_threads, sdk_async=sdk_async,
    )  # fmt: skip
    if as_json:
        console.print_json(json.dumps(result.as_dict()))
        return
    table = Table("measure", "value")
    machine = result.machine_before
    table.add_row(
        "machine", f"{machine['nproc']} cores, {machine['cpu']}, Python {machine['python']}"
    )
    table.add_row(
        "load average",
        f"{machine['load_average']} before, {result.machine_after['load_average']} after",
    )
    steal = steal_percent(machine, result.machine_after)
    if steal is not None:
        table.add_row("CPU stolen by other guests", f"{steal:.1f}% during the run")
    table.add_row("jobs / workers / batch / clients", f"{jobs} / {workers} / {batch} / {clients}")
    table.add_row("warm-up (not counted)", f"{warmup_jobs} jobs")
    asked = f"{rate:g} jobs/s asked (open loop)" if rate else "closed loop"
    table.add_row("submit rate", f"{result.submit_jobs_per_s:,.0f} jobs/s measured; {asked}")
    table.add_row("submit requests", f"{result.submit_requests_per_s:,.0f} requests/s")
    table.add_row("end-to-end", f"{result.jobs_per_s:,.0f} jobs/s ({result.seconds:.1f} s)")
    table.add_row("raw kafka-python", f"{result.raw_kafka_records_per_s:,.0f} records/s")
    table.add_row("ratio", f"{result.ratio:.2f}")
    each = jobs_per_transaction(result.jobs, result.transactions)
    table.add_row("leader transactions", f"{result.transactions} ({each} jobs each)")
    if result.sdk_loop_jobs_per_s is not None:
        table.add_row(
            "SDK loop (sequential)" if mode == "sequential" else sdk_loop_name(mode),
            f"{result.sdk_loop_jobs_per_s:,.0f} jobs/s over {result.sdk_loop_jobs} calls",
        )
        each = jobs_per_transaction(result.sdk_loop_jobs, result.sdk_loop_transactions)
        table.add_row("  leader transactions", f"{result.sdk_loop_transactions} ({each} jobs each)")
    for name, figures in (
        ("request ms", result.request_ms),
        ("  behind schedule ms", result.behind_ms),
        ("SDK loop call ms", result.sdk_loop_ms),
        ("submit→assign ms", result.submit_to_assign_ms),
        ("  request→record ms", result.submit_to_record_ms),
        ("  record→assign ms", result.record_to_assign_ms),
        ("submit→complete ms", result.submit_to_complete_ms),
        ("warm-up submit→assign ms", result.warmup_submit_to_assign_ms),
    ):
        if figures is not None:
            table.add_row(name, "  ".join(f"{key} {value:g}" for key, value in figures.items()))
    console.print(table)
    # Plain lines, neither cut nor coloured: they are copied into BENCHMARKS.md.
    console.print(cpu_tables(result), soft_wrap=True, highlight=False, markup=False)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def streaming(context: typer.Context) -> None:
    """Run the Structured Streaming fold (Kafka -> Delta) in the foreground until Ctrl-C.

    Options pass through to `python -m dispatch.streaming.app` (e.g. `--available-now`)."""
    from dispatch.streaming.app import main as streaming_main

    raise typer.Exit(streaming_main(_settings(), list(context.args)))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def chaos(context: typer.Context) -> None:
    """The stack under a known job mix and injected faults: Jepsen-style safety counts and
    liveness figures; exit 1 on any safety count or a slow canary.

    Options pass through to `python -m dispatch.bench.chaos` (`dispatch chaos --help` lists
    them)."""
    from dispatch.bench.chaos import main as chaos_main

    raise typer.Exit(chaos_main(list(context.args), prog="dispatch chaos"))


# The job commands (submit, status ID, dlq, worker) live in their own module.
register_job_commands(app)
register_replay_command(app)


SERVER_PACKAGES = frozenset(
    {
        "pyspark",
        "httpx",
        "delta",
        "kafka",
        "confluent_kafka",
        "deltalake",
        "pyarrow",
        "pandas",
        "fastapi",
        "uvicorn",
        "pydantic_settings",
        "prometheus_client",
        "matplotlib",
    }
)
"""The top-level packages of the `server` extra: the light install (clients and workers) has
none of them, and a command that needs one says how to get it instead of a traceback."""


def main() -> None:
    try:
        sys.exit(app())
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        # typer.echo, not rich: rich wraps long lines, and an error stays one line.
        typer.echo(
            f"error: this command needs the server install ({error.name} is missing): the "
            "`server` extra, e.g. pip install '/path/to/checkout[server]'",
            err=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
