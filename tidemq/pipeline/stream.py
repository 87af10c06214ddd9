"""The streaming side of `tidemq-commitlog`: offsets are commit-log positions, one per broker.

    {"broker-a": 1048576, "broker-b": 0}

`latestOffset` walks each log from the last end with the store's decoder (CRC checked), so a
micro-batch ends at the last *fully written* record: a record whose header is in place but whose
body is still being copied is left for the next batch.  Each micro-batch is then planned and read
like a batch read of [start, end)."""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from . import plan as planning
from .plan import CommitLogDir
from .source import ReadSettings, parse_size, read_range


class CommitLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, logs: list[CommitLogDir], options, schema: StructType) -> None:
        self.logs = logs
        self.settings = ReadSettings(options, schema)
        size = options.get("partitionSize")
        self.partition_size = parse_size(str(size)) if size else planning.default_partition_size(logs)
        self.starting = str(options.get("startingOffsets", "earliest")).strip().lower()
        if self.starting not in ("earliest", "latest") and not self.starting.isdigit():
            raise ValueError(f"startingOffsets must be earliest, latest or an offset, not {self.starting!r}")
        max_bytes = options.get("maxBytesPerTrigger")
        self.max_bytes = parse_size(str(max_bytes)) if max_bytes else None
        self.target: dict | None = None  # Trigger.AvailableNow: read no further than this

    def initialOffset(self) -> dict:
        offsets = {}
        for log in self.logs:
            first = planning.first_offset(log)
            if self.starting == "earliest":
                offsets[log.broker] = first
            elif self.starting == "latest":
                offsets[log.broker] = planning.log_end(log, first)
            else:
                offsets[log.broker] = _record_start(log, max(int(self.starting), first))
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxBytes(self.max_bytes) if self.max_bytes else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {log.broker: planning.chain_end(log) for log in self.logs}

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        if start is None:
            start = self.initialOffset()
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        out = {}
        for log in self.logs:
            begin = int(start.get(log.broker, planning.first_offset(log)))
            stop = planning.NO_END if max_bytes is None else begin + max_bytes
            if self.target is not None:
                stop = min(stop, max(begin, self.target[log.broker]))
            # the first record boundary at or past `stop`, or the end of the valid records
            out[log.broker] = planning.log_end(log, begin, stop=stop) if stop > begin else begin
        return out

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for log in self.logs:
            lo, hi = int(start.get(log.broker, 0)), int(end.get(log.broker, 0))
            if hi > lo:
                parts.extend(planning.plan_log(log, self.partition_size, lo, hi, start_aligned=True))
        return parts

    def read(self, partition: InputPartition) -> Iterator:
        return read_range(partition, self.settings)

    def commit(self, end: dict) -> None:
        pass


def _record_start(log: CommitLogDir, offset: int) -> int:
    """`offset`, if a record starts there (or the log ends there); a stream started anywhere else
    would wait forever for a record boundary that never comes, so that is an error."""
    boundary = planning.record_boundary_from(log, offset)
    if boundary > offset:
        raise ValueError(
            f"startingOffsets {offset} for broker {log.broker!r} is inside a record; the next record starts at {boundary}"
        )
    if boundary < offset:
        raise ValueError(f"startingOffsets {offset} for broker {log.broker!r} is past the end of its log, {boundary}")
    return offset
