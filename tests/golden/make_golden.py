"""Make the golden `dispatch.events` logs that `tests/unit/test_golden_events.py` replays.

The golden files are fixed inputs: a log a real leader wrote must keep replaying to the same
state, whatever the code does later. Remake one ONLY when a change deliberately makes
existing logs replay differently (a format or reducer change that production logs will meet
too), and say so in the commit:

    .venv/bin/python -m tests.golden.make_golden current   # current.events.jsonl + .expected.json
    .venv/bin/python -m tests.golden.make_golden legacy    # legacy.events.jsonl + .expected.json

- `current`: `tests.unit.streaming.workload.mixed_workload(prune=True)` run by today's core
  with seeded lease tokens (reproducible), encoded as the leader encodes a commit
  (`encode_batches(..., max_bytes=1500, submit=position)`: a commit of many events spans
  several records, the last one carrying the submit position; the position is the count of
  `dispatch.submit` records the workload had written when the commit was decided).
- `legacy`: the same workload as the code stood just before the submit position existed
  (commit LEGACY_COMMIT, `git archive`d into a temporary directory and run there), so its
  records are byte for byte what that leader wrote: no `submit`, leases `"{epoch}.{n}"`.

Each log is one partition of `dispatch.events` (key: the group), one JSON line per record:
`{"partition", "offset", "key", "value"}` with the record's bytes as UTF-8 text (they are
JSON). `*.expected.json` is the writing leader's own final state (the newest epoch's core:
`JobRecord.to_dict()` by id, its fence epoch) plus what a rebuild derives from the log (the
submit position it resumes from, how many events the epoch fence admits).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Event
from dispatch.core.leases import seeded_lease_tokens
from dispatch.event_records import encode_batches

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GROUP = "default"
PARTITION = 0
LEGACY_COMMIT = "4f9d77268670e85b562d45ce8281d32b9a94a1d9"
"""The parent of b0e7a57 ("the submit position rides in the last events record")."""
MAX_RECORD_BYTES = 600
"""Small, so that the golden log holds commits split over several records."""


def write_log(name: str, values: Sequence[bytes], expected: dict[str, Any]) -> None:
    lines = []
    for offset, value in enumerate(values):
        text = value.decode("utf-8")
        assert text.encode("utf-8") == value
        line = {"partition": PARTITION, "offset": offset, "key": GROUP, "value": text}
        lines.append(json.dumps(line, ensure_ascii=False, separators=(",", ":")))
    (HERE / f"{name}.events.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (HERE / f"{name}.expected.json").write_text(
        json.dumps(expected, indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    print(f"{name}: {len(values)} records, {sum(map(len, values))} bytes", file=sys.stderr)


@contextmanager
def seeded_workload() -> Iterator[list[tuple[int, list[Event], dict[int, int]]]]:
    """Patch the workload module: seeded lease tokens, and each logged command recorded
    with its epoch, events and the submit position when it was decided."""
    from tests.unit.streaming import workload as module

    seeds = iter(range(1, 1000))
    commits: list[tuple[int, list[Event], dict[int, int]]] = []

    def seeded(config: CoreConfig) -> Dispatcher:
        return Dispatcher(config, lease_token=seeded_lease_tokens(next(seeds)))

    class Recording(module.Driver):
        def log(self, events: Sequence[Event]) -> None:
            if events:
                position = {PARTITION: len(self.workload.submits)}
                commits.append((self.core.epoch, list(events), position))
            super().log(events)

    with (
        mock.patch.object(module, "Dispatcher", seeded),
        mock.patch.object(module, "Driver", Recording),
    ):
        yield commits


def expected_state(leader: Dispatcher, values: Sequence[bytes]) -> dict[str, Any]:
    from tests.unit.test_golden_events import replay

    rebuilt = replay(list(values))
    jobs = {job.id: job.to_dict() for job in leader.jobs()}
    assert rebuilt.jobs == jobs, "the rebuild does not give the writing leader's jobs"
    assert rebuilt.epoch == leader.fence.epoch
    return {
        "group": GROUP,
        "records": len(values),
        "events": rebuilt.events,
        "admitted": rebuilt.admitted,
        "epoch": leader.fence.epoch,
        "submit_position": rebuilt.submit_position,
        "jobs": jobs,
    }


def make_current() -> None:
    from tests.unit.streaming.workload import mixed_workload

    with seeded_workload() as commits:
        workload = mixed_workload(prune=True)
    values: list[bytes] = []
    for epoch, events, position in commits:
        values.extend(encode_batches(GROUP, epoch, events, MAX_RECORD_BYTES, submit=position))
    write_log("current", values, expected_state(workload.leader, values))


_LEGACY_SCRIPT = """
import json, sys
from tests.unit.streaming.workload import mixed_workload
w = mixed_workload(prune=True)
json.dump({
    "values": [r.value().decode() for r in w.log],
    "epoch": w.leader.fence.epoch,
    "jobs": {j.id: j.to_dict() for j in w.leader.jobs()},
}, sys.stdout)
"""


def make_legacy() -> None:
    with tempfile.TemporaryDirectory(prefix="golden-legacy-") as tree:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", LEGACY_COMMIT],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        out = subprocess.run(
            [sys.executable, "-c", _LEGACY_SCRIPT],
            cwd=tree, env={"PYTHONPATH": tree}, check=True, capture_output=True,
        ).stdout  # fmt: skip
    old = json.loads(out)
    values = [value.encode("utf-8") for value in old["values"]]
    from tests.unit.test_golden_events import replay

    rebuilt = replay(list(values))
    # The old leader's own state (its code's `to_dict`) is the truth the rebuild must give.
    assert rebuilt.jobs == old["jobs"], "today's rebuild differs from the old leader's jobs"
    assert rebuilt.epoch == old["epoch"]
    expected = {
        "group": GROUP,
        "records": len(values),
        "events": rebuilt.events,
        "admitted": rebuilt.admitted,
        "epoch": old["epoch"],
        "submit_position": rebuilt.submit_position,
        "jobs": old["jobs"],
    }
    write_log("legacy", values, expected)


def main(argv: Sequence[str]) -> None:
    names = list(argv) or ["current", "legacy"]
    for name in names:
        {"current": make_current, "legacy": make_legacy}[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
