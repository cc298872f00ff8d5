"""Storage locations and delta-rs storage options (dispatch/storage.py): pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.lease import LEASES, LeaseTable
from dispatch.settings import LeaseSettings, StorageSettings, load_settings
from dispatch.storage import (
    is_object_store,
    is_uri,
    join,
    local_path,
    normalize,
    scheme,
    storage_options,
)

NO_ENV: dict[str, str] = {}


def test_paths_and_uris_are_told_apart() -> None:
    assert is_uri("s3://bucket/prefix")
    assert is_uri("S3A://bucket")
    assert not is_uri("/srv/delta")
    assert not is_uri(Path("/srv/delta"))
    assert not is_uri("relative/delta")
    assert not is_uri("C:/delta")  # a drive letter is not a scheme
    assert scheme("s3a://b/p") == "s3a"
    assert scheme("/srv") == "file"
    assert scheme("file:///srv") == "file"
    assert is_object_store("s3://b") and is_object_store("gs://b/x")
    assert not is_object_store("/srv") and not is_object_store("file:///srv")


def test_join_puts_a_table_under_a_location() -> None:
    assert join("s3://bucket/prefix/", "leases") == "s3://bucket/prefix/leases"
    assert join("s3://bucket", "delta", "leases") == "s3://bucket/delta/leases"
    assert join("S3://bucket/p", "t") == "s3://bucket/p/t"  # the scheme in lower case
    assert join("/srv/delta", "leases") == "/srv/delta/leases"
    assert join(Path("/srv/delta"), "leases") == "/srv/delta/leases"
    assert join("rel", "t") == str(Path.cwd() / "rel" / "t")
    for bad in ("", ".", "..", "a/b", "/abs", "a\\b"):
        with pytest.raises(ValueError):
            join("s3://bucket", bad)


def test_normalize_and_local_paths() -> None:
    assert normalize("s3://bucket/a/b//") == "s3://bucket/a/b"
    assert normalize("~/x") == str(Path.home() / "x")
    for bad in ("", "s3://", "s3:///"):
        with pytest.raises(ValueError):
            normalize(bad)
    assert local_path("/srv/delta") == Path("/srv/delta")
    assert local_path("file:///srv/delta") == Path("/srv/delta")
    with pytest.raises(ValueError):
        local_path("s3://bucket/delta")


def test_a_local_location_needs_no_options() -> None:
    settings = StorageSettings(endpoint_url="http://127.0.0.1:9000")
    assert storage_options(settings, "/srv/delta", NO_ENV) == {}
    assert storage_options(settings, "file:///srv/delta", NO_ENV) == {}


def test_s3_options_from_settings_ask_for_conditional_writes() -> None:
    settings = StorageSettings(
        endpoint_url="http://127.0.0.1:9000",
        access_key_id="id",
        secret_access_key="secret",
        session_token="token",
    )
    options = storage_options(settings, "s3://bucket/delta", {"AWS_ACCESS_KEY_ID": "env-id"})
    assert options["aws_conditional_put"] == "etag"
    assert options["AWS_S3_ALLOW_UNSAFE_RENAME"] == "false"
    assert "AWS_S3_LOCKING_PROVIDER" not in options  # no DynamoDB, no lock table
    assert options["aws_endpoint"] == "http://127.0.0.1:9000"
    assert options["aws_allow_http"] == "true"  # loopback
    assert options["aws_virtual_hosted_style_request"] == "false"
    assert options["aws_region"] == "us-east-1"
    # Settings win over the environment.
    assert (options["aws_access_key_id"], options["aws_secret_access_key"]) == ("id", "secret")
    assert options["aws_session_token"] == "token"
    assert options["timeout"] == "10s" and options["retry_timeout"] == "15s"


def test_s3_options_fall_back_to_the_aws_environment() -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "env-id",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "https://s3.example.com",
    }
    options = storage_options(StorageSettings(), "s3://bucket/delta", env)
    assert options["aws_access_key_id"] == "env-id"
    assert options["aws_secret_access_key"] == "env-secret"
    assert options["aws_region"] == "eu-west-1"
    assert options["aws_endpoint"] == "https://s3.example.com"
    assert "aws_allow_http" not in options
    # The S3-specific endpoint variable wins over the general one, as in the AWS SDKs.
    env["AWS_ENDPOINT_URL_S3"] = "https://s3-only.example.com"
    assert storage_options(StorageSettings(), "s3a://b", env)["aws_endpoint"].startswith(
        "https://s3-only"
    )


def test_aws_itself_needs_no_endpoint_and_may_resolve_its_own_credentials() -> None:
    options = storage_options(StorageSettings(region="us-west-2"), "s3://bucket", NO_ENV)
    assert "aws_endpoint" not in options and "aws_access_key_id" not in options
    assert options["aws_region"] == "us-west-2"
    assert options["aws_conditional_put"] == "etag"


def test_unsafe_configurations_are_refused() -> None:
    # Plain HTTP off loopback would send the signature and the data in clear.
    remote = StorageSettings(endpoint_url="http://s3.internal.example:9000")
    with pytest.raises(ValueError, match="allow_http"):
        storage_options(remote, "s3://bucket", NO_ENV)
    allowed = remote.model_copy(update={"allow_http": True})
    assert storage_options(allowed, "s3://bucket", NO_ENV)["aws_allow_http"] == "true"
    by_env = storage_options(remote, "s3://bucket", {"AWS_ALLOW_HTTP": "true"})
    assert by_env["aws_allow_http"] == "true"
    with pytest.raises(ValueError, match="both"):
        storage_options(StorageSettings(access_key_id="id"), "s3://bucket", NO_ENV)


def test_storage_settings_load_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_STORAGE__ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("DISPATCH_STORAGE__SECRET_ACCESS_KEY", "s3cr3t")
    settings = load_settings()
    assert settings.storage.endpoint_url == "http://127.0.0.1:9000"
    assert "s3cr3t" not in repr(settings)  # kept out of logs
    with pytest.raises(ValueError):
        StorageSettings(endpoint_url="ftp://host")


def test_the_lease_table_takes_a_path_or_a_uri(tmp_path: Path) -> None:
    settings = LeaseSettings()
    local = LeaseTable(str(tmp_path), settings)
    assert local.location == str(tmp_path / LEASES)
    assert local.path == tmp_path / LEASES
    assert LeaseTable(tmp_path, settings).path == local.path
