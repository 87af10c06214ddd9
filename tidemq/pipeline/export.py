"""Export and stats jobs over a store's commit log.

- `export`: every message to Parquet, partitioned by topic and day (UTC, of the store time);
- `stats`: per-topic and per-queue counts, bytes, first and last store time, and message rates
  over time in fixed buckets.

The store may be a path or a URI (`files`); the export's `out` goes to Spark's own Parquet writer,
so it takes whatever URIs Spark's Hadoop filesystems take (file://, hdfs://, s3a://, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime

from . import SOURCE_NAME, files
from .errors import JobFailedError, job_errors
from .rebuild import report_tail

EXPORT_MODES = ("errorifexists", "overwrite", "append", "ignore")


def _reader(spark, partition_size, start_offset=None, end_offset=None):
    reader = spark.read.format(SOURCE_NAME)
    for option, value in (("partitionSize", partition_size), ("startOffset", start_offset), ("endOffset", end_offset)):
        if value is not None:
            reader = reader.option(option, str(value))
    return reader


def spark_location(raw: str | os.PathLike) -> str:
    """An output for Spark's own writers: a URI as given, a plain path as a file:// URI (so a
    cluster's executors do not read it against another default filesystem)."""
    text = os.fspath(raw)
    return text if not files.is_local(files.normalize(text)) else files.uri(files.normalize(text))


@dataclass
class ExportReport:
    out: str
    messages: list[str] = field(default_factory=list)


def export(
    spark,
    store: str | os.PathLike,
    out: str | os.PathLike,
    *,
    mode: str = "errorifexists",
    partition_size=None,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> ExportReport:
    """Write every message of `store` to Parquet under `out`, in `topic=.../day=YYYY-MM-DD/`.
    `mode` is Spark's save mode: into an existing `out`, errorifexists (the default) refuses,
    overwrite replaces it, append adds to it, ignore does nothing."""
    from pyspark.sql import functions as F

    if mode not in EXPORT_MODES:
        raise ValueError(f"export mode must be one of {', '.join(EXPORT_MODES)}, not {mode!r}")
    store = files.normalize(store)
    target = spark_location(out)
    local = files.normalize(out)
    if mode == "errorifexists" and files.is_local(local) and os.path.exists(local):
        raise JobFailedError(f"{out} already exists: choose --mode overwrite (replace it) or --mode append (add to it)")
    report = ExportReport(out=target)
    report_tail(store, report.messages)
    with job_errors():  # the source plans (in Python, started by Spark) when it is loaded
        df = _reader(spark, partition_size, start_offset, end_offset).load(store)
        # the UTC day whatever the session's time zone
        df = df.withColumn(
            "day", F.expr("date_from_unix_date(CAST(floor(unix_millis(store_timestamp) / 86400000) AS INT))")
        )
        df.write.mode(mode).partitionBy("topic", "day").parquet(target)
    return report


def read_export(spark, out: str | os.PathLike):
    """An export read back with the source's column types (topic names stay strings even when
    they look like numbers) and its `day` column."""
    from pyspark.sql.types import DateType, StructField, StructType

    from .columns import SCHEMA

    schema = StructType([*SCHEMA.fields, StructField("day", DateType())])
    return spark.read.schema(schema).parquet(spark_location(out))


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


def stats(
    spark,
    store: str | os.PathLike,
    *,
    bucket_seconds: int = 60,
    partition_size=None,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> StatsReport:
    """Counts, bytes and store-time span per topic and per queue; message rates per bucket."""
    from pyspark.sql import functions as F

    if bucket_seconds < 1:
        raise ValueError(f"bucket must be at least one second, got {bucket_seconds}")
    store = files.normalize(store)
    report = StatsReport(bucket_seconds=bucket_seconds)
    report_tail(store, report.messages)
    with job_errors():
        df = _reader(spark, partition_size, start_offset, end_offset)
        df = df.option("columns", "topic,queue_id,size,store_timestamp").load(store).cache()
    aggregates = [
        F.count(F.lit(1)).alias("messages"),
        F.sum("size").alias("bytes"),
        F.min("store_timestamp").alias("first"),
        F.max("store_timestamp").alias("last"),
    ]
    try:
        with job_errors():
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
