"""Task handles: the function a worker registers is also how a client submits its jobs.

```python
app = WorkerApp("images")

@app.handler("image.resize")
def resize(job: Assignment) -> dict:
    ...

resize.submit({"url": "s3://b/k.png"}).wait(timeout_s=60)   # in any process with a client
resize(job)                                                  # still the function (unit tests)
```

The exec name is written once, in the decorator. A handle submits through, in order: the
`client=` given to the call, else the process's default client (`default_client()`): a
`Client()` built from the environment (`DISPATCH_URL`, `DISPATCH_API_KEY`) on first use,
shared by every handle and closed at exit. `submit_async` has no shared default (an async
client belongs to one event loop): without `client=` it opens a client for the call.

A handle of a wildcard pattern (`image.*`) names no single exec: its `submit` needs
`exec=`, which the pattern must match (checked here, before anything is sent).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypedDict, TypeVar, Unpack

from pydantic import PrivateAttr

from dispatch.client import Accepted, AsyncClient, Client, Job
from dispatch.core.subjects import compile_pattern, match_tokens, validate_exec
from dispatch.worker.jobs import Assignment

R = TypeVar("R")


class SubmitOptions(TypedDict, total=False):
    """What `Client.submit` takes beside the exec, the payload and the id."""

    max_attempts: int | None
    timeout_s: float | None
    priority: int
    delay_s: float
    client_id: str | None
    retry: Mapping[str, float] | None
    expires_at: float | None
    ttl_s: float | None
    max_run_s: float | None
    key: str | None


class Submitted(Accepted):
    """The `Accepted` answer of a handle's `submit`, which can also wait for its job."""

    _client: Client | None = PrivateAttr(default=None)

    def wait(self, timeout_s: float | None = None, *, poll_s: float = 30.0) -> Job:
        """The job once it ended (`Client.wait`), through the client that submitted it."""
        client = self._client if self._client is not None else default_client()
        return client.wait(self.id, timeout_s, poll_s=poll_s)


class AsyncSubmitted(Accepted):
    """The `Accepted` answer of a handle's `submit_async`, which can also wait for its job."""

    _client: AsyncClient | None = PrivateAttr(default=None)

    async def wait(self, timeout_s: float | None = None, *, poll_s: float = 30.0) -> Job:
        """The job once it ended (`AsyncClient.wait`), through the client that submitted it,
        or a client opened for the wait when the submit had none."""
        if self._client is not None:
            return await self._client.wait(self.id, timeout_s, poll_s=poll_s)
        async with AsyncClient() as client:
            return await client.wait(self.id, timeout_s, poll_s=poll_s)


class Task(Generic[R]):
    """A registered handler: callable as the function it wraps (the worker runs it so),
    and a way to submit jobs of its exec. `R` is what the function returns."""

    # Copied from the function (`functools.update_wrapper`), as a decorator's result has them.
    __name__: str
    __qualname__: str
    __wrapped__: Callable[[Assignment], R]

    def __init__(self, pattern: str, function: Callable[[Assignment], R]) -> None:
        # First, so that nothing the function's `__dict__` holds replaces what is set below.
        functools.update_wrapper(self, function)
        self.pattern = pattern
        """The exec pattern it was registered for (`image.resize`, `image.*`)."""
        self.function = function
        self._tokens = compile_pattern(pattern)
        self.exec: str | None = pattern if _is_literal(self._tokens) else None
        """The exec its jobs are submitted as; None for a wildcard pattern (pass `exec=`)."""

    def __call__(self, job: Assignment) -> R:
        return self.function(job)

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", repr(self.function))
        return f"<Task {self.pattern!r} {name}>"

    def exec_for(self, exec: str | None = None) -> str:
        """The exec a submission goes to: `exec`, which the pattern must match, else the
        handle's own (a wildcard handle has none: `ValueError`)."""
        if exec is None:
            if self.exec is None:
                raise ValueError(
                    f"task {self.pattern!r} matches many execs: pass exec=, e.g. "
                    f"{_example(self._tokens)!r}"
                )
            return self.exec
        tokens = tuple(validate_exec(exec).split("."))
        if not match_tokens(self._tokens, tokens):
            raise ValueError(f"exec {exec!r} is not one task {self.pattern!r} serves")
        return exec

    def submit(
        self,
        payload: Any = None,
        *,
        id: str | None = None,
        client: Client | None = None,
        exec: str | None = None,
        **options: Unpack[SubmitOptions],
    ) -> Submitted:
        """Submit a job of this task's exec (`Client.submit`); the answer can `wait()`."""
        exec_name = self.exec_for(exec)
        through = client if client is not None else default_client()
        accepted = through.submit(exec_name, payload, id=id, **options)
        return _submitted(Submitted, accepted, client)

    async def submit_async(
        self,
        payload: Any = None,
        *,
        id: str | None = None,
        client: AsyncClient | None = None,
        exec: str | None = None,
        **options: Unpack[SubmitOptions],
    ) -> AsyncSubmitted:
        """Submit a job of this task's exec (`AsyncClient.submit`); the answer can
        `await wait()`."""
        exec_name = self.exec_for(exec)
        if client is not None:
            accepted = await client.submit(exec_name, payload, id=id, **options)
        else:
            async with AsyncClient() as own:
                accepted = await own.submit(exec_name, payload, id=id, **options)
        return _submitted(AsyncSubmitted, accepted, client)


class _AsyncTask(Task[R]):
    """A task of an `async def` function. Its `__call__` is itself `async def`, so whatever
    tells sync from async handlers by inspection (the worker runs sync ones in a thread)
    sees a coroutine function, as it would the bare function."""

    async def __call__(self, job: Assignment) -> Any:  # type: ignore[override]
        return await self.function(job)  # type: ignore[misc]


def task_of(pattern: str, function: Callable[[Assignment], R]) -> Task[R]:
    """The handle of `function` registered for `pattern` (a handle is unwrapped first, so
    stacked `@app.handler` decorators register the function itself under each pattern)."""
    if isinstance(function, Task):
        function = function.function
    if is_async(function):
        return _AsyncTask(pattern, function)
    return Task(pattern, function)


# --- the default client ----------------------------------------------------------------------


class _DefaultClient:
    """The process's one default client, built on first use (a lock: handles may submit
    from many threads)."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.lock = threading.Lock()

    def get(self) -> Client:
        with self.lock:
            if self.client is None:
                self.client = Client()
                atexit.register(self.client.close)
            return self.client

    def replace(self, client: Client | None) -> Client | None:
        with self.lock:
            previous, self.client = self.client, client
            return previous


_default = _DefaultClient()


def default_client() -> Client:
    """The client handles use without `client=`: built from the environment on first use
    (`DISPATCH_URL`, `DISPATCH_API_KEY`), then shared by every handle."""
    return _default.get()


def set_default_client(client: Client | None) -> Client | None:
    """Make `client` the one handles use without `client=` (None: build one from the
    environment again on next use). Returns the previous one, which is not closed."""
    return _default.replace(client)


# --- helpers ---------------------------------------------------------------------------------

S = TypeVar("S", Submitted, AsyncSubmitted)


def _submitted(kind: type[S], accepted: Accepted, client: Any) -> S:
    answer = kind.model_validate(accepted.model_dump())
    answer._client = client
    return answer


def _is_literal(tokens: tuple[str, ...]) -> bool:
    return all(token not in ("*", ">") for token in tokens)


def _example(tokens: tuple[str, ...]) -> str:
    return ".".join("name" if token in ("*", ">") else token for token in tokens)


def is_async(function: Callable[..., Any]) -> bool:
    """Whether a handler is `async def` (or a callable object whose `__call__` is): the worker
    awaits those and runs the others in a thread."""
    call = getattr(function, "__call__", None)  # noqa: B004  (callable objects)
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


__all__ = [
    "AsyncSubmitted",
    "SubmitOptions",
    "Submitted",
    "Task",
    "default_client",
    "is_async",
    "set_default_client",
    "task_of",
]
