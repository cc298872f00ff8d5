"""Broker restart benchmark: `kill -9` the Kafka broker under a light load, start it again, and
time how long the API nodes take to serve once it answers.

    .venv/bin/python -m dispatch.bench.restart_bench                     # 3 rounds, broker down 3 s
    .venv/bin/python -m dispatch.bench.restart_bench --rounds 5 --down 10 --out out.json
    .venv/bin/python -m dispatch.bench.restart_bench --json          # only the JSON on stdout

A real local stack (`LocalStack`, `StackPlan(streaming=False, workers=0)`: the broker, its
topics and two `dispatch serve` processes sharing the lease table) in a temporary folder on
free ports. The load (`dispatch.bench.harness_load.Load`): one submitter thread that POSTs
one job to `/v1/jobs` every `--every` seconds (each request with a 2 s timeout, to whichever
node answers, following a 307), and one REST worker thread that long-polls and acks every
assignment at once, noting when each ack was accepted.

Each round: the broker's process gets SIGKILL (by the pid its pid file records); after
`--down` seconds it is started again (`Broker.start`, which returns once a metadata request is
answered: "the broker answers"). Measured, from that moment: the first submission that a node
accepted (202) among those sent after the kill, and the first ack accepted (a job completed)
of a job submitted after the kill. The target: both within 2 s.

Output: a line per round on stderr as it ends, then the summary on stdout (as JSON with
`--json`); `--out FILE` also writes the JSON summary to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dispatch.bench.harness import kill_9, scratch_stack
from dispatch.bench.harness_load import Load
from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.stack.local import LocalStack


@dataclass
class Round:
    down_s: float
    restart_to_answer_s: float
    """From starting the broker's process to its first answered metadata request (JVM start)."""
    answer_to_first_accepted_s: float
    answer_to_first_completed_s: float
    kill_to_first_accepted_s: float
    kill_to_first_completed_s: float


def restart_round(stack: LocalStack, load: Load, down_s: float, timeout_s: float) -> Round:
    kill_9(stack.broker.process)
    killed = time.monotonic()
    time.sleep(down_s)
    starting = time.monotonic()
    stack.broker.start()
    answered = time.monotonic()
    accepted, completed = load.wait_first_after(killed, timeout_s)
    return Round(
        down_s=down_s,
        restart_to_answer_s=round(answered - starting, 3),
        answer_to_first_accepted_s=round(accepted - answered, 3),
        answer_to_first_completed_s=round(completed - answered, 3),
        kill_to_first_accepted_s=round(accepted - killed, 3),
        kill_to_first_completed_s=round(completed - killed, 3),
    )


def run(rounds: int, *, down_s: float, every_s: float, settle_s: float) -> list[Round]:
    from dispatch.auth import ensure_dev_keys

    results: list[Round] = []
    with scratch_stack("dispatch-restart-", streaming=False) as stack:
        keys = ensure_dev_keys(stack.settings.auth)
        with Load([node.url for node in stack.nodes], keys, every_s) as load:
            started = time.monotonic()
            load.wait_first_after(started, 60)  # the stack serves
            time.sleep(settle_s)
            for number in range(rounds):
                result = restart_round(stack, load, down_s, timeout_s=120)
                # Progress on stderr: stdout is the summary alone (JSON with --json).
                print(f"round {number + 1}: {json.dumps(asdict(result))}", file=sys.stderr)
                results.append(result)
                time.sleep(settle_s)
    return results


@unwinds_on_sigterm
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.restart_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--down", type=float, default=3.0, help="seconds the broker stays dead")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between submissions")
    parser.add_argument("--settle", type=float, default=3.0, help="load between rounds (s)")
    parser.add_argument(
        "--json", action="store_true", help="print only the summary, as JSON on stdout"
    )
    parser.add_argument("--out", type=Path, help="also write the summary as JSON to this file")
    args = parser.parse_args(argv)
    results = run(args.rounds, down_s=args.down, every_s=args.every, settle_s=args.settle)
    summary = {
        "rounds": [asdict(r) for r in results],
        "max_answer_to_first_accepted_s": max(r.answer_to_first_accepted_s for r in results),
        "max_answer_to_first_completed_s": max(r.answer_to_first_completed_s for r in results),
        "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"{len(results)} rounds: the first submission accepted at most "
            f"{summary['max_answer_to_first_accepted_s']:.2f} s, the first job completed at "
            f"most {summary['max_answer_to_first_completed_s']:.2f} s after the broker answered"
        )
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
