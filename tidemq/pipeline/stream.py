"""The streaming side of `tidemq-commitlog`: offsets are commit-log positions, one per broker.

    {"broker-a": 1048576, "broker-b": 0}

`latestOffset` walks each log from the last end with the store's decoder (CRC checked), so a
micro-batch ends at the last *fully written* record: a record whose header is in place but whose
body is still being copied is left for the next batch.  Each micro-batch is then planned and read
like a batch read of [start, end)."""

from __future__ import annotations

from typing import Iterator

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from . import plan as planning
from .plan import CommitLogDir
from .source import ReadSettings, parse_size, read_range


class CommitLogStreamReader(DataSourceStreamReader):
    def __init__(self, logs: list[CommitLogDir], options, schema: StructType) -> None:
        self.logs = logs
        self.settings = ReadSettings(options, schema)
        self.partition_size = parse_size(str(options.get("partitionSize", planning.DEFAULT_PARTITION_SIZE)))
        self.starting = str(options.get("startingOffsets", "earliest")).strip().lower()
        if self.starting not in ("earliest", "latest") and not self.starting.isdigit():
            raise ValueError(f"startingOffsets must be earliest, latest or an offset, not {self.starting!r}")
        max_bytes = options.get("maxBytesPerTrigger")
        self.max_bytes = parse_size(str(max_bytes)) if max_bytes else None

    def initialOffset(self) -> dict:
        offsets = {}
        for log in self.logs:
            first = planning.first_offset(log)
            if self.starting == "earliest":
                offsets[log.broker] = first
            elif self.starting == "latest":
                offsets[log.broker] = planning.log_end(log, first)
            else:
                offsets[log.broker] = max(int(self.starting), first)
        return offsets

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        if start is None:
            start = self.initialOffset()
        out = {}
        for log in self.logs:
            begin = int(start.get(log.broker, planning.first_offset(log)))
            end = planning.log_end(log, begin)
            if self.max_bytes is not None and end - begin > self.max_bytes:
                # cut at a record boundary at or after begin + max_bytes
                end = planning.log_end(log, begin, stop=begin + self.max_bytes)
            out[log.broker] = end
        return out

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for log in self.logs:
            lo, hi = int(start.get(log.broker, 0)), int(end.get(log.broker, 0))
            if hi > lo:
                parts.extend(planning.plan_log(log, self.partition_size, lo, hi))
        return parts

    def read(self, partition: InputPartition) -> Iterator:
        return read_range(partition, self.settings)

    def commit(self, end: dict) -> None:
        pass
