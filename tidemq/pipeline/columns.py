"""The columns of the commit-log source and how a batch of decoded records becomes Arrow.

Every column is computed from `tidemq.store.format.record.Record` (the store's own decoder); nothing here
parses record bytes.  A read that does not ask for `body` never copies a body, and one that asks
for none of tags/keys/unique_key/properties/tags_code skips the properties parse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import cast

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..store import record
from ..store.format import special_queues

FIELDS = [
    StructField("broker", StringType(), False),
    StructField("commit_log_offset", LongType(), False),
    StructField("size", IntegerType(), False),
    StructField("topic", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("tags", StringType(), True),
    StructField("tags_code", LongType(), False),
    StructField("keys", ArrayType(StringType(), False), False),
    StructField("unique_key", StringType(), True),
    StructField("properties", MapType(StringType(), StringType(), False), False),
    StructField("body", BinaryType(), False),
    StructField("born_timestamp", TimestampType(), False),
    StructField("store_timestamp", TimestampType(), False),
    StructField("born_host", StringType(), False),
    StructField("store_host", StringType(), False),
    StructField("sysflag", IntegerType(), False),
    StructField("reconsume_times", IntegerType(), False),
]
SCHEMA = StructType(FIELDS)
COLUMN_NAMES = [f.name for f in FIELDS]
NEEDS_PROPERTIES = frozenset({"tags", "tags_code", "keys", "unique_key", "properties"})


def select_schema(columns: Sequence[str]) -> StructType:
    """The source schema restricted to `columns`, in the source's column order."""
    unknown = [c for c in columns if c not in COLUMN_NAMES]
    if unknown:
        raise ValueError(f"tidemq-commitlog has no column(s) {unknown}; its columns are {COLUMN_NAMES}")
    wanted = set(columns)
    return StructType([f for f in FIELDS if f.name in wanted])


def check_schema(schema: StructType) -> None:
    """A schema given with `.schema(...)` must be a subset of the source's columns and types."""
    by_name = {f.name: f for f in FIELDS}
    for f in schema.fields:
        known = by_name.get(f.name)
        if known is None:
            raise ValueError(f"tidemq-commitlog has no column {f.name!r}; its columns are {COLUMN_NAMES}")
        if known.dataType != f.dataType:
            raise ValueError(f"column {f.name!r} is {known.dataType.simpleString()}, not {f.dataType.simpleString()}")


@lru_cache(maxsize=4096)
def format_host(host: record.Host) -> str:
    address, port = host
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _timestamps(values: list[int], arrow_type: pa.DataType) -> pa.Array:
    micros = np.fromiter(values, dtype=np.int64, count=len(values)) * 1000
    return pa.array(micros, type=arrow_type)


def _bodies(records: list[record.Record], arrow_type: pa.DataType) -> pa.Array:
    # one copy: the bodies joined into one buffer, with an offsets buffer beside it (the records
    # are decoded with their bodies when this column is read)
    views = cast("list[bytes | memoryview]", [r.body for r in records])
    lengths = np.fromiter((len(v) for v in views), dtype=np.int32, count=len(views))
    offsets = np.zeros(len(views) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(views)
    return pa.Array.from_buffers(arrow_type, len(views), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def queue_tags_code(r: record.Record) -> int:
    """The tags code of the record's own ConsumeQueue unit: its tag's hash, or for a delay-level
    record of SCHEDULE_TOPIC_XXXX the time it is due (`special_queues`)."""
    properties = r.properties
    code = record.tags_code(properties.get(record.PROPERTY_TAGS))
    return special_queues.queue_tags_code(
        r.topic, properties.get(special_queues.PROPERTY_DELAY), r.store_timestamp, code
    )


Extractor = Callable[[list[record.Record], str, pa.DataType], pa.Array]

EXTRACTORS: dict[str, Extractor] = {
    "broker": lambda rs, broker, t: pa.array([broker] * len(rs), type=t),
    "commit_log_offset": lambda rs, b, t: pa.array([r.commit_log_offset for r in rs], type=t),
    "size": lambda rs, b, t: pa.array([r.total_size for r in rs], type=t),
    "topic": lambda rs, b, t: pa.array([r.topic for r in rs], type=t),
    "queue_id": lambda rs, b, t: pa.array([r.queue_id for r in rs], type=t),
    "queue_offset": lambda rs, b, t: pa.array([r.queue_offset for r in rs], type=t),
    "tags": lambda rs, b, t: pa.array([r.properties.get(record.PROPERTY_TAGS) for r in rs], type=t),
    "tags_code": lambda rs, b, t: pa.array([queue_tags_code(r) for r in rs], type=t),
    "keys": lambda rs, b, t: pa.array([r.keys for r in rs], type=t),
    "unique_key": lambda rs, b, t: pa.array([r.properties.get(record.PROPERTY_UNIQ_KEY) for r in rs], type=t),
    "properties": lambda rs, b, t: pa.array([list(r.properties.items()) for r in rs], type=t),
    "body": lambda rs, b, t: _bodies(rs, t),
    "born_timestamp": lambda rs, b, t: _timestamps([r.born_timestamp for r in rs], t),
    "store_timestamp": lambda rs, b, t: _timestamps([r.store_timestamp for r in rs], t),
    "born_host": lambda rs, b, t: pa.array([format_host(r.born_host) for r in rs], type=t),
    "store_host": lambda rs, b, t: pa.array([format_host(r.store_host) for r in rs], type=t),
    "sysflag": lambda rs, b, t: pa.array([r.sysflag for r in rs], type=t),
    "reconsume_times": lambda rs, b, t: pa.array([r.reconsume_times for r in rs], type=t),
}
assert set(EXTRACTORS) == set(COLUMN_NAMES)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for `schema` (what its Python data source worker checks)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def to_batch(records: list[record.Record], broker: str, schema: StructType, pa_schema: pa.Schema) -> pa.RecordBatch:
    arrays = [EXTRACTORS[f.name](records, broker, pa_schema.field(f.name).type) for f in schema.fields]
    return pa.RecordBatch.from_arrays(arrays, schema=pa_schema)


def to_rows(records: list[record.Record], broker: str, schema: StructType) -> list[tuple]:
    """The same values as plain tuples (the row path, kept for the benchmark's comparison)."""

    def ts(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)

    getters = {
        "broker": lambda r: broker,
        "commit_log_offset": lambda r: r.commit_log_offset,
        "size": lambda r: r.total_size,
        "topic": lambda r: r.topic,
        "queue_id": lambda r: r.queue_id,
        "queue_offset": lambda r: r.queue_offset,
        "tags": lambda r: r.tags,
        "tags_code": queue_tags_code,
        "keys": lambda r: r.keys,
        "unique_key": lambda r: r.unique_key,
        "properties": lambda r: dict(r.properties),
        "body": lambda r: r.body_bytes,
        "born_timestamp": lambda r: ts(r.born_timestamp),
        "store_timestamp": lambda r: ts(r.store_timestamp),
        "born_host": lambda r: format_host(r.born_host),
        "store_host": lambda r: format_host(r.store_host),
        "sysflag": lambda r: r.sysflag,
        "reconsume_times": lambda r: r.reconsume_times,
    }
    chosen = [getters[f.name] for f in schema.fields]
    return [tuple(g(r) for g in chosen) for r in records]
