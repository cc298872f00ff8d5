"""docker-compose.yml, the Dockerfile and .dockerignore, checked without a Docker engine.

The compose file is validated against the Compose specification's JSON schema, vendored as
`stack/compose-spec.json`: `schema/compose-spec.json` of github.com/compose-spec/compose-spec
at commit 170098ba07d9f53c383a41bfd4c5166b0a4529a6 (the file last changed in a08f8d51,
2025-10-21; byte for byte the schema of compose-go v2.9.0), JSON Schema draft 7. The schema
accepts much that cannot work (any restart string, any command, any variable), so the facts a
user of the deployment relies on are checked as well: the commands exist in `dispatch.cli`,
every DISPATCH_* variable is a real setting, the API nodes and the fold share one warehouse on
the object store whose bucket a one-shot service makes, every Kafka client knows every broker,
the three brokers form one quorum configured like the local cluster (replication factor 3,
min ISR 2, the internal topics too), and the fold drives the Spark standalone cluster.

No Docker engine runs here: these checks read the files, as `docker compose config` would,
plus what only this project knows (its settings, its CLI, its jar sets).
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import sysconfig
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import typer
import typer.core
import typer.main
import yaml

import dispatch.client
from dispatch import cli
from dispatch.cli_jobs import load_app
from dispatch.settings import PROJECT_ROOT, Settings, load_settings
from dispatch.stack import jars
from dispatch.stack.broker import TOPIC_MAX_MESSAGE_BYTES, server_properties
from dispatch.storage import is_object_store, scheme, storage_options

COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"
SCHEMA_FILE = PROJECT_ROOT / "stack" / "compose-spec.json"
SCHEMA_SHA256 = "1f91e091f16b2dd50ab8860e02bb391d22df553d91c145eacedb1b6eff9c3f0e"
DOCKERFILE = PROJECT_ROOT / "Dockerfile"
DOCKERIGNORE = PROJECT_ROOT / ".dockerignore"
BROKER_IMAGE = "apache/kafka"
BROKERS = 3
"""Kafka nodes of the cluster: replication factor 3 and min ISR 2 survive the loss of any one."""
OBJECT_STORE_IMAGE = "minio/minio"
SPARK_CLASS = "spark-class"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The flags of the standalone daemons' command lines (Spark's MasterArguments and
# WorkerArguments); a typo would stop the daemon at start.
MASTER_FLAGS = ("--host", "--port", "--webui-port", "--properties-file")
WORKER_FLAGS = (*MASTER_FLAGS, "--cores", "--memory", "--work-dir")
SPARK_JAR_SETS = ("spark", "s3")
"""The jar sets a Spark driver loads: Delta and the Kafka connector, and hadoop-aws with its AWS
SDK for a warehouse on object storage (the compose file's)."""
STORAGE_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
"""How the storage clients (delta-rs, hadoop-aws) find the object store and sign for it."""
# Per node, not per cluster: node id, addresses, the data folder. Every other property of the
# local cluster's nodes must be the brokers' too.
NODE_PROPERTIES = (
    "node.id",
    "controller.quorum.voters",
    "listeners",
    "advertised.listeners",
    "listener.security.protocol.map",
    "log.dirs",
)
ENV_PREFIX = "DISPATCH_"
# Read by the client and the worker SDK (dispatch/client.py) and by the settings loader, not
# settings themselves; test_client_variables_are_read_by_the_client keeps this list honest.
CLIENT_VARIABLES = ("DISPATCH_URL", "DISPATCH_API_KEY")
LOADER_VARIABLES = ("DISPATCH_CONFIG",)
LONG_RUNNING_RESTARTS = ("always", "unless-stopped", "on-failure")

Service = dict[str, Any]


# --- reading the files --------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Service]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


@pytest.fixture(scope="module")
def named_volumes(compose: dict[str, Any]) -> set[str]:
    return set(compose.get("volumes") or {})


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    document = json.loads(SCHEMA_FILE.read_text())
    assert isinstance(document, dict)
    return document


def unescape(text: str) -> str:
    """What Compose hands the container: `$$` is a literal `$` (test_no_host_interpolation
    makes sure no other `$` is left for Compose to fill from the host's environment)."""
    return text.replace("$$", "$")


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def command_of(service: Service) -> list[str]:
    command = service.get("command", [])
    # Compose splits a string command like a shell would.
    argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    return [unescape(part) for part in argv]


def environment_of(service: Service) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        pairs = (str(item).partition("=") for item in raw)
        return {key: unescape(value) for key, _, value in pairs}
    return {str(key): unescape("" if value is None else str(value)) for key, value in raw.items()}


def depends_on(service: Service) -> dict[str, str]:
    """Each dependency with its condition (the short list form means service_started)."""
    raw = service.get("depends_on", {})
    if isinstance(raw, list):
        return {str(name): "service_started" for name in raw}
    return {str(name): str(spec.get("condition", "service_started")) for name, spec in raw.items()}


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool


def mounts_of(service: Service) -> list[Mount]:
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found.append(
                Mount(volume["source"], volume["target"], bool(volume.get("read_only", False)))
            )
        else:
            source, target, *mode = str(volume).split(":")
            found.append(Mount(source, target, "ro" in "".join(mode).split(",")))
    return found


def published_ports(service: Service) -> list[tuple[int, int]]:
    """(host port, container port) of each published port."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            found.append((int(port["published"]), int(port["target"])))
        else:
            *host, container = str(port).split("/")[0].split(":")
            found.append((int(host[-1]), int(container)))
    return found


def is_project_image(service: Service) -> bool:
    return "build" in service


def is_broker(service: Service) -> bool:
    return str(service.get("image", "")).startswith(BROKER_IMAGE + ":")


def broker_names(services: dict[str, Service]) -> list[str]:
    brokers = sorted(name for name, service in services.items() if is_broker(service))
    assert len(brokers) == BROKERS, f"expected {BROKERS} {BROKER_IMAGE} services, found {brokers}"
    return brokers


def listeners(text: str) -> dict[str, tuple[str, int]]:
    """`NAME://host:port,...` as {NAME: (host, port)}."""
    found = {}
    for listener in text.split(","):
        name, _, address = listener.partition("://")
        host, _, port = address.rpartition(":")
        found[name] = (host, int(port))
    return found


def object_store_name(services: dict[str, Service]) -> str:
    """The S3 server: the object store image running `server`."""
    stores = [
        name
        for name, service in services.items()
        if str(service.get("image", "")).startswith(OBJECT_STORE_IMAGE + ":")
        and command_of(service)[:1] == ["server"]
    ]
    assert len(stores) == 1, f"expected one {OBJECT_STORE_IMAGE} server, found {stores}"
    return stores[0]


def store_option(argv: list[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def bucket_inits(services: dict[str, Service]) -> dict[str, list[str]]:
    """The services whose script makes a bucket (`mc mb`), with the buckets' `alias/name`."""
    found = {}
    for name, service in services.items():
        script = "\n".join(command_of(service))
        made = re.findall(r"\bmc mb (?:--ignore-existing |-p )*(\S+)", script)
        if made:
            found[name] = made
    return found


@dataclass(frozen=True)
class SparkDaemon:
    main_class: str
    positional: list[str]
    options: dict[str, str]


def spark_daemon(argv: list[str]) -> SparkDaemon | None:
    """A `spark-class <Master|Worker> ...` command line, parsed as the daemon would (an unknown
    flag or a flag without its value raises ValueError); None for any other command."""
    if argv[:1] != [SPARK_CLASS]:
        return None
    main_class, *rest = argv[1:]
    flags = {MASTER_CLASS: MASTER_FLAGS, WORKER_CLASS: WORKER_FLAGS}.get(main_class)
    if flags is None:
        raise ValueError(f"{SPARK_CLASS} {main_class}: not a standalone master or worker")
    positional: list[str] = []
    options: dict[str, str] = {}
    while rest:
        part = rest.pop(0)
        if part.startswith("--"):
            if part not in flags or not rest:
                raise ValueError(f"{main_class}: {part} is not a flag it takes with a value")
            options[part] = rest.pop(0)
        else:
            positional.append(part)
    if main_class == WORKER_CLASS and len(positional) != 1:
        raise ValueError(f"a worker takes one master URL, got {positional}")
    if main_class == MASTER_CLASS and positional:
        raise ValueError(f"a master takes no positional arguments, got {positional}")
    return SparkDaemon(main_class, positional, options)


def spark_daemons(services: dict[str, Service], main_class: str) -> dict[str, SparkDaemon]:
    found = {}
    for name, service in services.items():
        daemon = spark_daemon(command_of(service))
        if daemon is not None and daemon.main_class == main_class:
            found[name] = daemon
    return found


def megabytes(size: str) -> int:
    """A JVM memory size (`512m`, `2g`) in MiB."""
    match = re.fullmatch(r"(\d+)([mMgG])", size)
    assert match, f"not a memory size: {size!r}"
    return int(match.group(1)) * (1024 if match.group(2) in "gG" else 1)


# --- the Dockerfile -----------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    stage: str
    keyword: str
    arguments: str


@dataclass(frozen=True)
class Dockerfile:
    args: dict[str, str]
    """Global ARGs (before the first FROM) with their defaults."""
    parents: dict[str, str]
    """Each stage and what it is built FROM (an image, or another stage's name)."""
    instructions: list[Instruction]

    @property
    def final_stage(self) -> str:
        return list(self.parents)[-1]

    def stage(self, name: str, keyword: str) -> list[str]:
        return [i.arguments for i in self.instructions if i.stage == name and i.keyword == keyword]

    def base_image(self, stage: str) -> str:
        """The image a stage starts from, through the stages it is built FROM."""
        parent = self.parents[stage]
        if parent in self.parents:
            return self.base_image(parent)
        return re.sub(r"\$\{(\w+)\}", lambda match: self.args[match.group(1)], parent)

    def env(self, stage: str) -> dict[str, str]:
        """The environment an image stage sets, its parents' first."""
        parent = self.parents[stage]
        found = self.env(parent) if parent in self.parents else {}
        for arguments in self.stage(stage, "ENV"):
            for pair in shlex.split(arguments):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {arguments!r}: use the KEY=VALUE form"
                found[key] = value
        return found


@functools.cache
def read_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    lines: list[str] = []
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        # Docker drops comment lines, also inside an instruction continued over lines.
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends inside a continued instruction"
    args: dict[str, str] = {}
    parents: dict[str, str] = {}
    instructions: list[Instruction] = []
    stage = ""
    for line in lines:
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = arguments.split()
            stage = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(parents))
            parents[stage] = parts[0]
        elif keyword == "ARG" and not stage:
            name, _, default = arguments.partition("=")
            args[name] = default
        else:
            instructions.append(Instruction(stage, keyword, arguments.strip()))
    return Dockerfile(args, parents, instructions)


def copy_arguments(arguments: str) -> tuple[dict[str, str], list[str], str]:
    """COPY's flags, sources and destination."""
    parts = shlex.split(arguments)
    flags = dict(part[2:].partition("=")[::2] for part in parts if part.startswith("--"))
    paths = [part for part in parts if not part.startswith("--")]
    return flags, paths[:-1], paths[-1]


def dockerignore_patterns() -> list[str]:
    return [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def _pattern_matches(path: str, pattern: str) -> bool:
    parts = path.split("/")
    if pattern.startswith("**/"):
        # At any depth: any run of path components.
        tail = pattern[3:]
        return any(
            fnmatch.fnmatchcase("/".join(parts[start:end]), tail)
            for start in range(len(parts))
            for end in range(start + 1, len(parts) + 1)
        )
    # From the context's root; a matched folder takes everything inside it.
    return any(
        fnmatch.fnmatchcase("/".join(parts[:end]), pattern) for end in range(1, len(parts) + 1)
    )


def docker_ignores(path: str, patterns: list[str]) -> bool:
    """Whether `docker build` leaves `path` (relative to the context) out; later lines win."""
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = (pattern[1:] if negated else pattern).strip("/")
        if _pattern_matches(path, body):
            ignored = not negated
    return ignored


# --- settings and the CLI -----------------------------------------------------------------


def setting_variables() -> set[str]:
    """Every DISPATCH_<SECTION>__<NAME> variable the settings read."""
    names = set()
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type), section
        for name in getattr(model, "model_fields", {}):
            names.add(f"{ENV_PREFIX}{section.upper()}__{name.upper()}")
    return names


def unknown_variables(names: set[str]) -> list[str]:
    """The DISPATCH_* names that no setting, client or loader reads (typos, stale names)."""
    known = setting_variables() | set(CLIENT_VARIABLES) | set(LOADER_VARIABLES)
    return sorted(name for name in names if name.startswith(ENV_PREFIX) and name not in known)


def settings_under(environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process loads with exactly this DISPATCH_* environment."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in environment.items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value)
    return load_settings()


def container_environment(service: Service) -> dict[str, str]:
    """The environment of the service's container: the image's, then the service's."""
    image = read_dockerfile() if is_project_image(service) else None
    base = image.env(image.final_stage) if image is not None else {}
    return base | environment_of(service)


def dispatch_invocations(argv: list[str]) -> list[list[str]]:
    """The `dispatch` command lines a container command runs (directly or in a sh -c)."""
    if argv[:1] == ["dispatch"]:
        return [argv[1:]]
    if argv[:1] in (["sh"], ["bash"]) and "-c" in argv:
        script = argv[argv.index("-c") + 1]
        return [
            shlex.split(match)
            for match in re.findall(r"(?:^|[\s(;&|])dispatch\s+([^\n;&|)]*)", script)
        ]
    return []


def python_snippets(argv: list[str]) -> list[str]:
    if argv[:1] in (["python"], ["python3"]) and "-c" in argv:
        return [argv[argv.index("-c") + 1]]
    return []


@functools.cache
def dispatch_command() -> typer.core.TyperGroup:
    """The click command the `dispatch` entry point runs (building it is slow: once)."""
    command = typer.main.get_command(cli.app)
    assert isinstance(command, typer.core.TyperGroup)
    return command


def parse_cli(args: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse a `dispatch` command line as the installed entry point would, without running
    it: the subcommand's name and its parameters. An unknown command or option, or a value
    of the wrong type, raises typer.TyperException."""
    group = dispatch_command()
    context = typer.Context(group, info_name="dispatch")
    names: list[str] = []
    rest = list(args)
    while True:
        assert rest, f"`dispatch {' '.join(args)}` names no command"
        name = rest.pop(0)
        found = group.commands.get(name)
        if found is None:
            raise typer.BadParameter(f"no command {name!r} in `dispatch {' '.join(names)}`")
        names.append(name)
        if not isinstance(found, typer.core.TyperGroup):
            parsed = found.make_context(name, rest, parent=context)
            return " ".join(names), dict(parsed.params)
        group = found
        context = typer.Context(group, info_name=name, parent=context)


def invocations_of(services: dict[str, Service], subcommand: str) -> dict[str, dict[str, Any]]:
    """The services whose process is `dispatch <subcommand>`, with its parameters. A script's
    last `dispatch` line is its process (the `exec`); lines before it only prepare it."""
    found = {}
    for name, service in services.items():
        invocations = dispatch_invocations(command_of(service))
        if invocations:
            parsed_name, params = parse_cli(invocations[-1])
            if parsed_name == subcommand:
                found[name] = params
    return found


def topics_services(services: dict[str, Service]) -> list[str]:
    return [
        name
        for name, service in services.items()
        if any("create_topics" in code for code in python_snippets(command_of(service)))
    ]


def kafka_clients(services: dict[str, Service]) -> list[str]:
    """Services whose process talks to Kafka: API nodes, the streaming job, the topics init."""
    users = set(invocations_of(services, "serve")) | set(invocations_of(services, "streaming"))
    return sorted(users | set(topics_services(services)))


def one_shot(service: Service) -> bool:
    return str(service.get("restart", "no")) == "no"


# --- the schema ---------------------------------------------------------------------------


def schema_errors(document: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    # Draft 7, as the schema declares: jsonschema knows draft 7's metaschema by its
    # `http://...#` address only, not the `https://` one the file names.
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(str(part) for part in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def test_the_vendored_schema_is_the_pinned_copy(schema: dict[str, Any]) -> None:
    # Edited by hand, it would validate what Docker refuses; refresh it only as a whole copy.
    assert hashlib.sha256(SCHEMA_FILE.read_bytes()).hexdigest() == SCHEMA_SHA256
    assert schema["$schema"] == "https://json-schema.org/draft-07/schema"


def test_the_compose_file_follows_the_compose_specification(
    compose: dict[str, Any], schema: dict[str, Any]
) -> None:
    assert schema_errors(compose, schema) == []


def test_the_schema_check_finds_mistakes(compose: dict[str, Any], schema: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    worker = next(iter(broken["services"].values()))
    worker["depends_on"] = {"kafka": {"condition": "service_ready"}}
    worker["deploy"] = {"replica": 2}
    errors = schema_errors(broken, schema)
    assert any("service_ready" in error for error in errors), errors
    assert any("replica" in error for error in errors), errors


def test_no_host_interpolation(compose: dict[str, Any]) -> None:
    # Compose fills `$NAME` from the host's environment, silently empty when unset: a shell
    # variable meant for the container must be written `$$NAME`.
    unescaped = [text for text in strings(compose) if "$" in text.replace("$$", "")]
    assert unescaped == []


def test_what_docker_compose_config_refuses(
    services: dict[str, Service], named_volumes: set[str]
) -> None:
    # What `docker compose config` / `up` check beyond the schema, without a Docker engine.
    used = set()
    for name, service in services.items():
        for mount in mounts_of(service):
            if not mount.source.startswith((".", "/")):
                assert mount.source in named_volumes, f"{name}: undefined volume {mount.source}"
                used.add(mount.source)
    assert named_volumes == used, f"declared but never mounted: {named_volumes - used}"
    # Two services cannot bind one host port.
    published = [port for service in services.values() for port, _ in published_ports(service)]
    assert len(published) == len(set(published)), f"host ports published twice: {published}"
    # A cycle in depends_on is refused.
    visiting: list[str] = []

    def visit(name: str) -> None:
        assert name not in visiting, f"depends_on cycle: {[*visiting, name]}"
        visiting.append(name)
        for target in depends_on(services[name]):
            visit(target)
        visiting.pop()

    for name in services:
        visit(name)
    # A hostname other than the service name would be advertised (Kafka, Spark, MinIO) but not
    # resolved: the network knows containers by their service names.
    for name, service in services.items():
        assert service.get("hostname", name) == name, f"{name}: hostname {service['hostname']}"


# --- settings -----------------------------------------------------------------------------


def test_variable_names_are_settings(services: dict[str, Service]) -> None:
    image = read_dockerfile()
    names = {name for service in services.values() for name in environment_of(service)}
    for stage in image.parents:
        names |= set(image.env(stage))
    assert unknown_variables(names) == []


def test_the_name_check_finds_typos() -> None:
    names = {"DISPATCH_KAFKA__BOOTSTRAP", "DISPATCH_KAFKA__BOOTSTRAPS", "DISPATCH_APII__HOST"}
    assert unknown_variables(names) == ["DISPATCH_APII__HOST", "DISPATCH_KAFKA__BOOTSTRAPS"]


def test_client_variables_are_read_by_the_client() -> None:
    source = inspect.getsource(dispatch.client)
    for name in CLIENT_VARIABLES:
        assert f'"{name}"' in source, name


def test_every_service_loads_valid_settings(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Values too: a path, a port, a URL that does not validate fails here, not at start.
    for service in services.values():
        if is_project_image(service):
            settings_under(container_environment(service), monkeypatch)


# --- the services -------------------------------------------------------------------------


def test_every_project_service_runs_a_real_command(services: dict[str, Service]) -> None:
    for name, service in services.items():
        if not is_project_image(service):
            continue
        argv = command_of(service)
        if spark_daemon(argv) is not None:
            # pip installs pyspark's launcher among the interpreter's scripts (/usr/local/bin
            # in the image, on its PATH), as it did here.
            assert (Path(sysconfig.get_path("scripts")) / SPARK_CLASS).is_file(), SPARK_CLASS
            continue
        invocations = dispatch_invocations(argv)
        snippets = python_snippets(argv)
        assert invocations or snippets, f"{name}: unrecognised command {argv}"
        for args in invocations:
            parse_cli(args)
        for code in snippets:
            tree = ast.parse(code)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module is not None:
                    module = importlib.import_module(node.module)
                    for alias in node.names:
                        assert hasattr(module, alias.name), f"{name}: {node.module}.{alias.name}"


def test_the_command_check_finds_mistakes() -> None:
    name, params = parse_cli(["serve", "--port", "8000"])
    assert (name, params["port"]) == ("serve", 8000)
    for wrong in (["srve"], ["serve", "--prot", "8000"], ["serve", "--port", "eighty"]):
        with pytest.raises(typer.TyperException):
            parse_cli(wrong)


def test_one_image_built_from_the_dockerfile(services: dict[str, Service]) -> None:
    built = {name: service for name, service in services.items() if is_project_image(service)}
    assert built
    images = {str(service.get("image")) for service in built.values()}
    assert len(images) == 1, f"the project services should share one image tag, not {images}"
    image = read_dockerfile()
    for name, service in built.items():
        build = service["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        assert (PROJECT_ROOT / context).resolve() == PROJECT_ROOT, name
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "")
        assert dockerfile in ("", "Dockerfile"), name
        if isinstance(build, dict) and "target" in build:
            assert build["target"] == image.final_stage, name


def test_api_nodes_and_the_fold_share_one_warehouse_on_the_object_store(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = invocations_of(services, "serve")
    assert len(nodes) == 3, f"expected three API nodes, found {sorted(nodes)}"
    ports = {name: params["port"] for name, params in nodes.items()}
    assert len(set(ports.values())) == 3, f"API nodes need distinct ports: {ports}"
    node_ids = {params["node_id"] or f"node-{params['port']}" for params in nodes.values()}
    assert len(node_ids) == 3, f"API nodes need distinct node ids: {node_ids}"
    streaming = invocations_of(services, "streaming")
    assert len(streaming) == 1, f"expected one streaming job, found {sorted(streaming)}"
    [(init, [made])] = bucket_inits(services).items()
    warehouses = set()
    writers: dict[str, list[str]] = {}
    for name in [*nodes, *streaming]:
        service = services[name]
        settings = settings_under(container_environment(service), monkeypatch)
        # The URI as the settings hand it to delta-rs and Spark: `s3://bucket/prefix`, intact.
        warehouses.add(str(settings.paths.warehouse).rstrip("/"))
        for mount in mounts_of(service):
            if not mount.read_only:
                writers.setdefault(mount.source, []).append(name)
        assert depends_on(service).get(init) == "service_completed_successfully", name
    assert len(warehouses) == 1, f"the API nodes and the fold share no warehouse: {warehouses}"
    # The lease table lives in the warehouse, on the store: no volume of one host is shared
    # (written by two of them), which would tie the nodes to that host.
    assert all(len(names) == 1 for names in writers.values()), f"volumes shared: {writers}"
    [warehouse] = warehouses
    location = urlsplit(warehouse)
    assert location.scheme == "s3" and location.path.strip("/"), warehouse
    # The bucket is the one the init makes.
    assert made.partition("/")[2] == location.netloc, f"{init} makes {made}, not {location.netloc}"


def test_storage_clients_reach_the_store_with_its_account(services: dict[str, Service]) -> None:
    store = object_store_name(services)
    store_env = environment_of(services[store])
    argv = command_of(services[store])
    port = int(store_option(argv, "--address", ":9000").rpartition(":")[2])
    clients = [
        *invocations_of(services, "serve"),
        *invocations_of(services, "streaming"),
        # Executors write the warehouse's Delta files too (a prune's moves).
        *spark_daemons(services, WORKER_CLASS),
    ]
    for name in clients:
        environment = container_environment(services[name])
        missing = [key for key in STORAGE_VARIABLES if not environment.get(key)]
        assert not missing, f"{name}: set {missing}"
        endpoint = urlsplit(environment["AWS_ENDPOINT_URL"])
        assert (endpoint.hostname, endpoint.port) == (store, port), f"{name}: {endpoint.geturl()}"
        # Plain HTTP inside the network: object_store (delta-rs) refuses it unless allowed.
        if endpoint.scheme == "http":
            assert environment.get("AWS_ALLOW_HTTP") == "true", name
        account = (environment["AWS_ACCESS_KEY_ID"], environment["AWS_SECRET_ACCESS_KEY"])
        assert account == (store_env["MINIO_ROOT_USER"], store_env["MINIO_ROOT_PASSWORD"]), name


def test_dispatch_processes_get_the_stores_options(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What delta-rs is handed for the warehouse (the lease table's compare-and-swap included),
    # by dispatch.storage from each process's settings and environment: the store's endpoint
    # and account, plain HTTP allowed inside the network (refused otherwise), path-style
    # requests, conditional writes.
    store = object_store_name(services)
    store_env = environment_of(services[store])
    port = store_option(command_of(services[store]), "--address", ":9000").rpartition(":")[2]
    for name in [*invocations_of(services, "serve"), *invocations_of(services, "streaming")]:
        environment = container_environment(services[name])
        settings = settings_under(environment, monkeypatch)
        options = storage_options(settings.storage, str(settings.paths.warehouse), environment)
        assert options["aws_endpoint"] == f"http://{store}:{port}", name
        assert options["aws_allow_http"] == "true", name
        assert options["aws_virtual_hosted_style_request"] == "false", name
        assert options["aws_conditional_put"] == "etag", name
        assert (options["aws_access_key_id"], options["aws_secret_access_key"]) == (
            store_env["MINIO_ROOT_USER"],
            store_env["MINIO_ROOT_PASSWORD"],
        ), name


def test_the_object_store_keeps_its_data_and_the_bucket_is_made_once(
    services: dict[str, Service], named_volumes: set[str]
) -> None:
    store = object_store_name(services)
    service = services[store]
    argv = command_of(service)
    # `server DIR [--address :PORT] [--console-address :PORT]`
    data_dir = argv[1]
    assert any(m.target == data_dir and m.source in named_volumes for m in mounts_of(service)), (
        f"{store}: {data_dir} is on no named volume"
    )
    # MinIO refuses a root password under 8 characters.
    assert len(environment_of(service)["MINIO_ROOT_PASSWORD"]) >= 8
    healthcheck = service.get("healthcheck")
    assert healthcheck and not healthcheck.get("disable"), f"{store}: no healthcheck"
    port = store_option(argv, "--address", ":9000").rpartition(":")[2]
    [(init, made)] = bucket_inits(services).items()
    assert one_shot(services[init]), f"{init} runs once: restart must be 'no'"
    assert depends_on(services[init]).get(store) == "service_healthy", init
    entrypoint = services[init].get("entrypoint")
    assert entrypoint in (["/bin/sh", "-c"], ["sh", "-c"]), f"{init}: the script needs a shell"
    script = "\n".join(command_of(services[init]))
    # The alias the bucket is made under points at the store, with the store's own account
    # (the init's environment gives the same values: `$MINIO_ROOT_USER`...).
    for target in made:
        alias = target.partition("/")[0]
        assert re.search(
            rf"mc alias set {alias} http://{store}:{port} "
            r'"\$MINIO_ROOT_USER" "\$MINIO_ROOT_PASSWORD"',
            script,
        ), script
    init_env = environment_of(services[init])
    store_env = environment_of(service)
    for key in ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"):
        assert init_env.get(key) == store_env[key], f"{init}: {key}"
    # Made again on every start: must succeed when it exists.
    assert "--ignore-existing" in script


def test_api_nodes_listen_advertise_and_publish_their_port(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, params in invocations_of(services, "serve").items():
        service, port = services[name], params["port"]
        settings = settings_under(container_environment(service), monkeypatch)
        # Loopback inside a container is unreachable from the others.
        assert settings.api.host == "0.0.0.0", name
        assert (port, port) in published_ports(service), f"{name}: publish {port}:{port}"
        # The address in the lease and in every 307 must reach this node from the network.
        assert settings.api.advertise_url == f"http://{name}:{port}", name


def test_api_nodes_have_a_liveness_healthcheck(services: dict[str, Service]) -> None:
    for name, params in invocations_of(services, "serve").items():
        healthcheck = services[name].get("healthcheck")
        assert healthcheck and not healthcheck.get("disable"), f"{name}: no healthcheck"
        test = healthcheck["test"]
        text = " ".join(test) if isinstance(test, list) else str(test)
        url = f"http://127.0.0.1:{params['port']}/healthz"
        assert url in text, f"{name}: the healthcheck should fetch {url}"
        for code in python_snippets(test[1:] if test[0] in ("CMD", "CMD-SHELL") else test):
            compile(code, f"{name} healthcheck", "exec")


def test_streaming_and_api_nodes_serve_one_group(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    members = [*invocations_of(services, "serve"), *invocations_of(services, "streaming")]
    seen = {}
    for name in members:
        settings = settings_under(container_environment(services[name]), monkeypatch)
        seen[name] = (settings.dispatcher.group, settings.kafka.events_topic)
    assert len(set(seen.values())) == 1, f"group and events topic differ: {seen}"


def test_the_streaming_checkpoint_survives_restarts(
    services: dict[str, Service], named_volumes: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in invocations_of(services, "streaming"):
        settings = settings_under(container_environment(services[name]), monkeypatch)
        checkpoints = settings.paths.checkpoint_root()
        if is_object_store(checkpoints):
            # Beside the warehouse, on the store every container reaches.
            assert scheme(checkpoints) == scheme(settings.paths.warehouse), checkpoints
            continue
        local = PurePosixPath(checkpoints)
        assert any(
            local.is_relative_to(PurePosixPath(m.target)) and m.source in named_volumes
            for m in mounts_of(services[name])
        ), f"{name}: the checkpoint ({checkpoints}) is not on a named volume"


def test_kafka_clients_know_every_broker(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = broker_names(services)
    # The address each broker advertises in the network: its service name.
    in_network = set()
    for broker in brokers:
        advertised = listeners(environment_of(services[broker])["KAFKA_ADVERTISED_LISTENERS"])
        host, port = advertised["PLAINTEXT"]
        assert host == broker, f"{broker} advertises {host}: not a name the network resolves"
        in_network.add(f"{host}:{port}")
    clients = kafka_clients(services)
    assert len(clients) >= 5, f"expected topics, streaming and three API nodes: {clients}"
    for name in clients:
        settings = settings_under(container_environment(services[name]), monkeypatch)
        # All of them: a client must start (and find the cluster) while any one is down.
        servers = {server.strip() for server in settings.kafka.bootstrap.split(",")}
        assert servers == in_network, (
            f"{name}: DISPATCH_KAFKA__BOOTSTRAP={settings.kafka.bootstrap}, but the brokers "
            f"advertise {sorted(in_network)} in the network"
        )
        # The brokers are containers: no dispatch process may start or format one.
        assert settings.kafka.external, f"{name}: set DISPATCH_KAFKA__EXTERNAL"
        assert settings.kafka.brokers == len(brokers), name
        for broker in brokers:
            assert depends_on(services[name]).get(broker) == "service_healthy", (name, broker)


def test_the_brokers_form_one_quorum(services: dict[str, Service], named_volumes: set[str]) -> None:
    brokers = broker_names(services)
    environments = {name: environment_of(services[name]) for name in brokers}
    # One cluster: one id to format every node's storage with, one set of voters.
    assert len({env["CLUSTER_ID"] for env in environments.values()}) == 1
    voters = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in environments.values()}
    assert len(voters) == 1, f"the nodes disagree on the quorum: {voters}"
    quorum = {}
    for voter in voters.pop().split(","):
        node_id, _, address = voter.partition("@")
        voter_host, _, voter_port = address.rpartition(":")
        quorum[voter_host] = (node_id, int(voter_port))
    assert sorted(quorum) == brokers, f"every node votes: {quorum}"
    data_volumes = set()
    host_ports = set()
    for name, env in environments.items():
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, name
        node_id, controller_port = quorum[name]
        assert env["KAFKA_NODE_ID"] == node_id, f"{name}: node id {env['KAFKA_NODE_ID']}"
        own = listeners(env["KAFKA_LISTENERS"])
        assert own[env["KAFKA_CONTROLLER_LISTENER_NAMES"]][1] == controller_port, name
        assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in own, name
        protocols = env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
        assert set(own) <= {pair.partition(":")[0] for pair in protocols}, f"{name}: protocol"
        # The host's listener: published on the host's loopback at the port it advertises.
        advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
        for listener, (host, port) in advertised.items():
            if host == "localhost":
                assert (port, own[listener][1]) in published_ports(services[name]), name
                assert all(
                    str(spec).startswith("127.0.0.1:") for spec in services[name]["ports"]
                ), f"{name}: a listener without authentication, published beyond loopback"
                host_ports.add(port)
        data_dir = env["KAFKA_LOG_DIRS"]
        [mount] = [m for m in mounts_of(services[name]) if m.target == data_dir]
        assert mount.source in named_volumes, f"{name}: its log must be on a named volume"
        data_volumes.add(mount.source)
        healthcheck = services[name].get("healthcheck")
        assert healthcheck and not healthcheck.get("disable"), f"{name} needs a healthcheck"
    assert len(data_volumes) == len(brokers), f"each node needs a log of its own: {data_volumes}"
    assert len(host_ports) == len(brokers), f"each node needs a host port of its own: {host_ports}"


def test_the_brokers_are_configured_like_the_local_cluster(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = broker_names(services)
    # The same Kafka the tests run against: the version of the broker jars in stack/jars.lock.
    [version] = [
        match.group(1)
        for jar in jars.read_lock()["broker"]
        if (match := re.fullmatch(r"kafka_2\.13-([\d.]+)\.jar", jar.file_name))
    ]
    # The local cluster the clients' settings describe (`dispatch up` with three brokers).
    [topics] = topics_services(services)
    kafka = settings_under(container_environment(services[topics]), monkeypatch).kafka
    # Three copies of every record, two written before a write is acknowledged: one broker
    # may die without losing an acknowledged record or stopping the dispatcher.
    assert (kafka.brokers, kafka.replication_factor, kafka.min_insync_replicas) == (3, 3, 2)
    for name in brokers:
        broker = services[name]
        environment = environment_of(broker)
        assert broker["image"] == f"{BROKER_IMAGE}:{version}", name
        local = server_properties(kafka, Path("/unused"), int(environment["KAFKA_NODE_ID"]))
        for key, value in local.items():
            if key in NODE_PROPERTIES:
                continue
            # apache/kafka turns KAFKA_A_B into a.b.
            variable = "KAFKA_" + key.upper().replace(".", "_")
            assert environment.get(variable) == value, f"{name}: {variable} should be {value}"
        assert int(environment["KAFKA_REPLICA_FETCH_MAX_BYTES"]) >= TOPIC_MAX_MESSAGE_BYTES


def test_the_topics_init_makes_the_dispatcher_topics(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    [name] = topics_services(services)
    assert one_shot(services[name]), f"{name} runs once: restart must be 'no'"
    settings = settings_under(container_environment(services[name]), monkeypatch)
    assert settings.kafka.topics == {
        "dispatch.submit": 2,
        "dispatch.events": 1,
        "dispatch.submit.rejected": 1,
    }
    # create_topics makes them with these: every broker holds a replica, two acknowledge.
    assert (settings.kafka.replication_factor, settings.kafka.min_insync_replicas) == (3, 2)
    assert TOPIC_MAX_MESSAGE_BYTES == 16 * 1024 * 1024


def test_start_order_and_restarts(services: dict[str, Service]) -> None:
    topics = topics_services(services)
    keys = list(invocations_of(services, "keys"))
    assert len(keys) == 1, f"expected one keys service, found {keys}"
    buckets = list(bucket_inits(services))
    for name, service in services.items():
        for target, condition in depends_on(service).items():
            assert target in services, f"{name} depends on unknown {target}"
            if condition == "service_healthy":
                check = services[target].get("healthcheck")
                assert check and not check.get("disable"), f"{name}: {target} has no healthcheck"
            if condition == "service_completed_successfully":
                assert one_shot(services[target]), f"{name}: {target} must run once"
        if one_shot(service):
            assert name in [*topics, *keys, *buckets], f"{name} does not restart"
        else:
            assert service.get("restart") in LONG_RUNNING_RESTARTS, f"{name}: restart policy"
    for name in [*invocations_of(services, "serve"), *invocations_of(services, "streaming")]:
        for init in [*topics, *buckets]:
            assert depends_on(services[name]).get(init) == "service_completed_successfully"
    for name in invocations_of(services, "serve"):
        assert depends_on(services[name]).get(keys[0]) == "service_completed_successfully"


def test_the_fold_drives_the_spark_cluster(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    [(master_name, master)] = spark_daemons(services, MASTER_CLASS).items()
    workers = spark_daemons(services, WORKER_CLASS)
    assert workers, "no Spark worker"
    # Other containers reach a service by its name; the master advertises the name it binds.
    assert master.options.get("--host") == master_name, f"{master_name}: --host {master_name}"
    master_url = f"spark://{master_name}:{master.options.get('--port', '7077')}"
    [(streaming_name, _)] = invocations_of(services, "streaming").items()
    streaming = services[streaming_name]
    spark = settings_under(container_environment(streaming), monkeypatch).spark
    assert spark.master == master_url, f"{streaming_name}: spark.master should be {master_url}"
    # Executors connect back to the driver: by a name the network resolves, on its interfaces.
    assert spark.driver_host == streaming_name, f"{streaming_name}: spark.driver_host"
    assert spark.driver_bind_address == "0.0.0.0", f"{streaming_name}: driver_bind_address"
    for name, worker in workers.items():
        assert worker.positional == [master_url], f"{name} registers with {worker.positional}"
        # The driver connects to the executors at the address their worker advertises.
        assert worker.options.get("--host") == name, f"{name}: --host {name}"
        memory = worker.options.get("--memory", "1g")
        assert megabytes(spark.executor_memory) <= megabytes(memory), (
            f"{name}: executors of {spark.executor_memory} do not fit --memory {memory}"
        )
        assert int(worker.options.get("--cores", "1")) >= 1, name
        assert depends_on(services[name]).get(master_name) == "service_healthy", name
        assert depends_on(streaming).get(name) == "service_healthy", f"{streaming_name}: {name}"
    assert depends_on(streaming).get(master_name) == "service_healthy", streaming_name
    for name, daemon in [(master_name, master), *workers.items()]:
        healthcheck = services[name].get("healthcheck")
        assert healthcheck and not healthcheck.get("disable"), f"{name}: no healthcheck"
        ui = f"http://127.0.0.1:{daemon.options.get('--webui-port', '8080')}/json/"
        assert ui in " ".join(healthcheck["test"]), f"{name}: the healthcheck should fetch {ui}"


def test_api_nodes_read_the_keys_the_keys_service_writes(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    [keys] = invocations_of(services, "keys")

    def volume_file(name: str, path: Path) -> tuple[str, PurePosixPath]:
        for mount in mounts_of(services[name]):
            target = PurePosixPath(mount.target)
            if PurePosixPath(path).is_relative_to(target):
                return mount.source, PurePosixPath(path).relative_to(target)
        raise AssertionError(f"{name}: {path} is on no volume")

    written = settings_under(container_environment(services[keys]), monkeypatch).auth
    keys_file = volume_file(keys, written.keys_file)
    dev_keys_file = volume_file(keys, written.dev_keys_file)
    for name in invocations_of(services, "serve"):
        auth = settings_under(container_environment(services[name]), monkeypatch).auth
        assert volume_file(name, auth.keys_file) == keys_file, name
    # A worker's `dispatch keys --role worker` reads both (a missing one would be remade).
    for name in invocations_of(services, "worker"):
        auth = settings_under(container_environment(services[name]), monkeypatch).auth
        assert volume_file(name, auth.keys_file) == keys_file, name
        assert volume_file(name, auth.dev_keys_file) == dev_keys_file, name


def test_workers_scale_and_reach_every_node(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = invocations_of(services, "worker")
    assert workers, "no `dispatch worker` service"
    nodes = {
        settings_under(container_environment(services[name]), monkeypatch).api.advertise_url
        for name in invocations_of(services, "serve")
    }
    for name, params in workers.items():
        service = services[name]
        replicas = service.get("deploy", {}).get("replicas")
        assert replicas is not None and int(replicas) >= 1, f"{name}: set deploy.replicas"
        # A fixed name or host port would stop a second replica from starting.
        assert "container_name" not in service and not service.get("ports"), name
        environment = container_environment(service)
        assert set(dispatch.client.parse_urls(environment["DISPATCH_URL"])) == nodes, name
        script = " ".join(command_of(service))
        assert "DISPATCH_API_KEY" in environment or "DISPATCH_API_KEY" in script, name
        app = load_app(params["app_reference"])
        subjects = [part for item in params["subjects"] or [] for part in item.split(",")]
        app.options(subjects=subjects or None, grace_s=params["grace"])
        # The worker role's key, read from the keys volume before the worker starts.
        ran = [parse_cli(args) for args in dispatch_invocations(command_of(service))]
        assert any(run == "keys" and params.get("role") == "worker" for run, params in ran), name
        for target in invocations_of(services, "serve"):
            assert depends_on(service).get(target) in ("service_started", "service_healthy")


# --- the Dockerfile and .dockerignore -------------------------------------------------------


def test_the_image_has_python_and_java() -> None:
    image = read_dockerfile()
    final = image.final_stage
    assert image.base_image(final).startswith("python:3.11-slim"), image.base_image(final)
    runs = " ".join(arguments for stage in image.parents for arguments in image.stage(stage, "RUN"))
    assert re.search(r"openjdk-17-jre-headless|temurin", runs), "no Java for Spark"
    assert re.search(r"pip install [^&]*-c constraints\.txt", runs), "pip must use the pins"


def test_the_image_installs_the_project_where_its_files_are() -> None:
    image = read_dockerfile()
    final = image.final_stage
    workdir = image.stage(final, "WORKDIR") or image.stage(image.parents[final], "WORKDIR")
    # Editable: dispatch.settings finds conf/ and stack/ beside the package (PROJECT_ROOT).
    runs = " ".join(image.stage(final, "RUN"))
    assert re.search(r"pip install [^&]*-e \.", runs), runs
    assert workdir, "no WORKDIR"
    copied = [copy_arguments(arguments) for arguments in image.stage(final, "COPY")]
    assert any(not flags and sources == ["."] for flags, sources, _ in copied)
    [command] = image.stage(final, "CMD")
    argv = json.loads(command)
    assert argv[0] == "dispatch"
    if argv[1:] != ["--help"]:
        parse_cli(argv[1:])


def test_the_image_has_the_verified_spark_jars(monkeypatch: pytest.MonkeyPatch) -> None:
    image = read_dockerfile()
    runs = {stage: " ".join(image.stage(stage, "RUN")) for stage in image.parents}
    for module in re.findall(r"python -m ([\w.]+)", " ".join(runs.values())):
        assert importlib.util.find_spec(module) is not None, f"RUN python -m {module}"
    [jars_stage] = [stage for stage, text in runs.items() if "-m dispatch.stack.jars fetch" in text]
    # What `python -m dispatch.stack.jars fetch` does under that stage's environment.
    fetched: list[Path] = []
    monkeypatch.setattr(jars, "fetch", lambda cache, maven_repo: fetched.append(cache))
    settings_under(image.env(jars_stage), monkeypatch)
    assert jars.main(["fetch"]) == 0
    [cache] = fetched
    final = image.final_stage
    final_cache = settings_under(image.env(final), monkeypatch).jar_cache
    from_jars = [
        (sources, destination)
        for flags, sources, destination in map(copy_arguments, image.stage(final, "COPY"))
        if flags.get("from") == jars_stage
    ]
    # The final image reads each set a Spark driver loads exactly where the jars stage
    # verified it; the others (the brokers' and the test S3 server's) stay in the build stage.
    assert set(SPARK_JAR_SETS) <= set(jars.JAR_SETS)
    assert from_jars == [
        ([str(jars.set_dir(cache, name))], str(jars.set_dir(final_cache, name)))
        for name in SPARK_JAR_SETS
    ]


def test_the_build_context_has_what_the_image_needs() -> None:
    image = read_dockerfile()
    patterns = dockerignore_patterns()
    needed = {"README.md", "pyproject.toml", "constraints.txt", "conf/defaults.toml"}
    needed |= {"stack/jars.lock", "stack/maven/spark/pom.xml", "stack/maven/broker/pom.xml"}
    # Every package pyproject.toml installs.
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    needed |= {
        f"{path.name}/__init__.py"
        for path in PROJECT_ROOT.iterdir()
        if (path / "__init__.py").is_file() and any(fnmatch.fnmatch(path.name, p) for p in include)
    }
    for stage in image.parents:
        for flags, sources, _ in map(copy_arguments, image.stage(stage, "COPY")):
            if "from" not in flags:
                needed |= {source.rstrip("/") for source in sources if source != "."}
    for path in sorted(needed):
        assert (PROJECT_ROOT / path).exists(), f"{path} does not exist"
        assert not docker_ignores(path, patterns), f".dockerignore leaves out {path}"


def test_the_build_context_leaves_out_local_state() -> None:
    patterns = dockerignore_patterns()
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        "var/kafka/broker.log",
        "var/delta/jobs/_delta_log/0.json",
        ".mypy_cache/3.11/x.json",
        ".ruff_cache/x",
        ".pytest_cache/v/x",
        "dispatch/__pycache__/cli.cpython-311.pyc",
        "dispatch.egg-info/PKG-INFO",
    ):
        assert docker_ignores(path, patterns), f".dockerignore should leave out {path}"
