"""Storage locations and delta-rs storage options (dispatch/storage.py): pure functions."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from deltalake.exceptions import DeltaError

from dispatch.lease import LEASES, LeaseTable
from dispatch.settings import ConfigError, LeaseSettings, StorageSettings, load_settings
from dispatch.storage import (
    Location,
    exists,
    file_names,
    is_object_store,
    is_uri,
    join,
    local_path,
    normalize,
    scheme,
    storage_options,
)
from dispatch.warehouse import Warehouse

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


def test_a_location_reads_its_files_and_knows_when_it_holds_none(tmp_path: Path) -> None:
    checkpoint = Location.at(tmp_path / "checkpoint")
    assert not checkpoint.has_files()  # nothing there yet: a fresh query
    assert not checkpoint.child("offsets").has_files()
    with pytest.raises(FileNotFoundError):
        checkpoint.child("metadata").read_text()
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    assert not checkpoint.child("offsets").has_files()  # an empty folder holds no batch
    (tmp_path / "checkpoint" / "offsets" / "0").write_text("v1\n")
    assert checkpoint.child("offsets").has_files()
    assert checkpoint.child("offsets", "0").read_text() == "v1\n"
    assert str(checkpoint.child("offsets")) == str(tmp_path / "checkpoint" / "offsets")


def test_a_location_on_s3_carries_its_options_but_never_shows_them() -> None:
    settings = StorageSettings(
        endpoint_url="http://127.0.0.1:9000", access_key_id="id", secret_access_key="s3cr3t"
    )
    checkpoint = Location.at("S3://bucket/cp/", settings).child("streaming")
    assert checkpoint.uri == "s3://bucket/cp/streaming"
    assert checkpoint.options["aws_secret_access_key"] == "s3cr3t"
    assert "s3cr3t" not in repr(checkpoint)


def test_the_settings_locations_are_paths_under_var_or_uris(tmp_path: Path) -> None:
    paths = load_settings(paths={"var": str(tmp_path)}).paths
    assert paths.warehouse == str(tmp_path / "delta")
    assert paths.checkpoint_root() == str(tmp_path / "checkpoints")
    remote = load_settings(
        paths={"var": str(tmp_path), "warehouse": "s3://b/wh/", "checkpoints": "S3A://b/cp"}
    ).paths
    assert (remote.warehouse, remote.checkpoint_root()) == ("s3://b/wh", "s3a://b/cp")
    assert load_settings(paths={"checkpoints": "cp"}).paths.checkpoint_root().endswith("/var/cp")
    for bad in ("s3://", " "):
        with pytest.raises(ConfigError, match="warehouse"):
            load_settings(paths={"warehouse": bad})


@pytest.mark.parametrize("lines", [0, 1, 2], ids=["empty", "commit-info", "no-protocol"])
def test_a_table_whose_first_commit_is_not_whole_yet_does_not_exist_yet(
    tmp_path: Path, lines: int
) -> None:
    # What a reader saw while Spark created `jobs` on S3Proxy: the first commit's first lines.
    warehouse = Warehouse.at(tmp_path)
    write_deltalake(warehouse.table("jobs"), pa.table({"id": ["a"]}))
    first = Path(warehouse.table("jobs")) / "_delta_log" / f"{0:020}.json"
    whole = [json.loads(line) for line in first.read_text().splitlines()]
    order = ["commitInfo", "metaData", "protocol", "add"]
    whole.sort(key=lambda action: order.index(next(iter(action))))
    first.write_text("".join(json.dumps(action) + "\n" for action in whole[:lines]))
    assert warehouse.open_if_exists("jobs") is None
    # A log that is broken otherwise still raises.
    first.write_text("not json\n")
    with pytest.raises(DeltaError):
        warehouse.open_if_exists("jobs")


def test_the_warehouse_opens_its_tables_with_its_options(tmp_path: Path) -> None:
    warehouse = Warehouse.at(tmp_path)
    assert warehouse.is_local and warehouse.storage_options == {}
    assert warehouse.table("jobs") == str(tmp_path / "jobs")
    assert warehouse.open_if_exists("jobs") is None
    write_deltalake(warehouse.table("jobs"), pa.table({"id": ["a"]}))
    assert warehouse.open("jobs").to_pyarrow_table().to_pylist() == [{"id": "a"}]
    remote = Warehouse.at(
        "s3://bucket/wh", StorageSettings(access_key_id="id", secret_access_key="s3cr3t")
    )
    assert not remote.is_local and remote.table("jobs") == "s3://bucket/wh/jobs"
    assert remote.storage_options["aws_conditional_put"] == "etag"
    assert "s3cr3t" not in repr(remote)


def test_the_files_under_a_folder_are_listed_at_any_depth(tmp_path: Path) -> None:
    folder = tmp_path / "cp"
    assert file_names(folder) == [] and not exists(folder)  # nothing there
    (folder / "offsets" / "empty").mkdir(parents=True)
    assert file_names(folder) == [] and exists(folder)  # folders are not files
    (folder / "offsets" / "0").write_text("v1\n")
    (folder / "metadata").write_text("{}")
    assert file_names(folder) == ["metadata", "offsets/0"]


def test_a_log_without_a_commit_is_abandoned_and_a_table_never_is(tmp_path: Path) -> None:
    warehouse = Warehouse.at(tmp_path)
    assert warehouse.abandoned_log("events") is None  # no table, no folder
    # What Spark's Delta leaves when killed before its first commit: the folders alone, or
    # with the temporary file its commit was being written to.
    log = tmp_path / "events" / "_delta_log"
    log.mkdir(parents=True)
    assert warehouse.abandoned_log("events") == str(log)
    (log / "_staged_commits").mkdir()
    assert warehouse.abandoned_log("events") == str(log)
    (log / f".{0:020}.json.3f1c.tmp").write_text('{"commitInfo":{}}\n')
    assert warehouse.abandoned_log("events") == str(log)
    write_deltalake(warehouse.table("jobs"), pa.table({"id": ["a"]}))
    assert warehouse.abandoned_log("jobs") is None
