"""Spark on object storage: Delta tables and a streaming checkpoint on `s3://` URIs, through
S3A (jar set `s3`), against a real S3-compatible server (S3Proxy) on loopback.

The session is the test run's shared one, built for a local warehouse; these tests point it at
the server at run time with `configure_object_storage`, as `dispatch.streaming.app.start` does,
which is also the check that Delta's writes and the checkpoint honour configuration set on a running
session. delta-rs reads and appends the same tables, so both engines agree on the same bytes.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from dispatch.delta import tables as t
from dispatch.settings import Settings
from dispatch.storage import storage_options
from dispatch.streaming.session import configure_object_storage, s3a_config
from dispatch.warehouse import Warehouse
from tests.s3_server import BUCKET, S3Server

pytestmark = pytest.mark.integration

QUERY_TIMEOUT_S = 180
ROWS = [(1, "a"), (2, "b"), (3, "c")]
STAGED_COMMITS = "_delta_log/_staged_commits"
"""The first folder Spark's Delta makes when it creates a table, before any commit."""


@pytest.fixture(scope="module")
def s3_spark(spark: SparkSession, stack_settings: Settings, s3_server: S3Server) -> SparkSession:
    """The shared session pointed at the session's S3 server (one per test session: Hadoop
    caches one S3AFileSystem per bucket, with the endpoint of the moment it was built)."""
    paths = stack_settings.paths.model_copy(update={"warehouse": s3_server.uri("spark")})
    settings = stack_settings.model_copy(update={"paths": paths, "storage": s3_server.settings()})
    configure_object_storage(spark, settings)
    return spark


def unique(request: pytest.FixtureRequest) -> str:
    """A prefix of this test's own in the bucket."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60].strip("-")
    return f"{name}-{uuid.uuid4().hex[:8]}"


def spark_rows(spark: SparkSession, uri: str) -> list[tuple[int, str]]:
    return sorted((row.id, row.name) for row in spark.read.format("delta").load(uri).collect())


def delta_rs_rows(table: DeltaTable) -> list[tuple[int, str]]:
    columns = table.to_pyarrow_table().to_pydict()
    return sorted(zip(columns["id"], columns["name"], strict=True))


def test_spark_and_delta_rs_share_a_delta_table_on_s3(
    s3_spark: SparkSession, s3_server: S3Server, request: pytest.FixtureRequest
) -> None:
    uri = s3_server.uri(unique(request), "t")
    s3_spark.createDataFrame(ROWS, "id long, name string").write.format("delta").save(uri)
    assert spark_rows(s3_spark, uri) == ROWS

    options = storage_options(s3_server.settings(), uri)
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 0
    assert delta_rs_rows(table) == ROWS

    appended = pa.table({"id": pa.array([4], pa.int64()), "name": pa.array(["d"], pa.string())})
    write_deltalake(uri, appended, mode="append", storage_options=options)
    assert spark_rows(s3_spark, uri) == [*ROWS, (4, "d")]
    history = s3_spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    assert sorted(row.version for row in history) == [0, 1]
    # `s3a://` is the same filesystem, the same table.
    assert spark_rows(s3_spark, uri.replace("s3://", "s3a://", 1)) == [*ROWS, (4, "d")]


def test_a_streaming_query_resumes_from_its_checkpoint_on_s3(
    s3_spark: SparkSession, s3_server: S3Server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    prefix = unique(request)
    sink = s3_server.uri(prefix, "sink")
    checkpoint = s3_server.uri(prefix, "checkpoint")
    source = tmp_path / "source"
    source.mkdir()

    def add_file(name: str, ids: list[int]) -> None:
        lines = [json.dumps({"id": id_, "name": f"n{id_}"}) for id_ in ids]
        (source / f"{name}.json").write_text("\n".join(lines) + "\n")

    def run_once() -> str:
        """One availableNow run of the query; its id (kept in the checkpoint's metadata)."""
        query = (
            s3_spark.readStream.schema("id long, name string")
            .json(str(source))
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(sink)
        )
        try:
            assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish"
        finally:
            query.stop()
        return str(query.id)

    add_file("a", [1, 2])
    add_file("b", [3])
    first_id = run_once()
    assert spark_rows(s3_spark, sink) == [(1, "n1"), (2, "n2"), (3, "n3")]

    add_file("c", [4, 5])
    second_id = run_once()
    # The same query (its id comes from the checkpoint), and only the new file read again.
    assert second_id == first_id
    assert spark_rows(s3_spark, sink) == [(n, f"n{n}") for n in range(1, 6)]
    options = storage_options(s3_server.settings(), sink)
    assert DeltaTable(sink, storage_options=options).version() == 1  # one commit per run

    # The checkpoint is objects in the bucket (S3Proxy's filesystem backend: one file each).
    stored = s3_server.data / BUCKET / prefix / "checkpoint"
    assert (stored / "metadata").is_file()
    assert json.loads((stored / "metadata").read_text())["id"] == first_id
    assert (stored / "offsets" / "0").is_file()
    assert (stored / "offsets" / "1").is_file()
    assert not (stored / "offsets" / "2").exists()
    assert (stored / "commits" / "1").is_file()


def test_the_fold_creates_its_tables_over_a_creation_killed_before_its_first_commit(
    s3_spark: SparkSession, s3_server: S3Server, request: pytest.FixtureRequest
) -> None:
    # A cluster chaos run killed the fold while Spark created `events`: Delta had made the
    # log's folders (S3A folder markers), not yet its first commit. The restarted fold then
    # failed at every start with DELTA_TABLE_NOT_FOUND. Made here by the same Hadoop calls.
    warehouse = Warehouse.at(s3_server.uri(unique(request), "warehouse"), s3_server.settings())
    jvm, hadoop = s3_spark.sparkContext._jvm, s3_spark.sparkContext._jsc.hadoopConfiguration()
    assert jvm is not None
    # `events` as the run left it; `jobs` killed a moment sooner, after the first folder.
    for name, folder in ((t.EVENTS, STAGED_COMMITS), (t.JOBS, "_delta_log")):
        made = jvm.org.apache.hadoop.fs.Path(f"{warehouse.table(name)}/{folder}")
        assert made.getFileSystem(hadoop).mkdirs(made)
        assert warehouse.open_if_exists(name) is None
    t.create_tables(s3_spark, warehouse)
    for name in t.SCHEMAS:
        table = warehouse.open(name)
        assert table.version() >= 0 and table.to_pyarrow_table().num_rows == 0, name
    assert s3_spark.read.format("delta").load(warehouse.table(t.EVENTS)).count() == 0


def test_spark_redacts_the_s3a_secrets(spark: SparkSession, s3_server: S3Server) -> None:
    # The UI's environment page and the event log show Spark and Hadoop properties through
    # `spark.redaction.regex`: the keys holding the secret and the token must match it.
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    config_package = getattr(jvm.org.apache.spark.internal.config, "package$")
    default = getattr(config_package, "MODULE$").SECRET_REDACTION_PATTERN().defaultValueString()
    pattern = re.compile(spark.sparkContext.getConf().get("spark.redaction.regex", default))
    storage = s3_server.settings(session_token="TOKEN")
    secrets = {storage.access_key_id, storage.secret_access_key, storage.session_token}
    keys = [key for key, value in s3a_config(storage).items() if value in secrets]
    assert sorted(keys) == ["fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token"]
    assert all(pattern.search(key) for key in keys)
