"""Storage locations: a local path or an object-store URI, and delta-rs' options for it.

A location is a string: a local path (`/srv/dispatch/delta`, `var/delta`) or a URI
(`s3://bucket/prefix`, `s3a://...`, `file:///...`, and whatever else delta-rs reads:
`abfss://`, `gs://`). Tables live under a location by name (`join(warehouse, "leases")`).

Object storage (S3 and S3-compatible servers) is configured by `StorageSettings` and by the
usual AWS environment variables, which fill in what the settings leave empty. Commits stay
safe on S3 without a lock service: delta-rs (1.x, object_store 0.13) writes each commit file
with `PutObject` + `If-None-Match: *`, so of two writers of version v+1 exactly one succeeds
and the other gets 412 (a `CommitFailedError`). `storage_options` asks for that mode
explicitly (`aws_conditional_put = etag`) and pins `AWS_S3_ALLOW_UNSAFE_RENAME` off, so a
stray environment variable cannot switch a process to the unsafe rename.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    # Only a type here: dispatch.settings imports this module to normalize its locations.
    from dispatch.settings import StorageSettings

S3_SCHEMES = frozenset({"s3", "s3a"})
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
"""A scheme of two letters or more: `C:/x` (a Windows drive) is a path, not a URI."""


def is_uri(location: str | Path) -> bool:
    """Whether `location` is a URI (`scheme://...`) rather than a local path."""
    return isinstance(location, str) and _URI.match(location) is not None


def scheme(location: str | Path) -> str:
    """The URI scheme in lower case (`s3`), or `file` for a local path."""
    if not is_uri(location):
        return "file"
    return str(location).split("://", 1)[0].lower()


def is_object_store(location: str | Path) -> bool:
    """Whether `location` is on an object store (anything but a local path or `file://`)."""
    return scheme(location) != "file"


def normalize(location: str | Path) -> str:
    """`location` as delta-rs takes it: a URI without a trailing slash, or an absolute path.

    A relative path is resolved against the working directory (settings resolve theirs against
    the project root before this)."""
    if is_uri(location):
        text = str(location)
        head, _, rest = text.partition("://")
        if not rest.strip("/"):
            raise ValueError(f"a storage URI needs a bucket or host: {text!r}")
        return f"{head.lower()}://{rest.rstrip('/')}"
    text = str(location)
    if not text:
        raise ValueError("empty storage location")
    return str(Path(text).expanduser().absolute())


def join(location: str | Path, *names: str) -> str:
    """`location` / names: a table (or any object prefix) under a location.

    Names are single path segments (`leases`, `_checkpoints`), so a name can never climb out
    of its location (`..`) or restart it (`/abs`)."""
    for name in names:
        if not name or name in {".", ".."} or "/" in name or "\\" in name:
            raise ValueError(f"not a single path segment: {name!r}")
    base = normalize(location)
    if is_uri(base):
        return "/".join([base, *names])
    return str(Path(base).joinpath(*names))


def local_path(location: str | Path) -> Path:
    """The local path of a location that is on local disk (a path or a `file://` URI)."""
    if not is_uri(location):
        return Path(normalize(location))
    if scheme(location) == "file":
        return Path(urlsplit(str(location)).path)
    raise ValueError(f"not a local location: {location!r}")


def is_loopback(endpoint: str) -> bool:
    """Whether the URL's host is this machine (`localhost`, 127.0.0.0/8, ::1)."""
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _first(environ: Mapping[str, str], *names: str) -> str:
    for name in names:
        if value := environ.get(name, ""):
            return value
    return ""


def storage_options(
    settings: StorageSettings,
    location: str | Path,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """delta-rs `storage_options` for `location`: {} for a local path; for S3, credentials,
    endpoint and region from `settings`, else from the AWS environment variables
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION /
    AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, and object_store's
    AWS_ALLOW_HTTP), plus the safe-commit mode.

    Without keys from either, delta-rs resolves credentials itself (profile, web identity,
    instance metadata), as any AWS SDK would."""
    if not is_object_store(location):
        return {}
    if scheme(location) not in S3_SCHEMES:
        # ADLS, GCS: delta-rs' own environment variables configure them; nothing to add.
        return {}
    env = os.environ if environ is None else environ
    endpoint = settings.endpoint_url or _first(env, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    options: dict[str, str] = {
        # Every commit file is written with If-None-Match: * (object_store's default for S3
        # since 0.12, pinned here so it cannot silently change); no lock table anywhere.
        "aws_conditional_put": "etag",
        # Checked by delta-rs in the options before the environment: never the unsafe rename.
        "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
        "timeout": f"{settings.request_timeout_s:g}s",
        "connect_timeout": f"{settings.connect_timeout_s:g}s",
        "max_retries": str(settings.max_retries),
        "retry_timeout": f"{settings.retry_timeout_s:g}s",
    }
    region = settings.region or _first(env, "AWS_REGION", "AWS_DEFAULT_REGION")
    if region:
        options["aws_region"] = region
    elif endpoint:
        # An S3-compatible server ignores the region but the request signature names one.
        options["aws_region"] = "us-east-1"
    if endpoint:
        options["aws_endpoint"] = endpoint
        if endpoint.lower().startswith("http://"):
            allowed = settings.allow_http or _truthy(env.get("AWS_ALLOW_HTTP", ""))
            if not (allowed or is_loopback(endpoint)):
                raise ValueError(
                    f"storage endpoint {endpoint} is plain HTTP: credentials and data would "
                    "cross the network unencrypted; use https, or set storage.allow_http"
                )
            options["aws_allow_http"] = "true"
        # Path-style requests (http://host/bucket/key): what S3-compatible servers answer.
        options["aws_virtual_hosted_style_request"] = (
            "true" if settings.virtual_hosted_style else "false"
        )
    access_key = settings.access_key_id or env.get("AWS_ACCESS_KEY_ID", "")
    secret_key = settings.secret_access_key or env.get("AWS_SECRET_ACCESS_KEY", "")
    if access_key and secret_key:
        options["aws_access_key_id"] = access_key
        options["aws_secret_access_key"] = secret_key
        token = settings.session_token or env.get("AWS_SESSION_TOKEN", "")
        if token:
            options["aws_session_token"] = token
    elif access_key or secret_key:
        raise ValueError(
            "storage credentials need both an access key id and a secret access key "
            "(storage.access_key_id / storage.secret_access_key or AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY)"
        )
    return options


# --- reading files at a location (the streaming checkpoint) -------------------------------------


def _filesystem(location: str, options: Mapping[str, str]) -> tuple[Any, str]:
    """A pyarrow filesystem for `location` and the location's path within it.

    pyarrow, because delta-rs has no file API and the checkpoint files are plain objects; its
    S3 client is configured from the same options delta-rs takes, so both reach the same
    store with the same credentials."""
    import pyarrow.fs as pafs

    if not is_object_store(location):
        return pafs.LocalFileSystem(), str(local_path(location))
    if scheme(location) not in S3_SCHEMES:
        filesystem, path = pafs.FileSystem.from_uri(location)
        return filesystem, path
    return _s3_filesystem(tuple(sorted(options.items()))), str(location).split("://", 1)[1]


@functools.lru_cache(maxsize=8)
def _s3_filesystem(option_items: tuple[tuple[str, str], ...]) -> Any:
    """One S3 client per set of options: the fold reads the checkpoint's offset log every
    batch, and a new client each time would redo its setup (and connections) per batch."""
    import pyarrow.fs as pafs

    options = dict(option_items)
    endpoint = urlsplit(options.get("aws_endpoint", ""))
    return pafs.S3FileSystem(
        access_key=options.get("aws_access_key_id"),
        secret_key=options.get("aws_secret_access_key"),
        session_token=options.get("aws_session_token"),
        region=options.get("aws_region"),
        endpoint_override=endpoint.netloc or None,
        scheme=endpoint.scheme or "https",
        force_virtual_addressing=options.get("aws_virtual_hosted_style_request") == "true",
        connect_timeout=_seconds(options.get("connect_timeout")),
        request_timeout=_seconds(options.get("timeout")),
    )


def _seconds(text: str | None) -> float | None:
    return float(text.removesuffix("s")) if text else None


def read_text(location: str | Path, options: Mapping[str, str] | None = None) -> str:
    """The text of the file (object) at `location`; FileNotFoundError when there is none."""
    filesystem, path = _filesystem(normalize(location), options or {})
    with filesystem.open_input_stream(path) as stream:
        return bytes(stream.read()).decode()


def has_files(location: str | Path, options: Mapping[str, str] | None = None) -> bool:
    """Whether anything exists at or under `location` (a file, or a folder / prefix that holds
    at least one object: on an object store a folder exists only through its objects)."""
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(normalize(location), options or {})
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.File:
        return True
    if info.type == pafs.FileType.NotFound and not is_object_store(location):
        return False
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=False)
    return len(filesystem.get_file_info(selector)) > 0


def exists(location: str | Path, options: Mapping[str, str] | None = None) -> bool:
    """Whether a file or a folder is at `location`, an empty folder too (on an object store,
    a folder marker, as S3A's `mkdirs` leaves, or any object under the prefix)."""
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(normalize(location), options or {})
    return bool(filesystem.get_file_info(path).type != pafs.FileType.NotFound)


def file_names(location: str | Path, options: Mapping[str, str] | None = None) -> list[str]:
    """The names of every file at any depth under the folder (prefix) `location`, relative
    to it; folders themselves, and an object store's folder markers, are not files."""
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(normalize(location), options or {})
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=True)
    return sorted(
        info.path.removeprefix(path).lstrip("/")
        for info in filesystem.get_file_info(selector)
        if info.type == pafs.FileType.File
    )


@dataclass(frozen=True)
class Location:
    """A location with the options that reach it: what a reader of plain files there needs
    (the streaming checkpoint, read by the fold for its query id and batch offsets)."""

    uri: str
    """Normalized (`normalize`): an absolute path or a URI without a trailing slash."""
    options: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def at(cls, location: str | Path, settings: StorageSettings | None = None) -> Location:
        from dispatch.settings import StorageSettings

        text = normalize(location)
        return cls(text, storage_options(settings or StorageSettings(), text))

    def child(self, *names: str) -> Location:
        return Location(join(self.uri, *names), self.options)

    def read_text(self) -> str:
        return read_text(self.uri, self.options)

    def has_files(self) -> bool:
        return has_files(self.uri, self.options)

    def __str__(self) -> str:
        return self.uri
