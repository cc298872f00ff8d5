"""One replay from end to end, on a recorded run made with the core."""

from __future__ import annotations

import json

import pytest

from dispatch.replay.fleet import recorded_fleet
from dispatch.replay.history import recorded_history
from dispatch.replay.model import History
from dispatch.replay.overrides import apply_overrides
from dispatch.replay.run import ReplayRequest, fleet_for, parameters_of, replay_history
from tests.unit.replay.recording import RECORDED_SETTINGS, job_mix, record_run


@pytest.fixture(scope="module")
def history() -> History:
    return recorded_history(record_run(job_mix(seed=7, duration_s=40.0)))


def replay_json(history: History, *sets: str, seed: int = 0) -> str:
    policy = apply_overrides(RECORDED_SETTINGS, sets)
    request = ReplayRequest(assignments=sets, seed=seed)
    fleet = fleet_for(request, history)
    report = replay_history(
        history,
        policy,
        fleet,
        recorded_under=RECORDED_SETTINGS,
        seed=seed,
        parameters=parameters_of(request, policy, history, fleet),
    )
    return json.dumps(report.to_dict(), sort_keys=True)


def test_the_same_history_and_settings_give_the_same_report(history: History) -> None:
    first = replay_json(history, "dispatcher.caps.acme=2")
    assert first == replay_json(history, "dispatcher.caps.acme=2")
    assert first != replay_json(history, "dispatcher.caps.acme=3")


def test_the_report_records_its_parameters_and_both_sides(history: History) -> None:
    report = json.loads(replay_json(history, "dispatcher.default_cap=50", seed=4))
    parameters = report["parameters"]
    assert parameters["set"] == ["dispatcher.default_cap=50"]
    assert parameters["policy"]["dispatcher"]["default_cap"] == 50
    assert parameters["fleet"] == {"recorded": True, "workers": 3, "slots": 6}
    assert parameters["seed"] == 4
    everything = report["groups"][0]
    assert (everything["dimension"], everything["key"]) == ("all", "all")
    assert everything["actual"]["jobs"] == everything["simulated"]["jobs"] == len(history.jobs)


def test_workers_n_replaces_the_recorded_fleet(history: History) -> None:
    assert fleet_for(ReplayRequest(), history) == recorded_fleet(history)
    fleet = fleet_for(ReplayRequest(workers=5), history)
    assert [w.slots for w in fleet] == [2] * 5  # the recorded workers' median
    assert [w.slots for w in fleet_for(ReplayRequest(workers=2, slots=7), history)] == [7, 7]
