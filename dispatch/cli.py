"""The `dispatch` command."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dispatch.settings import ConfigError, Settings, load_settings
from dispatch.stack.jars import JarError
from dispatch.stack.local import ComponentStatus, LocalStack
from dispatch.stack.process import ProcessError

app = typer.Typer(
    help="A job dispatcher centred on Spark Structured Streaming.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
errors = Console(stderr=True)


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as error:
        errors.print(f"[red]error:[/red] {error}", markup=True, highlight=False)
        raise typer.Exit(2) from error


def _fail(error: Exception) -> typer.Exit:
    errors.print(f"[red]error:[/red] {error}", markup=True, highlight=False)
    return typer.Exit(1)


@app.command()
def up(
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Start in the background and return.")
    ] = False,
) -> None:
    """Start the local stack (Kafka broker in KRaft mode, topics); Ctrl-C stops it."""
    stack = LocalStack(_settings())
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
    reason = stack.wait_until_stopped()
    console.print(f"stopping ({reason})")
    stack.down()
    if reason.startswith("the broker"):
        raise typer.Exit(1)


@app.command()
def down() -> None:
    """Stop every process of the local stack started by `dispatch up --detach`."""
    stack = LocalStack(_settings())
    try:
        stopped = stack.down()
    except ProcessError as error:
        raise _fail(error) from error
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def status() -> None:
    """Show which processes of the local stack are running. Exit code 3 if any is not."""
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


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
