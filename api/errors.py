"""Every error is JSON `{"error": code, "detail": text}` with the right status; never a 500
for bad input. Validation errors name the field (`body.exec: Field required`)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatch.api.leader import LeaderUnavailable
from dispatch.api.submit_producer import SubmitUnavailable
from dispatch.core.errors import Rejected

log = logging.getLogger(__name__)

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 409: "conflict", 413: "too_large", 422: "invalid",
          503: "unavailable"}  # fmt: skip


def error_response(status: int, error: str, detail: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail, **extra}, status_code=status)


class ApiError(Exception):
    def __init__(self, status: int, detail: str, error: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.error = error or _CODES.get(status, "error")


_URL_SAFE = "/%:@!$&'()*+,;=-._~?"
"""What may stay as it is in a URL's path or query: RFC 3986's unreserved and reserved
characters, and `%` (what the client already percent-encoded stays encoded)."""


def target_of(scope: Scope) -> str:
    """The request's path and query as the client sent them, percent-encoded: always ASCII,
    never a CR or LF. Built from the raw bytes, not the decoded path, which may hold any
    character (`é` cannot be sent in a header; a decoded `%0d%0a` would end it)."""
    raw_path = scope.get("raw_path")
    if not isinstance(raw_path, bytes):
        raw_path = scope["path"].encode("utf-8")
    target = quote(raw_path, safe=_URL_SAFE)
    query = scope.get("query_string") or b""
    if query:
        target += "?" + quote(query, safe=_URL_SAFE)
    return target


def _field(location: tuple[Any, ...]) -> str:
    """`("body", "jobs", 0, "exec")` -> `body.jobs[0].exec`: list positions in brackets, as
    the routes' own refusals name them (`body.jobs[3]`), so one field has one name."""
    name = ""
    for part in location:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name


def answer_for(error: Exception, scope: Scope) -> JSONResponse | None:
    """The answer to a refusal raised by a route (or by `dispatch.api.submit_fast_path`), or None if
    `error` is not one."""
    if isinstance(error, ApiError):
        return error_response(error.status, error.error, error.detail)
    if isinstance(error, Rejected):
        return error_response(error.http_status, error.code.value, error.detail)
    if isinstance(error, LeaderUnavailable):
        if error.leader is not None:
            # A follower: the same request on the leader (307 keeps the method and body).
            response = error_response(307, "not_leader", str(error), leader=error.leader)
            response.headers["Location"] = error.leader + target_of(scope)
            return response
        return _retry_soon(str(error))
    if isinstance(error, SubmitUnavailable):
        # Nothing was acknowledged: the client retries with the same ids (dedup answers).
        return _retry_soon(str(error))
    return None


def _retry_soon(detail: str) -> JSONResponse:
    response = error_response(503, "unavailable", detail)
    response.headers["Retry-After"] = "1"
    return response


def install(app: FastAPI) -> None:
    async def _answer(request: Request, error: Exception) -> JSONResponse:
        response = answer_for(error, request.scope)
        if response is None:  # only the classes below are registered
            raise error
        return response

    for refusal in (ApiError, Rejected, LeaderUnavailable, SubmitUnavailable):
        app.add_exception_handler(refusal, _answer)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        problems = [f"{_field(problem['loc'])}: {problem['msg']}" for problem in error.errors()]
        return error_response(422, "invalid", "; ".join(problems), fields=problems)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, error: HTTPException) -> JSONResponse:
        return error_response(
            error.status_code, _CODES.get(error.status_code, "error"), str(error.detail)
        )


class PayloadLimit:
    """Refuses a request body over `limit` bytes with 413, before it is parsed.

    A declared `content-length` over the limit is refused at once. A body without one
    (chunked) is counted as it arrives: past the limit, reading it fails, and whatever the
    application answers to that (FastAPI turns any error reading a body into a 400) is
    replaced by the 413, unless it already started answering."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        received = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                raise _TooLarge
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    exceeded = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded and not started:
                return  # the application's answer to a body it could not read
            started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            # _TooLarge itself, or whatever the application made of it.
            if not exceeded:
                raise
        if exceeded and not started:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, "too_large", f"request body over {self.limit} bytes")
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass
