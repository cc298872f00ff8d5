"""The `dispatch.submit` record format, and the rejection records of `dispatch.submit.rejected`.

Any Kafka producer may submit (README: key = job id, value = a JSON object). The leader parses
each record here; one that does not parse or validate is never dropped: it becomes a rejection
record carrying the reason and the original bytes, so nothing accepted by Kafka is silent.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from dispatch import fast_json
from dispatch.core.bounds import MAX_JSON_DEPTH
from dispatch.core.commands import SubmitRequest

KAFKA_CLIENT_ID = "kafka"
"""The client id of a record that names none: the tenant of raw Kafka producers."""


class SubmissionError(ValueError):
    """A submit record that cannot be accepted; the message names the bad field."""


ENVELOPE_BYTES = 64 * 1024
"""Room for the fields around the payload when a record's size is checked."""

MAX_KEPT_BYTES = 1024 * 1024
"""A rejection keeps at most this much of the original value: it must fit its own topic."""


def parse_submit_record(
    key: bytes | None,
    value: bytes | None,
    *,
    max_payload_bytes: int,
    default_client_id: str = KAFKA_CLIENT_ID,
) -> SubmitRequest:
    """The validated submission in one `dispatch.submit` record, or SubmissionError.

    A record over `max_payload_bytes` (plus an envelope) is refused here: accepted, it would
    make an `enqueued` event too large for the events log, and stall the leader on it."""
    if value is None:
        raise SubmissionError("value: missing (a tombstone is not a submission)")
    if len(value) > max_payload_bytes + ENVELOPE_BYTES:
        raise SubmissionError(
            f"value: {len(value)} bytes, over the limit of {max_payload_bytes + ENVELOPE_BYTES}"
        )
    try:
        # Decoded here, not by json.loads: it would guess UTF-16/32 from a byte-order mark.
        text = value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SubmissionError(f"value: not UTF-8 ({error.reason})") from None
    try:
        # NaN and Infinity parse (json's default) so that the field checks below refuse them
        # naming the field (`payload.x: NaN is not JSON`); nothing past them ever sees one.
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise SubmissionError(f"value: not JSON ({error.msg} at char {error.pos})") from None
    except RecursionError:
        # The parser recurses per level: a deep enough value must be a rejection, not a
        # crash of the leader's loop (the record would come back after every restart).
        raise SubmissionError(
            f"value: nested too deep to parse (a payload may nest {MAX_JSON_DEPTH} levels)"
        ) from None
    except ValueError as error:
        # An integer literal of more than 4,300 digits (sys.get_int_max_str_digits).
        raise SubmissionError(f"value: not JSON ({error})") from None
    if not isinstance(document, dict):
        raise SubmissionError(f"value: expected a JSON object, got {type(document).__name__}")
    try:
        submission = SubmitRequest.from_dict(document, default_client_id=default_client_id)
    except ValueError as error:
        raise SubmissionError(str(error)) from None
    if key is not None and key != submission.id.encode():
        # The key picks the partition: a mismatch would break per-job ordering silently.
        shown = key if len(key) <= 64 else key[:64] + b"..."
        raise SubmissionError(f"key: {shown!r} differs from the job id {submission.id!r}")
    return submission


def submit_record_value(submission: SubmitRequest) -> bytes:
    """The record value the REST path writes for a submission (key: the job id)."""
    return fast_json.dumps(submission.to_dict())


@dataclass(frozen=True, slots=True)
class Rejection:
    """A submit record that was refused, with where it came from and why."""

    reason: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    at: float

    def to_record_value(self) -> bytes:
        document: dict[str, Any] = {
            "reason": self.reason,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "at": self.at,
            # The original bytes, base64, since a bad record need not be text.
            "key_b64": _b64(self.key),
            "value_b64": _b64(self.value[:MAX_KEPT_BYTES] if self.value else self.value),
            "value_bytes": None if self.value is None else len(self.value),
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_record_value(cls, raw: bytes) -> Rejection:
        document = json.loads(raw)
        return cls(
            reason=str(document["reason"]),
            topic=str(document["topic"]),
            partition=int(document["partition"]),
            offset=int(document["offset"]),
            key=_unb64(document.get("key_b64")),
            # Truncated to MAX_KEPT_BYTES when the original was larger (see value_bytes).
            value=_unb64(document.get("value_b64")),
            at=float(document["at"]),
        )


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
