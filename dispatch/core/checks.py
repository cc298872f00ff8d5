"""Whole-state views and consistency checks, for tests, debugging and rebuild verification.

These walk every job (O(n)): never call them on a hot path.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import PauseScope
from dispatch.core.job import JobStatus, check_record
from dispatch.core.limits import LimitScope
from dispatch.core.state import DispatcherState
from dispatch.core.subjects import compile_pattern, match_tokens
from dispatch.core.workers import pick_worker

Checked = Dispatcher | DispatcherState
"""What the checks take: a dispatcher, or a bare state (a replica folding with `apply`)."""


def _state_of(checked: Checked) -> DispatcherState:
    return checked.state if isinstance(checked, Dispatcher) else checked


def state_view(checked: Checked) -> dict[str, Any]:
    """The logical state as plain data. Two dispatchers that folded the same events have equal
    views (whether they decided the events or replayed them).

    Left out on purpose: the clock, and which delayed jobs were already released (both
    follow from the time of the last tick), and the round-robin cursors (which exec queue and
    which client is served next), which steer future choices but are not facts.
    """
    state = _state_of(checked)
    return {
        "epoch": state.fence.epoch,
        "assign_seq": state._assign_seq,
        "next_seq": state._next_seq,
        "front_seq": state._front_seq,
        "jobs": {job_id: state._jobs[job_id].to_dict() for job_id in sorted(state._jobs)},
        "workers": {
            worker_id: {
                **state._workers[worker_id].record().to_dict(),
                "running": sorted(state._workers[worker_id].running),
            }
            for worker_id in sorted(state._workers)
        },
        "inflight": {
            client_id: client.inflight
            for client_id, client in sorted(state._clients.items())
            if client.inflight
        },
        "dead_letters": list(state._dead),
        "pauses": {
            f"{scope.value}:{target}": paused.to_dict()
            for (scope, target), paused in sorted(state._pauses.items())
        },
        "limits": {
            f"{scope.value}:{target}": event.to_dict()
            for (scope, target), event in sorted(state._limits.items())
        },
    }


def check_invariants(checked: Checked) -> None:
    """Raise AssertionError at the first inconsistency between records and indexes."""
    state = _state_of(checked)
    jobs = state._jobs
    by_status: Counter[JobStatus] = Counter()
    inflight: Counter[str] = Counter()
    running_per_queue: Counter[str] = Counter()
    for job in jobs.values():
        check_record(job)
        by_status[job.status] += 1
        if job.status is JobStatus.RUNNING:
            worker = state._workers.get(job.worker_id or "")
            assert worker is not None, f"{job.id}: runs on unknown worker {job.worker_id}"
            assert worker.running.get(job.id) is job, f"{job.id}: not in its worker's jobs"
            inflight[job.client_id] += 1
            running_per_queue[job.exec] += 1
            assert (job.run_limit_at is None) == (job.max_run_s is None), (
                f"{job.id}: run_limit_at is set exactly when the job has a max_run_s"
            )
    for status in JobStatus:
        assert state._counts[status.value] == by_status[status], f"count of {status} is off"
    _check_queues(state, running_per_queue)
    _check_workers_and_clients(state, inflight)


def _check_queues(state: DispatcherState, running_per_queue: Counter[str]) -> None:
    """Every queued job sits in exactly one place: the delay heap or one lane."""
    jobs = state._jobs
    delayed = [job for job in state._delays.jobs() if jobs.get(job.id) is job]
    delayed_ids = [job.id for job in delayed]
    assert len(set(delayed_ids)) == len(delayed_ids), "a job is twice in the delay heap"
    for job in delayed:
        assert state._is_delayed(job), f"{job.id}: in the delay heap but due"
    laned: list[str] = []
    for exec_name, queue in state._queues.items():
        assert queue.exec == exec_name
        ready = 0
        for priority, level in queue.levels.items():
            assert level.queue is queue and level.priority == priority
            for client_id, lane in level.lanes.items():
                assert not lane.dead and lane.client.client_id == client_id
                ordered = lane.ordered()
                assert len(ordered) == lane.live, f"{exec_name}/{client_id}: live count off"
                entries = len(lane.jobs) + len(lane.late)
                assert entries == lane.live + lane.stale, f"{exec_name}/{client_id}: stale off"
                for job in ordered:
                    assert job.exec == exec_name and job.priority == priority
                    assert job.client_id == client_id
                    assert not state._is_delayed(job), f"{job.id}: in a lane before its time"
                laned.extend(job.id for job in ordered)
                ready += len(ordered)
                if lane.live and not lane.parked:
                    assert lane.in_rotation, f"{exec_name}/{client_id}: lane out of rotation"
                in_rotation = sum(1 for other in level.rotation if other is lane)
                assert in_rotation == int(lane.in_rotation), f"{exec_name}/{client_id}: rotation"
                assert lane.parked == (lane in lane.client.parked)
                assert not (lane.parked and lane.in_rotation)
            assert level.live == sum(lane.live for lane in level.lanes.values())
        assert queue.ready == ready, f"{exec_name}: ready count off"
        assert queue.delayed == sum(1 for job in delayed if job.exec == exec_name)
        assert queue.running == running_per_queue[exec_name], f"{exec_name}: running count off"
        assert sorted(-p for p in queue.levels) == queue.priorities
        assert sum(1 for other in state._rotation if other is queue) == int(queue.in_rotation)
    assert len(set(laned)) == len(laned), "a job is in two lanes"
    held: list[str] = []
    limited: Counter[str] = Counter()
    for key, gate in state._keys.items():
        assert gate.key == key
        for job_id, job in gate.held_jobs.items():
            assert jobs.get(job_id) is job and job.status is JobStatus.QUEUED, job_id
            assert job.key == key and not state._is_delayed(job), job_id
            held.append(job_id)
            limited[job.exec] += 1
    for exec_name, queue in state._queues.items():
        assert queue.limited == limited[exec_name], f"{exec_name}: limited count off"
    queued = {job.id for job in jobs.values() if job.status is JobStatus.QUEUED}
    assert set(laned) | set(delayed_ids) | set(held) == queued, "queued jobs and queues disagree"
    assert len(laned) + len(delayed_ids) + len(held) == len(queued), "a job is in two places"
    assert state._delayed == len(delayed)
    expiring = {
        entry[2].id
        for entry in state._job_expiry.heap
        if entry[2].status is JobStatus.QUEUED and entry[2].expires_at == entry[0]
    }
    for job_id in queued:
        if jobs[job_id].expires_at is not None:
            assert job_id in expiring, f"{job_id}: queued with an expiry the core would miss"


def _check_workers_and_clients(state: DispatcherState, inflight: Counter[str]) -> None:
    jobs = state._jobs
    for worker_id, worker in state._workers.items():
        assert worker.worker_id == worker_id
        assert worker.credit >= 0, f"{worker_id}: negative credit"
        for job_id, job in worker.running.items():
            assert jobs.get(job_id) is job and job.status is JobStatus.RUNNING
            assert job.worker_id == worker_id
    for client_id, client in state._clients.items():
        assert client.inflight == inflight[client_id], f"{client_id}: in-flight count off"
    _check_pauses(state)
    _check_limits(state)
    assert {job.id for job in jobs.values() if job.status is JobStatus.DEAD} == set(state._dead)
    live_deadlines = {
        entry[2].id
        for entry in state._deadlines.heap
        if entry[2].status is JobStatus.RUNNING and entry[2].deadline == entry[0]
    }
    running = {job.id for job in jobs.values() if job.status is JobStatus.RUNNING}
    assert live_deadlines == running, "a running job has no deadline entry"


def _check_pauses(state: DispatcherState) -> None:
    """Queues and clients are paused exactly when a pause in force names them."""
    exec_patterns = {
        target: compile_pattern(target)
        for scope, target in state._pauses
        if scope is PauseScope.EXEC
    }
    assert state._paused_execs == exec_patterns, "exec pauses and their patterns disagree"
    for (scope, target), paused in state._pauses.items():
        assert (paused.scope, paused.target) == (scope, target)
    for exec_name, queue in state._queues.items():
        held = any(match_tokens(pattern, queue.tokens) for pattern in exec_patterns.values())
        assert queue.paused == held, f"{exec_name}: paused is {queue.paused}, pauses say {held}"
    for client_id, client in state._clients.items():
        held = (PauseScope.CLIENT, client_id) in state._pauses
        assert client.paused == held, f"{client_id}: paused is {client.paused}, pauses say {held}"
        assert client.room == (0 if held else client.cap), f"{client_id}: room off"


def _check_limits(state: DispatcherState) -> None:
    """Each client, exec queue and key is limited exactly by the limits in force, and the
    running counts of exec limits and keys match the running jobs."""
    for (scope, target), event in state._limits.items():
        assert (event.scope, event.target) == (scope, target)
    for client_id, client in state._clients.items():
        limit = state._limit_of(LimitScope.CLIENT, client_id)
        cap = None if limit is None else limit.max_inflight
        expected = state.config.cap_for(client_id) if cap is None else cap
        assert client.cap == expected, f"{client_id}: cap {client.cap}, limits say {expected}"
        has_rate = limit is not None and limit.rate is not None
        assert (client.bucket is not None) == has_rate, f"{client_id}: rate bucket off"
    patterns = {
        target
        for scope_name, targets in state.config.limits.items()
        if scope_name == LimitScope.EXEC.value
        for target in targets
    } | {target for scope, target in state._limits if scope is LimitScope.EXEC}
    assert set(state._exec_gates) == patterns, "exec limits and their gates disagree"
    running: Counter[str] = Counter()
    running_keys: Counter[str] = Counter()
    for job in state._jobs.values():
        if job.status is JobStatus.RUNNING:
            running[job.exec] += 1
            if job.key is not None:
                running_keys[job.key] += 1
    for exec_name, queue in state._queues.items():
        matching = [
            gate for gate in state._exec_gates.values() if match_tokens(gate.pattern, queue.tokens)
        ]
        assert sorted(map(id, queue.gates)) == sorted(map(id, matching)), f"{exec_name}: gates"
    for target, gate in state._exec_gates.items():
        counted = sum(running[q.exec] for q in state._queues.values() if gate in q.gates)
        assert gate.inflight == counted, f"exec limit {target}: running count off"
    for key, count in running_keys.items():
        key_gate = state._keys.get(key)
        assert key_gate is not None and key_gate.inflight == count, f"key {key}: count off"
    for key, key_gate in state._keys.items():
        assert key_gate.inflight == running_keys[key], f"key {key}: running count off"
        assert key_gate.limit is state._key_limits.for_key(key), f"key {key}: limit off"


def check_work_conserving(checked: Checked) -> None:
    """After an assignment pass: no ready job of a client under its cap (and not paused) is
    left waiting in a queue that is not paused while a matching worker has credit."""
    state = _state_of(checked)
    now = state._clock
    for queue in state._queues.values():
        if queue.paused or not all(gate.admits(now) for gate in queue.gates):
            continue
        workers = [w for w in state._workers.values() if w.matches(queue.subject)]
        if pick_worker(workers) is None:
            continue
        for lane in queue.lanes():
            client = lane.client
            blocked = client.bucket is not None and not client.bucket.admits(now)
            assert client.inflight >= client.room or blocked, (
                f"{queue.exec}: client {client.client_id} waits under its cap "
                "while a matching worker has credit"
            )
        for gate in state._keys.values():
            if not gate.admits(now):
                continue
            for job in gate.held_jobs.values():
                if job.exec != queue.exec:
                    continue
                client = state._clients[job.client_id]
                blocked = client.bucket is not None and not client.bucket.admits(now)
                assert client.inflight >= client.room or blocked, (
                    f"{job.id}: held by key {gate.key}, which has room, while a matching "
                    "worker has credit"
                )


def check_caps(checked: Checked) -> None:
    """No client runs more jobs than its cap."""
    state = _state_of(checked)
    for client_id, client in state._clients.items():
        assert client.inflight <= client.cap, f"{client_id}: {client.inflight} > cap {client.cap}"
