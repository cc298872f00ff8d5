"""The stack is real: a kafka-python producer writes to the submit topic, a Structured Streaming
query folds it into a Delta table with foreachBatch, and delta-rs reads the same rows back."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable
from kafka import KafkaProducer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dispatch.settings import Settings
from dispatch.warehouse import Warehouse

pytestmark = pytest.mark.integration

SUBMISSION = StructType(
    [
        StructField("id", StringType()),
        StructField("exec", StringType()),
        StructField("client_id", StringType()),
    ]
)


def test_submissions_flow_from_kafka_through_spark_into_delta(
    topics: Settings, spark: SparkSession
) -> None:
    kafka = topics.kafka
    submissions = [
        {
            "id": f"job-{n}",
            "exec": "image.resize",
            "client_id": f"client-{n % 3}",
            "payload": {"n": n},
        }
        for n in range(25)
    ]
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    for submission in submissions:
        producer.send(
            kafka.submit_topic,
            key=str(submission["id"]).encode(),
            value=json.dumps(submission).encode(),
        )
    producer.flush()
    producer.close()

    table = Warehouse.of(topics).table("submissions")
    batch_ids: list[int] = []

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch_ids.append(batch_id)
        (
            batch.write.format("delta")
            .mode("append")
            .option("txnAppId", "test-submissions")
            .option("txnVersion", batch_id)
            .save(table)
        )

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", kafka.submit_topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .select(
            F.from_json(F.col("value").cast("string"), SUBMISSION).alias("job"),
            F.col("partition"),
            F.col("offset"),
        )
        .select("job.*", "partition", "offset")
    )
    query = (
        stream.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", str(topics.paths.var / "checkpoints" / "submissions"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=240)
    assert query.exception() is None
    assert batch_ids, "the streaming query processed no batch"

    spark_rows = sorted(
        (row["id"], row["exec"], row["client_id"])
        for row in spark.read.format("delta").load(table).collect()
    )
    expected = sorted((s["id"], s["exec"], s["client_id"]) for s in submissions)
    assert spark_rows == expected

    delta_rs_rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["exec"], r["client_id"]) for r in delta_rs_rows) == expected
    # Offsets are kept so a row can be traced back to its Kafka record.
    assert len({(r["partition"], r["offset"]) for r in delta_rs_rows}) == len(submissions)
