"""The `tidemq-commitlog` Spark data source (PySpark's Python Data Source API).

    spark.read.format("tidemq-commitlog").load(store_dir)               # one broker
    spark.read.format("tidemq-commitlog").load([store_a, store_b])      # a `broker` column says which
    spark.readStream.format("tidemq-commitlog").load(store_dir)         # tail a live store
    spark.readStream.format("tidemq-commitlog").option("paths", json.dumps([a, b])).load()

Options (all optional):
    partitionSize   bytes of commit log per task (default 64 MiB, or a whole segment for a remote
                    log; suffixes k, m, g)
    startOffset     read records whose commit-log offset is >= this (per broker)
    endOffset       ... and < this
    columns         comma-separated subset of the columns to produce (column pruning: PySpark 4.3
                    has no projection pushdown for Python sources, so a job says what it needs
                    here or with `.schema(...)`; both are honoured, and without `body` no body is
                    copied)
    checkCRC        verify each body's CRC (default true)
    batchSize       records per Arrow batch (default 8192)
    brokers         comma-separated broker names, one per path (default: the store directories' names)
    output          "arrow" (default) or "rows": yield tuples instead (for comparison only)
    startingOffsets streaming: "earliest" (default), "latest", or a commit-log offset
    maxBytesPerTrigger  streaming: at most about this many bytes of log per micro-batch and broker

Damage: a torn tail (an invalid record with nothing valid after it, as a crash leaves) ends the
read at the last valid record with a logged warning.  An invalid record *followed by valid
records* is corruption in the middle: the task fails with `CorruptLogError` naming the offset,
as the store refuses to open such a log; `endOffset=<that offset>` reads what precedes it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ..store import record
from . import SOURCE_NAME
from . import columns as cols
from . import plan as planning
from .errors import CorruptLogError
from .files import Segment
from .plan import NO_END, CommitLogDir, SegmentRange

if TYPE_CHECKING:
    from .stream import CommitLogStreamReader

log = logging.getLogger(__name__)

__all__ = ["SOURCE_NAME", "CorruptLogError", "CommitLogDataSource", "read_range", "record_batches"]


def parse_size(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    try:
        return int(number) * scale
    except ValueError:
        raise ValueError(f"not a size in bytes: {text!r}") from None


def _flag(options, name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if str(value).lower() not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, not {value!r}")
    return str(value).lower() == "true"


class ReadSettings:
    """The options a task needs, parsed once on the driver (picklable)."""

    def __init__(self, options, schema: StructType) -> None:
        cols.check_schema(schema)
        self.schema = schema
        self.names = frozenset(schema.fieldNames())
        self.check_crc = _flag(options, "checkCRC", True)
        self.batch_size = int(options.get("batchSize", 8192))
        self.batch_bytes = 32 << 20
        self.rows = str(options.get("output", "arrow")).lower() == "rows"
        if str(options.get("output", "arrow")).lower() not in ("arrow", "rows"):
            raise ValueError(f"option output must be arrow or rows, not {options.get('output')!r}")
        self.read_body = "body" in self.names
        self.read_properties = bool(self.names & cols.NEEDS_PROPERTIES)


def record_batches(part: InputPartition, settings: ReadSettings) -> Iterator[list[record.Record]]:
    """Decode the records starting in `part`, in lists of up to `batch_size` records.  Bodies are
    views into the segment's bytes: use them before asking for the next list."""
    if not isinstance(part, SegmentRange):
        return  # Spark reads one placeholder partition when the plan has none (an empty log)
    segment = planning.open_segment(part.path, part.segment_start)
    if segment is None:
        return
    base = part.segment_start
    pos = part.lo - base
    stop = part.hi - base
    check_crc, read_body, read_properties = settings.check_crc, settings.read_body, settings.read_properties
    decode: Callable[[int], record.DecodeResult]
    if segment.whole:  # a mapping of the whole segment: the store's decoder straight over it
        decode = functools.partial(
            record.decode,
            segment.buf,
            base_offset=base,
            check_crc=check_crc,
            read_body=read_body,
            read_properties=read_properties,
        )
    else:
        decode = functools.partial(
            segment.decode, check_crc=check_crc, read_body=read_body, read_properties=read_properties
        )
    Record = record.Record
    batch: list[record.Record] = []
    batch_bytes = 0
    result = None
    try:
        while pos < stop:
            result = decode(pos)
            if type(result) is Record:
                batch.append(result)
                pos += result.total_size
                batch_bytes += result.total_size
                if len(batch) >= settings.batch_size or batch_bytes >= settings.batch_bytes:
                    yield batch
                    batch, batch_bytes = [], 0
                continue
            if type(result) is record.Invalid:
                _report_invalid(part, segment, result)
            break
        if batch:
            yield batch
    finally:
        del batch, result, decode
        segment.close()


def read_range(part: InputPartition, settings: ReadSettings) -> Iterator:
    """The records starting in `part` as Arrow batches (or tuples, with output=rows)."""
    if not isinstance(part, SegmentRange):
        return  # Spark reads one placeholder partition when the plan has none (an empty log)
    if settings.rows:
        for batch in record_batches(part, settings):
            yield from cols.to_rows(batch, part.broker, settings.schema)
        return
    pa_schema = cols.arrow_schema(settings.schema)
    for batch in record_batches(part, settings):
        yield cols.to_batch(batch, part.broker, settings.schema, pa_schema)


def valid_records_after(directory: str, segment: Segment, bad: record.Invalid) -> int:
    """Like recovery: look at the record the invalid one's declared size points to, and at the
    first record of every later segment."""
    found = 0
    following = bad.offset + bad.size - segment.start
    if bad.size >= 91 and following < segment.size:
        after = segment.decode(following, read_properties=False)
        found += type(after) is record.Record
    for start, path, size in planning.segments(directory):
        if start <= segment.start:
            continue
        other = planning.open_segment(path, start, size)
        if other is None:
            continue
        with other:
            first = other.decode(0, read_properties=False)
            found += type(first) is record.Record
            del first
    return found


def _report_invalid(part: SegmentRange, segment: Segment, bad: record.Invalid) -> None:
    after = valid_records_after(part.directory, segment, bad)
    if after:
        raise CorruptLogError(
            f"broker {part.broker}: corrupt record at commit-log offset {bad.offset} ({bad.reason}) "
            f"with {after}+ valid record(s) after it; the read stops there. Read the records before it "
            f"with endOffset={bad.offset} (`--end-offset {bad.offset}` on the command line), or repair the "
            f"store (`tidemq store repair`)"
        )
    log.warning(
        "broker %s: torn tail at commit-log offset %d (%s): the read stops at the last valid record, which ends at %d",
        part.broker,
        bad.offset,
        bad.reason,
        bad.offset,
    )


class CommitLogDataSource(DataSource):
    """`tidemq-commitlog`: the records of one or more brokers' commit logs."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        chosen = self.options.get("columns")
        if chosen:
            return cols.select_schema([c.strip() for c in chosen.split(",") if c.strip()])
        return cols.SCHEMA

    def _logs(self) -> list[CommitLogDir]:
        brokers = self.options.get("brokers")
        names = [b.strip() for b in brokers.split(",")] if brokers else None
        paths = planning.paths_from_options(self.options)
        if names is not None and len(names) != len(paths):
            raise ValueError(f"option brokers names {len(names)} broker(s) for {len(paths)} path(s)")
        return planning.resolve(paths, names)

    def reader(self, schema: StructType) -> CommitLogReader:
        return CommitLogReader(self._logs(), self.options, schema)

    def streamReader(self, schema: StructType) -> CommitLogStreamReader:
        from .stream import CommitLogStreamReader

        return CommitLogStreamReader(self._logs(), self.options, schema)


class CommitLogReader(DataSourceReader):
    def __init__(self, logs: list[CommitLogDir], options, schema: StructType) -> None:
        self.logs = logs
        self.settings = ReadSettings(options, schema)
        size = options.get("partitionSize")
        self.partition_size = parse_size(str(size)) if size else planning.default_partition_size(logs)
        self.start = int(options.get("startOffset", 0))
        self.end = int(options.get("endOffset", NO_END))

    def partitions(self) -> Sequence[InputPartition]:
        return planning.plan(self.logs, self.partition_size, self.start, self.end)

    def read(self, partition: InputPartition) -> Iterator:
        return read_range(partition, self.settings)
