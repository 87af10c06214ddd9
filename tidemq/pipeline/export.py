"""Export and stats jobs over a store's commit log.

- `export`: every message to Parquet, partitioned by topic and day (UTC, of the store time);
- `stats`: per-topic and per-queue counts, bytes, first and last store time, and message rates
  over time in fixed buckets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .rebuild import report_tail, task_errors
from .source import SOURCE_NAME


def _reader(spark, partition_size):
    reader = spark.read.format(SOURCE_NAME)
    if partition_size is not None:
        reader = reader.option("partitionSize", str(partition_size))
    return reader


@dataclass
class ExportReport:
    out: str
    messages: list[str] = field(default_factory=list)


def export(
    spark, store: str | os.PathLike, out: str | os.PathLike, *, mode: str = "errorifexists", partition_size=None
) -> ExportReport:
    """Write every message of `store` to Parquet under `out`, in `topic=.../day=YYYY-MM-DD/`."""
    from pyspark.sql import functions as F

    store = Path(store)
    report = ExportReport(out=str(out))
    report_tail(store, report.messages)
    df = _reader(spark, partition_size).load(str(store))
    # the UTC day whatever the session's time zone
    df = df.withColumn("day", F.expr("date_from_unix_date(CAST(floor(unix_millis(store_timestamp) / 86400000) AS INT))"))
    with task_errors():
        df.write.mode(mode).partitionBy("topic", "day").parquet(str(out))
    return report


def read_export(spark, out: str | os.PathLike):
    """An export read back with the source's column types (topic names stay strings even when
    they look like numbers) and its `day` column."""
    from pyspark.sql.types import DateType, StructField, StructType

    from .columns import SCHEMA

    schema = StructType(list(SCHEMA.fields) + [StructField("day", DateType())])
    return spark.read.schema(schema).parquet(str(out))


@dataclass
class Totals:
    messages: int
    bytes: int
    first_store_time: datetime
    last_store_time: datetime


@dataclass
class StatsReport:
    topics: dict[str, Totals] = field(default_factory=dict)
    queues: dict[tuple[str, int], Totals] = field(default_factory=dict)
    rates: list[tuple[datetime, int, int, float]] = field(default_factory=list)  # bucket start, messages, bytes, msg/s
    bucket_seconds: int = 60
    messages: list[str] = field(default_factory=list)


def stats(spark, store: str | os.PathLike, *, bucket_seconds: int = 60, partition_size=None) -> StatsReport:
    """Counts, bytes and store-time span per topic and per queue; message rates per bucket."""
    from pyspark.sql import functions as F

    if bucket_seconds < 1:
        raise ValueError(f"bucket must be at least one second, got {bucket_seconds}")
    store = Path(store)
    report = StatsReport(bucket_seconds=bucket_seconds)
    report_tail(store, report.messages)
    df = _reader(spark, partition_size).option("columns", "topic,queue_id,size,store_timestamp").load(str(store))
    df = df.cache()
    aggregates = [
        F.count(F.lit(1)).alias("messages"),
        F.sum("size").alias("bytes"),
        F.min("store_timestamp").alias("first"),
        F.max("store_timestamp").alias("last"),
    ]
    try:
        with task_errors():
            for row in df.groupBy("topic").agg(*aggregates).collect():
                report.topics[row.topic] = Totals(row.messages, row.bytes, row.first, row.last)
            for row in df.groupBy("topic", "queue_id").agg(*aggregates).collect():
                report.queues[(row.topic, row.queue_id)] = Totals(row.messages, row.bytes, row.first, row.last)
            windows = df.groupBy(F.window("store_timestamp", f"{bucket_seconds} seconds").alias("w")).agg(
                F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes")
            )
            for row in sorted(windows.collect(), key=lambda r: r.w.start):
                report.rates.append((row.w.start, row.messages, row.bytes, row.messages / bucket_seconds))
    finally:
        df.unpersist()
    report.topics = dict(sorted(report.topics.items()))
    report.queues = dict(sorted(report.queues.items()))
    return report
