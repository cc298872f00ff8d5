"""The maintenance schedule (the Delta operations themselves run in the integration test)."""

from __future__ import annotations

from typing import Any, cast

from dispatch.streaming.maintenance import Maintenance, MaintenancePolicy
from dispatch.warehouse import Warehouse

NO_SPARK = cast(Any, None)
"""The recording subclass never touches Spark."""


class Recording(Maintenance):
    def __init__(self, policy: MaintenancePolicy, clock: list[float]) -> None:
        super().__init__(Warehouse.at("/nowhere"), policy, clock=lambda: clock[0])
        self.tables = ["a", "b"]
        self.ran: list[str] = []

    def optimize(self, names: list[str] | None = None) -> dict[str, float]:
        self.ran += [f"optimize {name}" for name in names or self.tables]
        return {}

    def vacuum(self, spark: Any, names: list[str] | None = None) -> dict[str, float]:
        self.ran += [f"vacuum {name}" for name in names or self.tables]
        return {}


def test_tables_take_turns_so_each_is_done_once_per_interval() -> None:
    clock = [100.0]
    maintenance = Recording(MaintenancePolicy(optimize_every_s=10, vacuum_every_s=40), clock)
    assert maintenance.run_due(NO_SPARK) == []
    clock[0] = 105.0
    assert maintenance.run_due(NO_SPARK) == ["optimize a"]
    clock[0] = 107.0
    assert maintenance.run_due(NO_SPARK) == []
    clock[0] = 110.0
    assert maintenance.run_due(NO_SPARK) == ["optimize b"]
    clock[0] = 121.0
    assert maintenance.run_due(NO_SPARK) == ["optimize a", "vacuum a"]
    assert maintenance.ran == ["optimize a", "optimize b", "optimize a", "vacuum a"]


def test_zero_disables() -> None:
    clock = [0.0]
    maintenance = Recording(MaintenancePolicy(optimize_every_s=0, vacuum_every_s=0), clock)
    clock[0] = 1e9
    assert maintenance.run_due(NO_SPARK) == []
