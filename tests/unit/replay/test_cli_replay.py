"""`dispatch replay` on a Typer app of its own, against a recorded run written to Delta."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dispatch import cli_replay
from dispatch.cli_replay import parse_time, register_replay_command
from dispatch.replay import fleet, source
from dispatch.replay.table import REPLAYS
from dispatch.warehouse import Warehouse
from tests.unit.replay.recording import job_mix, record_run, write_events_table


def app() -> typer.Typer:
    replay_app = typer.Typer()
    register_replay_command(replay_app)

    @replay_app.callback()
    def main() -> None:
        """A group, so the command is called by its name as under `dispatch`."""

    return replay_app


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    found = Warehouse.at(tmp_path_factory.mktemp("cli") / "delta")
    write_events_table(found, record_run(job_mix(seed=7, duration_s=30.0)))
    return found


def invoke(warehouse: Warehouse, *args: str) -> tuple[int, str, str]:
    env = {
        "DISPATCH_PATHS__WAREHOUSE": warehouse.location,
        # The settings the recording ran under (tests/unit/replay/recording.py).
        "DISPATCH_DISPATCHER__ACK_TIMEOUT_S": "2",
        "DISPATCH_DISPATCHER__MAX_ACK_TIMEOUT_S": "8",
        "DISPATCH_DISPATCHER__CAPS": '{"acme": 6}',
    }
    result = CliRunner().invoke(app(), ["replay", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_json_is_the_same_for_the_same_replay_and_the_run_is_saved(warehouse: Warehouse) -> None:
    args = ("--set", "dispatcher.caps.acme=2", "--since", "2026-01-01T00:00:00Z", "--json")
    code, first, _ = invoke(warehouse, *args)
    assert code == 0
    assert invoke(warehouse, *args)[1] == first
    report = json.loads(first)
    acme = next(g for g in report["groups"] if g["key"] == "acme")
    assert acme["simulated"]["queue_wait_p95_s"] > acme["actual"]["queue_wait_p95_s"]
    runs = [
        r for r in warehouse.open(REPLAYS).to_pyarrow_table().to_pylist() if r["row_kind"] == "run"
    ]
    assert len(runs) == 2
    assert json.loads(runs[0]["parameters"])["set"] == ["dispatcher.caps.acme=2"]


def test_the_table_compares_actual_and_simulated(warehouse: Warehouse) -> None:
    code, out, _ = invoke(warehouse, "--workers", "1", "--slots", "1", "--no-save")
    assert code == 0
    assert "replay: actual -> simulated" in out
    assert "acme" in out and "image.resize" in out
    assert "->" in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--set", "dispatcher.defualt_cap=5"), 2, "--set dispatcher.defualt_cap: unknown"),
        (("--set", "dispatcher.default_cap=many"), 2, "--set dispatcher.default_cap:"),
        (("--since", "last tuesday"), 2, "--since 'last tuesday': expected an ISO 8601"),
        (("--version", "999"), 1, "version 999"),
        (("--workers", "2", "--subjects", "job.assign..x"), 2, "job.assign..x"),
    ],
)
def test_a_mistake_is_one_line_naming_it(
    warehouse: Warehouse, args: tuple[str, ...], code: int, message: str
) -> None:
    exit_code, _, err = invoke(warehouse, *args, "--no-save")
    assert exit_code == code
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1


def test_the_defaults_in_help_are_the_replay_packages() -> None:
    # Copies, so that `dispatch` does not import dispatch.replay for every command.
    assert cli_replay.DEFAULT_TAIL_S == source.DEFAULT_TAIL_S
    assert cli_replay.DEFAULT_WARMUP_S == source.DEFAULT_WARMUP_S
    assert cli_replay.DEFAULT_SUBJECTS == fleet.DEFAULT_SUBJECTS
    assert cli_replay.REPLAYS == REPLAYS


def test_times_without_a_zone_are_utc() -> None:
    assert parse_time("2026-01-01T00:00:00", "--since") == 1_767_225_600.0
    assert parse_time("2026-01-01T01:00:00+01:00", "--since") == 1_767_225_600.0


def test_an_empty_warehouse_is_an_error(tmp_path: Path) -> None:
    code, _, err = invoke(Warehouse.at(tmp_path / "none"), "--no-save")
    assert code == 1 and "no Delta table" in err


def test_a_window_without_jobs_says_so(warehouse: Warehouse) -> None:
    code, out, _ = invoke(warehouse, "--since", "2030-01-01T00:00:00", "--no-save")
    assert code == 0
    assert "no job was enqueued in the window" in out
