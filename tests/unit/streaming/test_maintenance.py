"""The maintenance schedule (the Delta operations themselves run in the integration test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from streaming.maintenance import Maintenance, MaintenancePolicy

NO_SPARK = cast(Any, None)
"""The recording subclass never touches Spark."""


class Recording(Maintenance):
    def __init__(self, policy: MaintenancePolicy, clock: list[float]) -> None:
        super().__init__(Path("/nowhere"), policy, clock=lambda: clock[0])
        self.ran: list[str] = []

    def optimize(self, spark: Any) -> dict[str, float]:
        self.ran.append("optimize")
        return {}

    def vacuum(self, spark: Any) -> dict[str, float]:
        self.ran.append("vacuum")
        return {}


def test_each_operation_runs_when_its_interval_has_passed() -> None:
    clock = [100.0]
    maintenance = Recording(MaintenancePolicy(optimize_every_s=10, vacuum_every_s=25), clock)
    assert maintenance.run_due(NO_SPARK) == []
    clock[0] = 111.0
    assert maintenance.run_due(NO_SPARK) == ["optimize"]
    clock[0] = 115.0
    assert maintenance.run_due(NO_SPARK) == []
    clock[0] = 126.0
    assert maintenance.run_due(NO_SPARK) == ["optimize", "vacuum"]


def test_zero_disables() -> None:
    clock = [0.0]
    maintenance = Recording(MaintenancePolicy(optimize_every_s=0, vacuum_every_s=0), clock)
    clock[0] = 1e9
    assert maintenance.run_due(NO_SPARK) == []
