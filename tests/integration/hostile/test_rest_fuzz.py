"""Property-based fuzzing of the REST API from its own OpenAPI document (schemathesis), against a
leader with each role's key and against a follower (a node without the lease).

Every case must answer below 500; the answer must be what the document says (status code,
content type, body schema); and neither node may write a traceback. Findings are collected
over all cases (no shrinking: the count and a few examples of each kind say more) and written
to `rest-fuzz-findings.json` in the stack's folder.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.hostile.conftest import HostileStack

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 10
"""Per operation, generation mode and key: 17 operations x 2 modes x 10, with 3 keys on the
leader and one on the follower: about 1,200 cases (an operation without parameters has no
negative case)."""
LONG_POLL_CAP_S = 0.3
"""Generated long-poll waits are cut to this, so a valid `wait_s: 60` does not take a minute."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass
class Findings:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    mismatches: Counter[str] = field(default_factory=Counter)
    mismatch_examples: dict[str, str] = field(default_factory=dict)
    transport_errors: list[str] = field(default_factory=list)
    invalid_operations: list[str] = field(default_factory=list)
    not_generated: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "statuses": dict(sorted(self.statuses.items())),
            "server_errors": self.server_errors[:30],
            "server_error_count": len(self.server_errors),
            "mismatches": dict(self.mismatches.most_common()),
            "mismatch_examples": self.mismatch_examples,
            "transport_errors": self.transport_errors[:10],
            "invalid_operations": self.invalid_operations,
            "not_generated": self.not_generated,
        }


def _cap_long_polls(case: Any) -> None:
    body = case.body
    if isinstance(body, dict) and _is_number(body.get("wait_s")) and body["wait_s"] > 0:
        body["wait_s"] = min(body["wait_s"], LONG_POLL_CAP_S)
    query = case.query
    if isinstance(query, dict) and _is_number(query.get("wait")) and query["wait"] > 0:
        query["wait"] = min(query["wait"], LONG_POLL_CAP_S)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _request_text(case: Any, response: requests.Response | None = None) -> str:
    request = response.request if response is not None else None
    body = request.body if request is not None else case.body
    if isinstance(body, bytes):
        body = body[:300].decode(errors="replace")
    elif body is not None and not isinstance(body, str):
        body = json.dumps(body, default=str)[:300]
    url = request.url if request is not None else case.formatted_path
    method = request.method if request is not None else case.method
    return f"{method} {url} body={str(body)[:300]!r}"


FOLLOWER_503 = frozenset({"GET /readyz"})
"""A follower's readiness is 503 by design (it names the leader)."""


def fuzz(
    stack: HostileStack,
    base_url: str,
    schema_url: str,
    role: str | None,
    findings: Findings,
    unavailable_by_design: frozenset[str] = frozenset(),
) -> None:
    schema = schemathesis.openapi.from_url(schema_url)
    headers = stack.headers(role) if role is not None else {}
    session = requests.Session()
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            findings.invalid_operations.append(str(result.err())[:300])
            continue
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_operation(
                operation, mode, base_url, headers, session, findings,
                operation.label in unavailable_by_design,
            )  # fmt: skip


def _fuzz_operation(
    operation: Any, mode: GenerationMode, base_url: str, headers: dict[str, str],
    session: requests.Session, findings: Findings, unavailable_by_design: bool,
) -> None:  # fmt: skip
    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        _cap_long_polls(case)
        findings.cases += 1
        try:
            response = case.call(
                base_url=base_url, session=session, headers=headers, timeout=30,
                allow_redirects=False,
            )  # fmt: skip
        except requests.RequestException as error:
            findings.transport_errors.append(f"{_request_text(case)}: {error!r}"[:400])
            return
        findings.statuses[response.status_code] += 1
        if response.status_code == 503 and unavailable_by_design:
            return
        if response.status_code >= 500:
            findings.server_errors.append(
                f"{response.status_code} {_request_text(case, response)} -> {response.text[:200]}"
            )
        try:
            case.validate_response(response, checks=CHECKS)
        except BaseExceptionGroup as group:
            for failure in group.exceptions:
                title = getattr(failure, "title", type(failure).__name__)
                kind = f"{operation.label} [{response.status_code}]: {title}"
                findings.mismatches[kind] += 1
                findings.mismatch_examples.setdefault(
                    kind,
                    f"{_request_text(case, response)} -> {response.text[:200]} "
                    f"({str(getattr(failure, 'message', failure))[:300]})",
                )
        except AssertionError as failure:
            kind = f"{operation.label} [{response.status_code}]: {type(failure).__name__}"
            findings.mismatches[kind] += 1
            findings.mismatch_examples.setdefault(kind, str(failure)[:400])

    started = time.monotonic()
    before = findings.cases
    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        # Nothing to generate in this mode (e.g. a negative case of an operation without
        # parameters or body).
        findings.not_generated.append(f"{operation.label} {mode.value}")
    print(
        f"{operation.label} {mode.value}: {findings.cases - before} cases in "
        f"{time.monotonic() - started:.1f} s",
        flush=True,
    )


def _report(stack: HostileStack, name: str, findings: dict[str, Findings]) -> str:
    document = {target: found.summary() for target, found in findings.items()}
    path = stack.folder / f"{name}.json"
    path.write_text(json.dumps(document, indent=1))
    print(f"\n{name}: {path}\n{json.dumps(document, indent=1)[:6000]}")
    return str(path)


def _verdict(stack: HostileStack, findings: dict[str, Findings], report: str) -> None:
    cases = sum(found.cases for found in findings.values())
    errors = [error for found in findings.values() for error in found.server_errors]
    mismatches = {
        f"{target}: {kind}": count
        for target, found in findings.items()
        for kind, count in found.mismatches.items()
    }
    tracebacks = stack.tracebacks()
    problems = []
    if errors:
        problems.append(f"{len(errors)} answers >= 500, e.g. {errors[:3]}")
    if tracebacks:
        problems.append(f"{len(tracebacks)} tracebacks in the nodes' logs, e.g. {tracebacks[:3]}")
    if mismatches:
        problems.append(f"{sum(mismatches.values())} answers not as documented: {mismatches}")
    assert not problems, f"{cases} cases (details in {report}):\n" + "\n".join(problems)


@pytest.mark.timeout(900)
def test_the_rest_api_survives_its_own_openapi_document(hostile_stack: HostileStack) -> None:
    stack = hostile_stack
    epoch = stack.epoch()
    findings: dict[str, Findings] = {}
    for role in ("client", "worker", "admin"):
        found = findings[f"leader as {role}"] = Findings()
        fuzz(stack, stack.leader.url, f"{stack.leader.url}/openapi.json", role, found)
    follower = findings["follower as client"] = Findings()
    schema = f"{stack.follower.url}/openapi.json"
    fuzz(stack, stack.follower.url, schema, "client", follower, FOLLOWER_503)
    report = _report(stack, "rest-fuzz-findings", findings)
    assert sum(found.cases for found in findings.values()) >= 1000
    # The leader kept its term and still dispatches.
    assert stack.epoch() == epoch
    stack.round_trip()
    _verdict(stack, findings, report)
