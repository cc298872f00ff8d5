"""`dispatch replay`: a recorded window of the events log, replayed through the pure core with
other settings against a simulated fleet, on a virtual clock. See docs/replay.md.

- `source`: the window read from the Delta `events` table (delta-rs);
- `history`: the jobs, their recorded attempts and the workers, derived from the events;
- `overrides`: `--set key=value` checked against the typed `[dispatcher]` settings;
- `fleet`, `behaviour`: the simulated workers and how each attempt behaves;
- `simulation`: the discrete-event loop around `dispatch.core.Dispatcher`;
- `report`, `render`: the figures, actual against simulated; the table for people;
- `table`: the Delta table `replays`; `run`: one replay from end to end.

Everything but `source`, `table` and `run_replay` is pure: no Kafka, Spark, FastAPI or clock.
"""

from dispatch.replay.history import recorded_history
from dispatch.replay.overrides import OverrideError, ReplayPolicy, apply_overrides
from dispatch.replay.report import ReplayReport, compare, figures_by_group
from dispatch.replay.run import ReplayRequest, replay_history, run_replay
from dispatch.replay.simulation import simulate
from dispatch.replay.source import WindowError

__all__ = [
    "OverrideError",
    "ReplayPolicy",
    "ReplayReport",
    "ReplayRequest",
    "WindowError",
    "apply_overrides",
    "compare",
    "figures_by_group",
    "recorded_history",
    "replay_history",
    "run_replay",
    "simulate",
]
