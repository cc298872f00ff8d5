"""`POST /v1/jobs` without FastAPI's per-request machinery, for the request that passes.

A single-job submission is the request clients send most, and FastAPI's layers around the
route (dependency solving, the body's field-by-field validation through its own adapters, the
response model's serialisation, the exception middleware) cost the node several times the
route's own work (a py-spy profile of 64 concurrent clients: BENCHMARKS.md, *The submit path*).

This middleware answers the common case itself: a known client key, a JSON body that
validates, then the route's own `accept` (the same dedup check, the same Kafka write, the same
answers). Anything else (no key or a wrong one, a body that does not validate, another method
or path) goes on to FastAPI untouched, with the body it read replayed, so every refusal keeps
the one format and wording the routes give (`api/errors.py`). Nothing has been written to
Kafka when it hands a request on: the hand-off happens only before `accept`. What `accept`
refuses (409, 422, 503) is answered here through the same `dispatch.api.errors.answer_for`.
"""

from __future__ import annotations

import json

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatch.api.deps import bearer_principal
from dispatch.api.errors import ApiError, answer_for
from dispatch.api.node import Node
from dispatch.api.routes.jobs import accept, generated_ids, to_request
from dispatch.api.schemas import JobSubmission
from dispatch.auth import KeyRing, Principal, Role

PATH = "/v1/jobs"


class SubmitFastPath:
    def __init__(self, app: ASGIApp, node: Node, keyring: KeyRing) -> None:
        self.app = app
        self.node = node
        self.keyring = keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of a repeated header, as Starlette's
        principal = self._principal(headers)
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip()
        if principal is None or content_type != b"application/json" or scope["query_string"]:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client went away mid-body: nobody to answer

        try:
            submission = JobSubmission.model_validate(json.loads(body))
            request = to_request(submission, principal)
        except (ValueError, RecursionError, ValidationError, ApiError):
            # json's and pydantic's errors are ValueErrors, and json raises RecursionError for
            # a body nested too deep to parse: the route words the refusal.
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            generated = generated_ids([submission], [request])
            [accepted] = await accept(self.node, [request], principal, generated)
        except Exception as error:
            response = answer_for(error, scope)
            if response is None:
                raise
            await response(scope, receive, send)
            return
        answer = accepted.model_dump_json(exclude_none=True).encode()  # as the route's
        await send(
            {
                "type": "http.response.start",
                "status": 200 if accepted.existing else 202,
                "headers": [
                    (b"content-length", str(len(answer)).encode()),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    def _principal(self, headers: dict[bytes, bytes]) -> Principal | None:
        """The caller if the route's dependencies would admit it (else the route refuses)."""
        authorization = headers.get(b"authorization")
        try:
            # Starlette decodes header values as latin-1 too.
            principal = bearer_principal(
                self.keyring, None if authorization is None else authorization.decode("latin-1")
            )
        except ApiError:
            return None
        return principal if principal.can(Role.CLIENT) else None


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body already read, then what the client sends next."""
    replayed = False

    async def receive_again() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again
