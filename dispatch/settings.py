"""One typed settings object for every dispatch process.

Values come from `conf/defaults.toml` (or the file named by DISPATCH_CONFIG), overridden by
environment variables `DISPATCH_<SECTION>__<NAME>`, overridden by keyword arguments (tests).
Everything is validated when loaded; a bad value raises `ConfigError` naming the setting and
the environment variable that sets it, so a typo fails at start, not an hour later.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dispatch import storage
from dispatch.core.commands import MAX_EXEC_LENGTH
from dispatch.core.config import CoreConfig
from dispatch.core.limits import (
    MAX_BURST,
    MAX_INFLIGHT,
    MAX_RATE,
    Limit,
    LimitScope,
    check_target,
)
from dispatch.core.retry import MAX_RETRY_DELAY_S, RetryPolicy
from dispatch.core.subjects import compile_pattern

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "DISPATCH_"
ENV_NESTED_DELIMITER = "__"


PROFILE_ENV = "DISPATCH_PROFILE"
PROFILES_DIR = PROJECT_ROOT / "conf" / "profiles"


def config_file() -> Path:
    """The TOML file the settings are read from."""
    override = os.environ.get("DISPATCH_CONFIG")
    return Path(override) if override else PROJECT_ROOT / "conf" / "defaults.toml"


_CHOSEN_PROFILE: ContextVar[str | None] = ContextVar("dispatch_profile", default=None)
"""The profile `load_settings(profile=...)` is loading (None: DISPATCH_PROFILE decides)."""


def profile_name() -> str:
    """The profile being loaded: `load_settings`' argument, else DISPATCH_PROFILE ("": none)."""
    chosen = _CHOSEN_PROFILE.get()
    return chosen if chosen is not None else os.environ.get(PROFILE_ENV, "").strip()


def profile_file(name: str) -> Path:
    """A profile's overlay: `conf/profiles/<name>.toml`, read over the configuration file (its
    values win; the environment and keyword arguments still win over both)."""
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,31}", name):
        raise ConfigError(f"profile {name!r}: a lower-case name (letters, digits, dashes)")
    return PROFILES_DIR / f"{name}.toml"


def profiles() -> list[str]:
    """The profiles this installation has."""
    return sorted(path.stem for path in PROFILES_DIR.glob("*.toml"))


def config_files() -> list[Path]:
    """The TOML files the settings are read from, later ones winning: the configuration file,
    then the profile's overlay if DISPATCH_PROFILE names one."""
    name = profile_name()
    return [config_file(), profile_file(name)] if name else [config_file()]


def _check_profile(path: Path) -> None:
    if not path.is_file():
        known = ", ".join(profiles()) or "none"
        raise ConfigError(f"no profile {path.stem!r} ({PROFILE_ENV}); profiles: {known}")
    with path.open("rb") as source:
        overlay = tomllib.load(source)
    # A profile's stack keeps its run files (pid files, the recorded profile) where `dispatch
    # down` and `status` look for them: under the `var` every profile shares.
    if "var" in overlay.get("paths", {}):
        raise ConfigError(f"profile {path}: paths.var cannot be set by a profile")


class ConfigError(Exception):
    """A setting is missing or invalid; the message names it."""


class _Section(BaseModel):
    # Unknown keys are typos: refuse them instead of silently ignoring them. A field's
    # docstring is its description: the one place its meaning is written (docs/settings.md is
    # generated from it, dispatch/settings_doc.py). A default goes through the validators as a
    # value from a file does: a config file that leaves `paths.var` out still gets it resolved
    # against the project root, not the working directory.
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True
    )


class PathSettings(_Section):
    """Where a stack keeps its state. Relative paths are taken against the project root (the
    folder holding `conf/`), so a command run from a sub-folder uses the same `var`."""

    var: Path = Path("var")
    """The stack's own folder: broker data, checkpoints, logs, pid files, API keys."""
    warehouse: str = "delta"
    """The Delta tables: a path (relative: under `var`) or a URI (`s3://bucket/prefix`)."""
    checkpoints: str = ""
    """The streaming query's checkpoints: a path (relative: under `var`) or a URI; empty:
    `<var>/checkpoints` (see `checkpoint_root`)."""
    cache: Path = Path("~/.cache/dispatch")
    """Downloaded jars and the Maven repository, outside the repository (shared by stacks)."""

    @field_validator("var", "cache")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Relative to the project root, so a command run from a sub-folder finds the same data.
        expanded = value.expanduser()
        return expanded if expanded.is_absolute() else PROJECT_ROOT / expanded

    @field_validator("warehouse", "checkpoints", mode="before")
    @classmethod
    def _location_text(cls, value: object) -> object:
        # A Path from code (tests, `with_namespace`) is a location like any other.
        return str(value) if isinstance(value, Path) else value

    @field_validator("warehouse")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the warehouse needs a path or a URI")
        return value

    @field_validator("warehouse", "checkpoints")
    @classmethod
    def _uri(cls, value: str) -> str:
        # A URI is checked here, so an error names the field; paths go under `var` below.
        return storage.normalize(value) if storage.is_uri(value) else value

    @model_validator(mode="after")
    def _locations_under_var(self) -> PathSettings:
        # Relative to `var`, so a stack moved elsewhere (DISPATCH_PATHS__VAR) takes its tables.
        object.__setattr__(self, "warehouse", self.under_var(self.warehouse))
        if self.checkpoints:
            object.__setattr__(self, "checkpoints", self.under_var(self.checkpoints))
        return self

    def under_var(self, location: str) -> str:
        """`location` normalized (dispatch.storage); a relative path is taken under `var`."""
        if not location.strip():
            raise ValueError("a storage location may not be empty")
        if storage.is_uri(location):  # absolute by nature
            return storage.normalize(location)
        path = Path(location).expanduser()
        return str(path if path.is_absolute() else self.var / path)

    def checkpoint_root(self) -> str:
        """Where the streaming queries keep their checkpoints (a folder each, by name).

        Computed, not stored: settings copied with another `var` (`model_copy`, which skips
        validation) take their checkpoints with them."""
        return self.checkpoints or str(self.var / "checkpoints")


class KafkaSettings(_Section):
    """The Kafka log: the brokers (run by `dispatch up`, or the user's own) and the
    dispatcher's topics."""

    bootstrap: str = "127.0.0.1:9092"
    """The PLAINTEXT listener of each broker, `host:port`, comma-separated. For a local
    cluster of several `brokers`, one address is enough: node n (from 0) listens on its port
    + 2n."""
    controller_port: int = Field(9093, ge=1, le=65535)
    """The KRaft controller listener of the local broker; node n (from 0) listens on
    controller_port + 2n."""
    heap: str = Field("512m", pattern=r"^[0-9]+[mMgG]$")
    """JVM heap of each local broker (`512m`, `1g`)."""
    start_timeout_s: float = Field(90.0, gt=0)
    """How long `dispatch up` waits for the brokers to answer."""
    submit_topic: str = Field("dispatch.submit", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """The topic submissions are written to (any node takes them); the leader consumes it."""
    events_topic: str = Field("dispatch.events", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """The leader's write-ahead log of decisions (`enqueued`, `assigned`, `completed`...),
    written in transactions; a new leader rebuilds its state from it."""
    rejected_topic: str = Field("dispatch.submit.rejected", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """Submission records the leader refused as invalid, each with its reason."""
    submit_partitions: int = Field(2, ge=1)
    """Partitions of the submit topic: any producer writes there; order matters only per job
    id."""
    events_partitions: int = Field(1, ge=1)
    """Partitions of the events topic: one dispatcher group writes one partition, in strict
    order."""
    rejected_partitions: int = Field(1, ge=1)
    """Partitions of the rejected topic."""
    retention_hours: int = Field(168, ge=1)
    """How long Kafka keeps records (a week); the Delta tables keep the history for years."""
    brokers: int = Field(1, ge=1, le=9)
    """How many brokers the cluster has: the local stack runs that many KRaft nodes on
    loopback (docs/deployment.md, "Kafka profiles"); with `external`, the size of the user's
    cluster, which only derives the replication defaults below."""
    replication_factor: int = Field(0, ge=0)
    """Replicas of every dispatcher topic and of the broker's internal topics (consumer
    offsets, transaction state). 0: derived, min(3, brokers)."""
    min_insync_replicas: int = Field(0, ge=0)
    """Replicas that must have a record before an acks=all write is acknowledged. 0: derived,
    2 when replication_factor >= 3, else 1."""
    external: bool = False
    """The brokers are the user's (`bootstrap` names them): `dispatch up` starts no broker and
    only creates the topics that are missing."""
    leader_client: Literal["librdkafka", "kafka-python"] = "librdkafka"
    """The Kafka client of the leader's term, its transactional event log and its reader of
    submissions: librdkafka (confluent-kafka; its protocol work runs in C, off the node's
    GIL) or kafka-python. Both pass the same contract and fencing tests; the rebuild's
    replay uses kafka-python either way."""

    @field_validator("bootstrap")
    @classmethod
    def _host_port(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port[,host:port...], got {value!r}")
        return value

    @model_validator(mode="after")
    def _cluster(self) -> KafkaSettings:
        # The model is frozen; these run once, while it is being built.
        servers = [server.strip() for server in self.bootstrap.split(",")]
        if not self.external:
            if len(servers) == 1 and self.brokers > 1:
                # One address for a local cluster: node n listens 2n ports above it (the
                # controller ports interleave, see `controller_ports`).
                host, port = self.host, self.port
                servers = [f"{host}:{port + 2 * n}" for n in range(self.brokers)]
                object.__setattr__(self, "bootstrap", ",".join(servers))
            elif len(servers) != self.brokers:
                raise ValueError(
                    f"bootstrap lists {len(servers)} brokers but brokers is {self.brokers}: "
                    f"set brokers to {len(servers)}, give one address (the others are "
                    "derived), or set external = true for brokers this stack does not run"
                )
            hosts = [host for host, _port in self.servers]
            listeners = self.servers
            listeners += list(zip(hosts, self.controller_ports, strict=True))
            if max(port for _host, port in listeners) > 65535:
                raise ValueError(f"the brokers' ports {sorted(listeners)} go past 65535")
            if len(set(listeners)) != len(listeners):
                raise ValueError(
                    f"the brokers' listeners {sorted(listeners)} collide: node n's controller "
                    "listens on controller_port + 2n, which must not be a broker's port"
                )
        if self.replication_factor == 0:
            object.__setattr__(self, "replication_factor", min(3, self.brokers))
        if self.min_insync_replicas == 0:
            object.__setattr__(
                self, "min_insync_replicas", 2 if self.replication_factor >= 3 else 1
            )
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas ({self.min_insync_replicas}) exceeds replication_factor "
                f"({self.replication_factor}): no write could ever be acknowledged"
            )
        if self.replication_factor > self.brokers:
            raise ValueError(
                f"replication_factor ({self.replication_factor}) exceeds brokers "
                f"({self.brokers}): Kafka refuses to create such topics"
            )
        return self

    @property
    def servers(self) -> list[tuple[str, int]]:
        """(host, port) of every broker `bootstrap` names, in order."""
        pairs = [server.strip().rpartition(":") for server in self.bootstrap.split(",")]
        return [(host, int(port)) for host, _sep, port in pairs]

    @property
    def controller_ports(self) -> list[int]:
        """The KRaft controller port of each local node: controller_port + 2n for node n
        (0-based), so the defaults interleave with the listeners: 9092/9093, 9094/9095, ..."""
        return [self.controller_port + 2 * n for n in range(self.brokers)]

    @property
    def host(self) -> str:
        return self.bootstrap.split(",")[0].rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.bootstrap.split(",")[0].rpartition(":")[2])

    @property
    def topics(self) -> dict[str, int]:
        """Every topic the dispatcher uses, with its partition count."""
        return {
            self.submit_topic: self.submit_partitions,
            self.events_topic: self.events_partitions,
            self.rejected_topic: self.rejected_partitions,
        }


class SparkSettings(_Section):
    """The Spark Structured Streaming query that folds the log into the Delta tables, and the
    standalone cluster the local stack may run for it (docs/streaming.md)."""

    master: str = "local[2]"
    """`local[N]` runs everything in the driver's JVM; `spark://host:port` uses a standalone
    cluster (docs/streaming.md, "Running on a Spark cluster")."""
    shuffle_partitions: int = Field(2, ge=1)
    """`spark.sql.shuffle.partitions` of the driver's session."""
    ui_enabled: bool = False
    """Start the driver's web UI and REST API (on `ui_port`)."""
    ui_port: int = Field(4040, ge=1, le=65535)
    """The driver's web UI and REST API (`/api/v1`), when `ui_enabled`; Spark tries the next
    ports if it is taken."""
    driver_memory: str = Field("2g", pattern=r"^[0-9]+[mMgG]$")
    """Heap of the Spark driver's JVM (`spark.driver.memory`)."""
    driver_host: str = Field("127.0.0.1", min_length=1)
    """The address executors reach the driver at: on a cluster of several machines, one the
    workers can route to (loopback only works when every worker is on this machine)."""
    driver_bind_address: str = Field("127.0.0.1", min_length=1)
    """The interface the driver listens on (0.0.0.0: all of them)."""
    executor_memory: str = Field("1g", pattern=r"^[0-9]+[mMgG]$")
    """Heap of each executor on a cluster; it must fit a worker's --memory. Unused by
    `local[N]` masters (the driver is the executor there)."""
    cluster_workers: int = Field(0, ge=0, le=8)
    """Workers of a standalone cluster the local stack runs itself (`dispatch up` starts a
    master at `master`, which must then be `spark://<loopback>:<port>`, and this many
    workers); 0: the stack runs no cluster (`local[N]`, or the user's own master)."""
    worker_memory: str = Field("1g", pattern=r"^[0-9]+[mMgG]$")
    """Memory each worker of the stack's own cluster offers its executors."""
    worker_cores: int = Field(1, ge=1)
    """Cores each worker of the stack's own cluster offers its executors."""
    executor_fold_min_records: int = Field(20_000, ge=0)
    """On a cluster (`fold_on = auto`), a micro-batch of fewer Kafka records than this is
    folded on the driver, a larger one on the executors: a fold on the executors costs
    seconds of Spark jobs whatever the batch's size (docs/streaming.md, *Where the fold
    runs*). 0: every batch on the executors."""

    @model_validator(mode="after")
    def _own_cluster_on_loopback(self) -> SparkSettings:
        if self.cluster_workers and not _is_loopback_master(self.master):
            raise ValueError(
                f"cluster_workers = {self.cluster_workers} runs a cluster on this machine: "
                f"master must be spark://127.0.0.1:<port>, not {self.master!r}"
            )
        return self


def _is_loopback_master(master: str) -> bool:
    host, _, port = master.removeprefix("spark://").rpartition(":")
    return master.startswith("spark://") and host in ("127.0.0.1", "localhost") and port.isdigit()


class ApiSettings(_Section):
    """The FastAPI nodes `dispatch up` runs: one leads (it holds the lease), the others
    stand by and take submissions too."""

    host: str = "127.0.0.1"
    """The interface every node listens on."""
    ports: list[int] = Field(default_factory=lambda: [8000, 8001], min_length=1)
    """One node per port: the first one and its standbys."""
    max_payload_bytes: int = Field(1_048_576, ge=1)
    """The largest payload (a job's input or result) a node accepts, in bytes; a larger
    request is refused, and so is a larger record on the submit topic."""
    access_log: bool = False
    """uvicorn's line per request (off by default: a large share of a single-job request's
    CPU, BENCHMARKS.md)."""
    advertise_url: str = Field("", pattern=r"^(https?://[^/\s]+)?$")
    """The base URL clients reach this node at (in the lease, in 307s); empty: http://host:port."""
    commit_window_ms: float = Field(0.0, ge=0.0, le=100.0)
    """Group commit: the least time between two of the leader's transactions; submissions and
    commands that arrive meanwhile share the next one. 0: commit as soon as anything is
    decided (each job of a slow trickle then costs a transaction of its own)."""

    @field_validator("ports")
    @classmethod
    def _valid_ports(cls, value: list[int]) -> list[int]:
        if any(not 0 < port < 65536 for port in value):
            raise ValueError(f"ports must be between 1 and 65535, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"ports must be distinct, got {value}")
        return value


LIMIT_SCOPES = tuple(scope.value for scope in LimitScope)
"""The scopes of a limit: `client` (a client id), `exec` (an exec pattern), `key` (a
concurrency key or key pattern)."""


class LimitSettings(_Section):
    """One limit of `[dispatcher.limits.<scope>.<target>]`: at least one of the two knobs."""

    max_inflight: int | None = Field(None, ge=1, le=MAX_INFLIGHT)
    """Jobs running at once."""
    rate: float | None = Field(None, gt=0, le=MAX_RATE)
    """Starts (assignments) per second, a token bucket ..."""
    burst: int | None = Field(None, ge=1, le=MAX_BURST)
    """... holding this many tokens (default: max(1, ceil(rate))); only with a rate."""

    @model_validator(mode="after")
    def _valid(self) -> LimitSettings:
        self.limit()  # the core's own checks (ValueError naming the knob)
        return self

    def limit(self) -> Limit:
        """The core's `Limit` (a rate's default burst filled in)."""
        return Limit.checked(self.max_inflight, self.rate, self.burst)


def check_limit_target(scope: str, target: str) -> str:
    """A limit's target as its scope wants it (the core's rules), or ValueError saying why:
    a client id; an exec pattern (`*` one token, a final `>` one or more); a concurrency key
    of at most MAX_KEY_LENGTH characters without control characters or `*`, or a key pattern
    ending in `*` (each key with that prefix; `*` alone: every key)."""
    try:
        kind = LimitScope(scope)
    except ValueError:
        raise ValueError(
            f"unknown scope {scope!r}, expected one of {', '.join(LIMIT_SCOPES)}"
        ) from None
    return check_target(kind, target, MAX_EXEC_LENGTH)


class DispatcherSettings(_Section):
    """The dispatcher's policy: caps, deadlines, retries, limits (docs/core.md)."""

    group: str = Field("default", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """The dispatcher group: one group has one lease, one leader and one events partition."""
    default_cap: int = Field(100, ge=1)
    """Jobs in flight per client, unless `caps` names the client."""
    caps: dict[str, int] = Field(default_factory=dict)
    """Per-client caps: client_id = cap."""
    ack_timeout_s: float = Field(30.0, gt=0)
    """The deadline of a job's first attempt: a job not acked by then is requeued."""
    backoff_multiplier: float = Field(2.0, ge=1.0)
    """Attempt n's deadline is ack_timeout_s * backoff_multiplier^(n-1)..."""
    max_ack_timeout_s: float = Field(600.0, gt=0)
    """... but never more than this."""
    max_attempts: int = Field(5, ge=1)
    """Attempts of a job before it goes to the dead-letter queue."""
    worker_expiry_s: float = Field(15.0, gt=0)
    """A REST worker silent this long is lost; its jobs are requeued."""
    finished_window_s: float = Field(300.0, gt=0)
    """Finished jobs (succeeded, cancelled, expired) stay in the leader's memory this long
    after they finish ..."""
    finished_max: int = Field(100_000, ge=0)
    """... and at most this many of them (the oldest go first; the leader prunes once a
    minute, so up to a minute of finished jobs more): the leader's memory is bounded whatever
    the rate. Afterwards a job is read from Delta (`GET /v1/jobs/{id}` answers it with its
    result for as long as the tables keep it)."""
    dedup_window_s: float = Field(86400.0, gt=0)
    """A resubmitted job id is answered as the existing job for this long after the job
    finished: from memory within the window above, then through a filter of recently
    finished ids and a Delta lookup (docs/spec.md, *1. Submission and dedup*). After it, the
    same id starts a new life."""
    dedup_filter_mb: int = Field(64, ge=1, le=4096)
    """The memory of that filter, fixed whatever the rate: about 10 bits per id keeps 1 % of
    new ids (looked up in Delta for nothing); 64 MB holds ~50 million ids a window."""
    accept_log_gap: bool = False
    """Lead even when the events log's retention removed records the rebuild needs (after the
    newest snapshot's offsets): those decisions are lost. Off by default: such a node refuses
    to lead and names the gap on /readyz (docs/architecture.md)."""
    retry_delay_s: float = Field(1.0, ge=0, le=MAX_RETRY_DELAY_S)
    """A job whose attempt failed (a retryable failure, or its ack deadline passed) waits
    this long before its next attempt; 0 retries at once."""
    retry_multiplier: float = Field(2.0, ge=1.0)
    """Each later delay is this many times the previous one ..."""
    retry_max_delay_s: float = Field(300.0, ge=0, le=MAX_RETRY_DELAY_S)
    """... but never longer than this."""
    retry_jitter: float = Field(0.2, ge=0, le=1)
    """A delay d is drawn in [d * (1 - jitter), d], from the job id and the attempt (a
    replay draws the same), so that jobs that failed together do not return together."""
    retry_by_exec: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Retry policies by exec pattern (`*` one token, a final `>` one or more), the first
    matching pattern in file order winning: pattern = {delay_s, multiplier, max_delay_s,
    jitter}, a key left out taking the `retry_*` value above. A job's own `retry` beats both."""
    max_run_s: float = Field(0.0, ge=0, le=MAX_RETRY_DELAY_S)
    """Hard time limit of each attempt of a job that sets no `max_run_s` of its own: its
    heartbeats cannot carry it past this; reaching it fails the attempt (`time_limit`,
    retried per the retry policy) and tells its worker to stop. 0: no limit."""
    max_run_by_exec: dict[str, float] = Field(default_factory=dict)
    """Hard time limits by exec pattern, the first matching pattern in file order winning:
    pattern = seconds. A job's own `max_run_s` beats both."""
    cancel_grace_s: float = Field(30.0, gt=0)
    """A cancelled running job's worker is told to stop; the job ends `cancelled` when the
    worker confirms, or this long after the cancel, whichever is first."""
    limits: dict[str, dict[str, LimitSettings]] = Field(default_factory=dict)
    """Limits by scope and target: `[dispatcher.limits.<scope>."<target>"]` with
    `max_inflight` (jobs running at once), `rate` (starts per second) and `burst` (the rate's
    bucket; default max(1, ceil(rate))), at least one of the first two. Scopes: `client` (a
    client id; its `max_inflight` replaces its cap), `exec` (an exec pattern, one budget
    shared by every exec it matches), `key` (a job's concurrency key, or a pattern ending in
    `*` budgeting each matching key apart). A runtime limit (`PUT /v1/limits/...`) of the
    same scope and target replaces one set here until it is removed."""

    @field_validator("max_run_by_exec")
    @classmethod
    def _run_limits(cls, value: dict[str, float]) -> dict[str, float]:
        for pattern, seconds in value.items():
            try:
                compile_pattern(pattern)
            except ValueError as error:
                raise ValueError(f"max_run_by_exec[{pattern!r}]: {error}") from None
            if not 0 < seconds <= MAX_RETRY_DELAY_S:
                raise ValueError(
                    f"max_run_by_exec[{pattern!r}]: expected seconds in (0, {MAX_RETRY_DELAY_S:g}]"
                )
        return value

    @field_validator("limits")
    @classmethod
    def _limit_targets(
        cls, value: dict[str, dict[str, LimitSettings]]
    ) -> dict[str, dict[str, LimitSettings]]:
        for scope, targets in value.items():
            if scope not in LIMIT_SCOPES:
                raise ValueError(
                    f"limits.{scope}: unknown scope, expected one of {', '.join(LIMIT_SCOPES)}"
                )
            for target in targets:
                try:
                    check_limit_target(scope, target)
                except ValueError as error:
                    raise ValueError(f"limits.{scope}[{target!r}]: {error}") from None
        return value

    def core_limits(self) -> dict[str, dict[str, Limit]]:
        """`limits` as the core takes them: scope -> target -> `Limit`."""
        return {
            scope: {target: limit.limit() for target, limit in targets.items()}
            for scope, targets in self.limits.items()
            if targets
        }

    @field_validator("caps")
    @classmethod
    def _positive_caps(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {client: cap for client, cap in value.items() if cap < 1}
        if bad:
            raise ValueError(f"every cap must be at least 1, got {bad}")
        return value

    @field_validator("retry_by_exec")
    @classmethod
    def _retry_policies(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for pattern, policy in value.items():
            try:
                compile_pattern(pattern)
                RetryPolicy().merged(policy, label=f"retry_by_exec[{pattern!r}]")
            except ValueError as error:
                raise ValueError(str(error)) from None
        return value

    def retry_policy(self) -> RetryPolicy:
        """The retry policy of every exec no `retry_by_exec` pattern matches."""
        return RetryPolicy(
            delay_s=self.retry_delay_s,
            multiplier=self.retry_multiplier,
            max_delay_s=self.retry_max_delay_s,
            jitter=self.retry_jitter,
        )

    def core_config(self) -> CoreConfig:
        """The pure core's policy object (the core reads no settings itself)."""
        retry = self.retry_policy()
        return CoreConfig(
            retry=retry,
            retry_by_exec=tuple(
                (pattern, retry.merged(policy)) for pattern, policy in self.retry_by_exec.items()
            ),
            default_cap=self.default_cap,
            caps=self.caps,
            ack_timeout_s=self.ack_timeout_s,
            backoff_multiplier=self.backoff_multiplier,
            max_ack_timeout_s=self.max_ack_timeout_s,
            max_attempts=self.max_attempts,
            worker_expiry_s=self.worker_expiry_s,
            max_run_s=self.max_run_s or None,
            max_run_by_exec=tuple(self.max_run_by_exec.items()),
            cancel_grace_s=self.cancel_grace_s,
            limits=self.core_limits(),
        )

    @model_validator(mode="after")
    def _timeout_cap_covers_first_attempt(self) -> DispatcherSettings:
        if self.max_ack_timeout_s < self.ack_timeout_s:
            raise ValueError("max_ack_timeout_s must be at least ack_timeout_s")
        return self


class TenantSettings(_Section):
    """Per-tenant service levels: how long a client's jobs may wait in their queue (from
    entering it to their assignment) before the wait counts as a breach (`GET /v1/tenants`,
    docs/streaming.md, *Tenant SLAs*), and how many clients get series of their own on
    `/metrics`."""

    wait_target_s: float = 5.0
    """The queue-wait target, in seconds, of every client `wait_targets` does not name."""
    wait_targets: dict[str, float] = Field(default_factory=dict)
    """Per-client targets: client_id = seconds."""
    metrics_clients: int = Field(20, ge=1, le=1000)
    """Clients with their own `dispatch_tenant_*` series (the deepest queues); the others are
    summed under one `other` series, so any number of client ids keeps /metrics small."""

    @field_validator("wait_target_s")
    @classmethod
    def _positive_target(cls, value: float) -> float:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"a wait target must be a positive number of seconds, got {value}")
        return value

    @field_validator("wait_targets")
    @classmethod
    def _positive_targets(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {
            client: target
            for client, target in value.items()
            if not (math.isfinite(target) and target > 0)
        }
        if bad:
            raise ValueError(f"every wait target must be a positive number of seconds, got {bad}")
        return value

    def wait_target_for(self, client_id: str) -> float:
        """The client's queue-wait target in seconds."""
        return self.wait_targets.get(client_id, self.wait_target_s)


class LeaseSettings(_Section):
    """The leader's lease, a row in the Delta table `leases`. A failover takes about `ttl_s`
    (the dead leader's lease must expire) plus the rebuild."""

    ttl_s: float = Field(3.0, gt=0)
    """A lease lasts this long unless renewed."""
    renew_every_s: float = Field(0.5, gt=0)
    """The leader renews this often, well before expiry; standbys look this often too."""
    clock_skew_margin_s: float = Field(1.0, ge=0)
    """A leader stops dispatching this long before its lease ends, in case clocks differ."""

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> LeaseSettings:
        # A leader must renew, and stop dispatching, before its lease can expire anywhere.
        if self.renew_every_s + self.clock_skew_margin_s >= self.ttl_s:
            raise ValueError("renew_every_s + clock_skew_margin_s must be less than ttl_s")
        return self


class StorageSettings(_Section):
    """Object storage (S3 or an S3-compatible server) for locations given as `s3://` URIs
    (dispatch/storage.py). Empty values fall back to the usual AWS environment variables:
    AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; without keys there either,
    delta-rs finds credentials as an AWS SDK does (profile, web identity, instance role)."""

    endpoint_url: str = Field("", pattern=r"^(https?://[^/\s]+/?)?$")
    """An S3-compatible server (`http://127.0.0.1:9000`); empty: AWS S3 itself."""
    region: str = ""
    """The bucket's region; empty: AWS_REGION, else us-east-1 for a custom endpoint."""
    access_key_id: str = ""
    """The access key; empty: AWS_ACCESS_KEY_ID, else the AWS SDK's lookup."""
    # Kept out of repr(), so a logged settings object does not leak them.
    secret_access_key: str = Field("", repr=False)
    """The secret key; better given in the environment (DISPATCH_STORAGE__SECRET_ACCESS_KEY
    or AWS_SECRET_ACCESS_KEY) than in a file."""
    session_token: str = Field("", repr=False)
    """A temporary credential's session token; empty: AWS_SESSION_TOKEN."""
    allow_http: bool = False
    """Plain-HTTP endpoints other than loopback (loopback is always allowed)."""
    virtual_hosted_style: bool = False
    """`bucket.host/key` requests instead of `host/bucket/key` (path style)."""
    request_timeout_s: float = Field(10.0, gt=0)
    """The time limit of one request."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """The time limit of opening a connection."""
    max_retries: int = Field(3, ge=0)
    """How many times one request is retried at most."""
    retry_timeout_s: float = Field(15.0, gt=0)
    """Retries of one request stop after this long (object_store retries 5xx and timeouts)."""
    serve: bool = False
    """The local stack runs an S3-compatible server itself (S3Proxy, `dispatch up`) at
    `endpoint_url`, which must then be a loopback `http://127.0.0.1:<port>`, with these
    credentials, serving `bucket` from `<var>/object-store`; false: the store is the user's."""
    bucket: str = Field("dispatch", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    """The bucket the stack's own server serves (the warehouse's URIs name it)."""

    @model_validator(mode="after")
    def _served_on_loopback(self) -> StorageSettings:
        if self.serve:
            from dispatch.storage import is_loopback

            if not self.endpoint_url.startswith("http://") or not is_loopback(self.endpoint_url):
                raise ValueError(
                    "serve = true runs the object store on this machine: endpoint_url must be "
                    f"http://127.0.0.1:<port>, not {self.endpoint_url!r}"
                )
            if not (self.access_key_id and self.secret_access_key):
                raise ValueError("serve = true needs access_key_id and secret_access_key")
        return self


class JvmSettings(_Section):
    """How the project starts its JVMs (the Kafka brokers, the Spark driver and a standalone
    cluster's daemons and executors, the S3-compatible server): docs/deployment.md, *JVM
    start-up*."""

    class_sharing: bool = True
    """Start the broker and the Spark driver on the class-data-sharing archives
    `dispatch.stack.class_sharing` made for these exact jars (bootstrap makes them), when
    there are any: a third less start-up. False: never use them."""
    quick_start: bool = False
    """The client compiler only (`-XX:TieredStopAtLevel=1`) for the brokers, the object store,
    and a standalone cluster's daemons and executors (the Spark driver only with
    `quick_start_driver`): they reach their first answer sooner and compile less, but run hot
    loops slower. For short runs (the test suite, a demo); a long-running stack should leave
    it off."""
    quick_start_driver: bool = False
    """With `quick_start`, the client compiler for the Spark driver too (`dispatch streaming`,
    a notebook's own session). Only for drivers that live a minute or two: their start and
    first queries take less CPU; a driver folding for longer runs its planning and Delta work
    up to twice as slow (BENCHMARKS.md, *JVM start-up*)."""


class AuthSettings(_Section):
    """Bearer API keys (docs/security.md). Roles: client (submits, reads and cancels its own
    jobs), worker (polls and settles the leases it holds), admin (everything, the DLQ too).
    Relative paths are taken under `paths.var`, so each stack has its own keys."""

    keys_file: Path = Path("api-keys.json")
    """The keys the nodes accept, as SHA-256 hashes only: a JSON list of `{"name", "role",
    "client_id", "sha256"}`."""
    dev_keys_file: Path = Path("dev-keys.json")
    """Local development keys in plain text, one per role, which `dispatch keys` creates on
    first use (their hashes go to `keys_file`). For a development stack only."""


class Settings(BaseSettings):
    """Every setting of every dispatch process, validated."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    # A section's meaning is its class's docstring (docs/settings.md).
    paths: PathSettings = Field(default_factory=PathSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    tenants: TenantSettings = Field(default_factory=TenantSettings)
    jvm: JvmSettings = Field(default_factory=JvmSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest priority first: keyword arguments, then the environment, then the file.
        toml = TomlConfigSettingsSource(settings_cls, toml_file=config_files(), deep_merge=True)
        return (init_settings, env_settings, toml)

    @model_validator(mode="after")
    def _auth_files_under_var(self) -> Settings:
        auth = self.auth
        keys, dev_keys = auth.keys_file.expanduser(), auth.dev_keys_file.expanduser()
        if not (keys.is_absolute() and dev_keys.is_absolute()):
            resolved = auth.model_copy(
                update={
                    "keys_file": keys if keys.is_absolute() else self.paths.var / keys,
                    "dev_keys_file": dev_keys
                    if dev_keys.is_absolute()
                    else self.paths.var / dev_keys,
                }
            )
            # The model is frozen; this runs once, while it is being built.
            object.__setattr__(self, "auth", resolved)
        return self

    @property
    def broker_dir(self) -> Path:
        return self.paths.var / "kafka"

    @property
    def jar_cache(self) -> Path:
        return self.paths.cache / "jars"

    @property
    def maven_repo(self) -> Path:
        return self.paths.cache / "m2"


def _setting_name(location: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in location)


def _env_name(location: tuple[int | str, ...]) -> str:
    parts = [str(part) for part in location if isinstance(part, str)]
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(part.upper() for part in parts)


def load_settings(profile: str | None = None, **overrides: Any) -> Settings:
    """Load and validate the settings, or raise ConfigError naming every bad setting.

    `profile` (conf/profiles/<profile>.toml over the file; "" for none) instead of what
    DISPATCH_PROFILE says."""
    chosen = _CHOSEN_PROFILE.set(profile)
    try:
        return _load_settings(overrides)
    finally:
        _CHOSEN_PROFILE.reset(chosen)


def _load_settings(overrides: dict[str, Any]) -> Settings:
    source = config_file()
    if not source.is_file():
        raise ConfigError(f"configuration file {source} does not exist (DISPATCH_CONFIG)")
    origin = str(source)
    if name := profile_name():
        _check_profile(profile_file(name))
        origin += f" with profile {name}"
    try:
        return Settings(**overrides)
    except ValidationError as error:
        lines = [
            f"  {_setting_name(problem['loc'])} (env {_env_name(problem['loc'])}): {problem['msg']}"
            for problem in error.errors()
        ]
        raise ConfigError(f"invalid settings from {origin}:\n" + "\n".join(lines)) from error


def to_environment(settings: Settings) -> dict[str, str]:
    """Environment variables that make another `dispatch` process load these settings."""
    environment: dict[str, str] = {}
    for section, values in settings.model_dump(mode="json").items():
        for name, value in values.items():
            key = f"{ENV_PREFIX}{section.upper()}{ENV_NESTED_DELIMITER}{name.upper()}"
            # Lists and mappings travel as JSON, which pydantic-settings parses back.
            environment[key] = value if isinstance(value, str) else json.dumps(value)
    return environment


def with_namespace(settings: Settings, namespace: str, folder: Path) -> Settings:
    """The same settings with topics prefixed by `namespace` and `var` / the warehouse under
    `folder`: a second stack's worth of state on the same broker (tests, benchmarks)."""
    kafka = settings.kafka.model_copy(
        update={
            "submit_topic": f"{namespace}.dispatch.submit",
            "events_topic": f"{namespace}.dispatch.events",
            "rejected_topic": f"{namespace}.dispatch.submit.rejected",
        }
    )
    paths = settings.paths.model_copy(
        update={"var": folder / "var", "warehouse": str(folder / "delta"), "checkpoints": ""}
    )
    return settings.model_copy(update={"kafka": kafka, "paths": paths})
