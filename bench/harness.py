"""The stack a fault benchmark runs against and the faults it injects, written once for the
broker restart, failover, broker kill and chaos benchmarks (`bench/restart_bench.py`,
`bench/failover_bench.py`, `bench/broker_kill_bench.py`, `bench/chaos.py`).

Each of them had its own copy of these steps, and the copies had begun to differ in what
matters under a fault: one waited for a killed process to be reaped, another only for it to
leave /proc; one looked for the leader for 60 s, another for up to 120 s. Here:

- the settings of a stack in a scratch folder on free ports (`stack_settings`,
  `cluster_profile_settings`), with the per-client cap raised so that a kill measures the
  failover, not the cap;
- `running_stack` and `scratch_stack`: up, and down whatever happens;
- `kill_9`: SIGKILL one process of the stack by the pid its pid file records (the process
  this benchmark started, never one found by name), and wait until it is reaped;
- `find_leader`, `wait_ready`, `restart_node`: the API nodes across a failover;
- `poll_until`: every "wait until X, at most N s" of these benchmarks.

The load they put on the stack, and how its outcome is judged, are in
`dispatch.bench.harness_load`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dispatch.settings import Settings, load_settings
from dispatch.stack.local import ApiNode, LocalStack
from dispatch.stack.plan import StackPlan
from dispatch.stack.ports import free_port, free_port_run
from dispatch.stack.process import ManagedProcess, ProcessRecord

T = TypeVar("T")

READY_POLL_S = 0.02
"""How often `/readyz` (and whatever else a round times) is asked: the figures are in tens of
milliseconds at best, so a coarser poll would be most of what they measure."""
REAP_TIMEOUT_S = 15.0
"""How long `kill_9` waits for a killed process to be reaped (a JVM takes a few seconds to
leave after SIGKILL on a loaded machine)."""


# --- waiting -------------------------------------------------------------------------------------


def poll_until(
    what: str, probe: Callable[[], T | None], timeout_s: float, poll_s: float = READY_POLL_S
) -> T:
    """`probe()` every `poll_s` until it returns something other than None, and return that;
    RuntimeError("no {what} within ...") after `timeout_s`. A round's figure is the time the
    probe first saw its event, so the poll is short (`READY_POLL_S`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(poll_s)


# --- the stack's settings ------------------------------------------------------------------------


def distinct_free_ports(count: int) -> list[int]:
    """`count` free ports, no two the same (each probe frees its port again at once, so two
    probes could otherwise draw the same one)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
        time.sleep(0.001)
    return ports


_NO_CAP = {"default_cap": 1_000_000}
"""After a kill, jobs the dead leader (or a failed commit) left assigned count as in flight
until their deadline; the one client of a benchmark's load would hit the default cap of 100
and measure the cap, not the fault (`dispatch bench` raises it too)."""


def stack_settings(scratch: Path, *, brokers: int = 1) -> Settings:
    """`dispatch up`'s stack under `scratch` (its `var` and warehouse) on free ports:
    `brokers` Kafka nodes (a cluster of more than one with a longer start timeout: three
    JVMs start on two cores) and two API nodes, with no per-client cap."""
    if brokers == 1:
        bootstrap, controller, *api_ports = distinct_free_ports(4)
        kafka: dict[str, Any] = {
            "bootstrap": f"127.0.0.1:{bootstrap}",
            "controller_port": controller,
        }
    else:
        first = free_port_run(2 * brokers)  # a cluster's ports are derived from the first
        api_ports = distinct_free_ports(2)
        kafka = {
            "brokers": brokers,
            "bootstrap": f"127.0.0.1:{first}",
            "controller_port": first + 1,
            "start_timeout_s": 180.0,
        }
    return load_settings(
        paths={"var": str(scratch / "var"), "warehouse": str(scratch / "delta")},
        kafka=kafka,
        api={"ports": api_ports},
        dispatcher=_NO_CAP,
    )


def cluster_profile_settings(scratch: Path, spark_workers: int = 1) -> Settings:
    """The `cluster` profile (conf/profiles/cluster.toml: 3 brokers, the object store, a Spark
    cluster, 3 API nodes) on free ports under `scratch`, with `spark_workers` workers (one
    by default: a second costs a core this machine does not have), with no per-client cap."""
    first_broker = free_port_run(6)
    store, master, *api_ports = distinct_free_ports(5)
    return load_settings(
        "cluster",
        paths={"var": str(scratch / "var")},
        kafka={
            "bootstrap": f"127.0.0.1:{first_broker}",
            "controller_port": first_broker + 1,
            "start_timeout_s": 180.0,
        },
        storage={"endpoint_url": f"http://127.0.0.1:{store}"},
        spark={"master": f"spark://127.0.0.1:{master}", "cluster_workers": spark_workers},
        api={"ports": api_ports},
        dispatcher=_NO_CAP,
    )


# --- the stack -----------------------------------------------------------------------------------


@contextlib.contextmanager
def running_stack(
    settings: Settings, *, streaming: bool = True, quick_down: bool = False
) -> Iterator[LocalStack]:
    """`up` (the brokers, topics, the streaming fold unless not `streaming`, the nodes; no
    workers: the benchmark brings its own); `down` whatever happens, each process stopped by
    the pid its pid file records.

    `quick_down`: the fold and, once the nodes stopped, the brokers are killed before `down`.
    The fold's orderly stop finishes the batch in hand and rolls up the statistics, the
    brokers' is a controlled shutdown: both for data the run is done with."""
    stack = LocalStack(settings, StackPlan(streaming=streaming, workers=0))
    try:
        stack.up()
        yield stack
    finally:
        try:
            if quick_down:
                kill_9_if_running(stack.streaming, group=True)
                for node in stack.nodes:  # stopped as `down` does, while the brokers answer
                    node.process.stop(timeout_s=20.0)
                for broker in stack.kafka.nodes:  # none when the brokers are external
                    kill_9_if_running(broker.process)
        finally:
            stack.down()  # everything else, and whatever the above left running


@contextlib.contextmanager
def scratch_stack(prefix: str, *, streaming: bool, brokers: int = 1) -> Iterator[LocalStack]:
    """`running_stack` of `stack_settings` in a temporary folder named `prefix`..., removed
    after `down` (`stack.settings` are the settings)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        settings = stack_settings(Path(scratch), brokers=brokers)
        with running_stack(settings, streaming=streaming) as stack:
            yield stack


# --- faults --------------------------------------------------------------------------------------


def kill_9(
    process: ManagedProcess, *, group: bool = False, timeout_s: float = REAP_TIMEOUT_S
) -> ProcessRecord:
    """SIGKILL `process` by the pid its pid file records (its whole process group if `group`:
    the fold's driver and its JVM) and wait until it is reaped; returns the record killed.
    RuntimeError when it is not running: a fault that found nothing to kill is no fault.

    Reaped, not only gone from /proc (a process killed -9 can leave /proc before it is a
    zombie): `process` must be the object that started it, so that the next `start` does
    not replace a child still exiting, and no child is left unwaited for (a warning, "still
    running", at its collection)."""
    record = running_record(process)
    _kill_and_reap(process, record, group, timeout_s)
    return record


def running_record(process: ManagedProcess) -> ProcessRecord:
    """The pid record of `process`, which a fault is about to hit (named in its report
    before the kill); RuntimeError when it is not running."""
    record = process.record()
    if record is None:
        raise RuntimeError(f"{process.name} is not running")
    return record


def kill_9_if_running(process: ManagedProcess, *, group: bool = False) -> None:
    """`kill_9`, for a teardown: nothing when the process is not running."""
    record = process.record()
    if record is not None:
        _kill_and_reap(process, record, group, REAP_TIMEOUT_S)


def _kill_and_reap(
    process: ManagedProcess, record: ProcessRecord, group: bool, timeout_s: float
) -> None:
    with contextlib.suppress(ProcessLookupError):  # it died on its own meanwhile
        if group:
            os.killpg(record.pid, signal.SIGKILL)
        else:
            os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while process.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.01)


# --- the API nodes -------------------------------------------------------------------------------


def readiness(http: httpx.Client, node: ApiNode) -> tuple[int, dict[str, Any]] | None:
    """`/readyz` of `node`: its status (200 on the leader) and body (the leader's epoch);
    None when the node does not answer."""
    try:
        answer = http.get(f"{node.url}/readyz", timeout=1.0)
    except httpx.TransportError:
        return None
    return answer.status_code, answer.json()


def _ready_epoch(http: httpx.Client, node: ApiNode) -> int | None:
    seen = readiness(http, node)
    return int(seen[1]["epoch"]) if seen is not None and seen[0] == 200 else None


def find_leader(
    http: httpx.Client, nodes: Sequence[ApiNode], timeout_s: float = 60.0
) -> tuple[ApiNode, int]:
    """The node whose `/readyz` answers 200, and its epoch (asked every 100 ms, for up to
    `timeout_s`)."""

    def leader() -> tuple[ApiNode, int] | None:
        for node in nodes:
            epoch = _ready_epoch(http, node)
            if epoch is not None:
                return node, epoch
        return None

    return poll_until("ready leader", leader, timeout_s, poll_s=0.1)


def wait_ready(http: httpx.Client, node: ApiNode, timeout_s: float) -> tuple[float, int]:
    """Poll `node`'s `/readyz` every 20 ms until 200: (time.monotonic() then, its epoch)."""

    def ready() -> tuple[float, int] | None:
        epoch = _ready_epoch(http, node)
        return None if epoch is None else (time.monotonic(), epoch)

    return poll_until(f"ready leader at {node.url}", ready, timeout_s)


def restart_node(node: ApiNode, timeout_s: float = 90.0) -> float:
    """Start a killed node again (it becomes the standby); returns the seconds until its
    `/healthz` answered. RuntimeError, with its log's tail, when it exits meanwhile."""
    started = time.monotonic()
    node.start()
    while not node.answers("/healthz"):
        if node.process.record() is None:
            raise RuntimeError(f"{node.url} exited on restart:\n{node.process.log_tail()}")
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{node.url} did not answer /healthz in {timeout_s:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - started
