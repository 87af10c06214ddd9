"""Dispatch requests and sinks: what building the indexes (ConsumeQueues, later light queues and the key index)
from the CommitLog hands to each index.

A `DispatchRequest` is what one record contributes to the indexes; it knows its queue slot
because queue offsets are assigned at append time.  A `DispatchBatch` is a run of them in
columnar form (`scan.RecordColumns`: NumPy arrays of offsets, sizes, queue ids and offsets,
sysflags, store times, tags codes), with the list of `DispatchRequest`s built only for a sink
that asks for objects.  A `DispatchSink` takes batches: `dispatch_batch(batch, changes)` if it
has one, else `dispatch(batch.requests, changes)`.  Sinks may write slots out of order, and each
reports the queues whose commit frontier moved so that listeners (long polling) are told only of
committed entries.

This module is the contract between dispatch and its sinks (`queues.queue_set`,
`index.key_index`); the dispatchers are `sequential.Dispatcher` and `parallel.ParallelDispatcher`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..format import record
from ..format.scan import RecordColumns
from ..format.special_queues import PROPERTY_DELAY, queue_tags_code
from ..queues.consume_queue import UNIT_DTYPE

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
# listener(changes): changes maps (topic, queue id) -> new commit frontier (exclusive max offset)
ArrivalListener = Callable[[dict[QueueKey, int]], None]


@dataclass(slots=True)
class DispatchRequest:
    topic: str
    queue_id: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    sysflag: int
    properties: dict[str, str]

    @classmethod
    def from_record(cls, rec: record.Record) -> DispatchRequest:
        return cls(
            topic=rec.topic,
            queue_id=rec.queue_id,
            commit_log_offset=rec.commit_log_offset,
            size=rec.total_size,
            tags_code=queue_tags_code(
                rec.topic, rec.properties.get(PROPERTY_DELAY), rec.store_timestamp, record.tags_code(rec.tags)
            ),
            store_timestamp=rec.store_timestamp,
            queue_offset=rec.queue_offset,
            sysflag=rec.sysflag,
            properties=rec.properties,
        )

    @classmethod
    def from_columns(cls, columns: RecordColumns, i: int) -> DispatchRequest:
        return cls(
            columns.topic(i),
            int(columns.queue_ids[i]),
            int(columns.offsets[i]),
            int(columns.sizes[i]),
            int(columns.tags_codes[i]),
            int(columns.store_timestamps[i]),
            int(columns.queue_offsets[i]),
            int(columns.sysflags[i]),
            columns.properties(i),
        )

    @property
    def builds_queue_entry(self) -> bool:
        """PREPARED and ROLLBACK transaction records get no queue entry."""
        return self.sysflag & record.TRANSACTION_TYPE_MASK in record.QUEUE_ENTRY_KINDS

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(record.PROPERTY_KEYS)
        return [k for k in raw.split(record.KEY_SEPARATOR) if k] if raw else []

    @property
    def unique_key(self) -> str | None:
        return self.properties.get(record.PROPERTY_UNIQ_KEY)

    @property
    def tags(self) -> str | None:
        return self.properties.get(record.PROPERTY_TAGS)


class DispatchBatch:
    """A run of records to dispatch, in log order: `columns` (see `scan.RecordColumns`) and, built
    on first use, `requests`, one `DispatchRequest` per record for sinks that want objects."""

    __slots__ = ("columns", "_requests")

    def __init__(self, columns: RecordColumns) -> None:
        self.columns = columns
        self._requests: list[DispatchRequest] | None = None

    def __len__(self) -> int:
        return len(self.columns)

    @property
    def requests(self) -> list[DispatchRequest]:
        if self._requests is None:
            from_columns = DispatchRequest.from_columns
            self._requests = [from_columns(self.columns, i) for i in range(len(self.columns))]
        return self._requests


def dispatch_to(sink, batch: DispatchBatch, changes: dict[QueueKey, int]) -> None:
    """Hand `batch` to `sink` in columnar form if it takes that, else as requests."""
    dispatch_batch = getattr(sink, "dispatch_batch", None)
    if dispatch_batch is not None:
        dispatch_batch(batch, changes)
    else:
        sink.dispatch(batch.requests, changes)


def builds_queue_entry(sysflags: np.ndarray) -> np.ndarray:
    """Per SYSFLAG: does its record get a ConsumeQueue entry (PREPARED and ROLLBACK do not)?  One
    comparison per kind, cheaper than `np.isin`: every batch a worker builds and every segment
    recovery scans passes here."""
    kinds = sysflags & record.TRANSACTION_TYPE_MASK
    first, *others = record.QUEUE_ENTRY_KINDS
    entry = kinds == first
    for kind in others:
        entry |= kinds == kind
    return entry


def queue_rows(columns: RecordColumns, count: int | None = None) -> np.ndarray:
    """The rows (of the first `count`, or all) whose records get a ConsumeQueue entry."""
    return np.flatnonzero(builds_queue_entry(columns.sysflags[:count]))


def queue_codes(columns: RecordColumns, rows: np.ndarray) -> np.ndarray:
    """Each row's queue as one int64: topic id, then queue id as unsigned (within this scan)."""
    return (columns.topic_ids[rows].astype(np.int64) << 32) | (columns.queue_ids[rows].astype(np.int64) & 0xFFFFFFFF)


def group_by_queue(
    columns: RecordColumns, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`rows` of a columnar batch grouped by queue (`queue_codes` order; log order within a
    queue): the rows in that order, where each group starts and where it stops (int64 arrays),
    each row's slot (queue offset) and its ConsumeQueue unit (UNIT_DTYPE)."""
    queue_keys = queue_codes(columns, rows)
    order = np.argsort(queue_keys, kind="stable")
    rows = rows[order]
    sorted_keys = queue_keys[order]
    bounds = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.concatenate((np.zeros(1, np.int64), bounds))
    stops = np.concatenate((bounds, np.array([len(rows)], np.int64)))
    units = np.empty(len(rows), dtype=UNIT_DTYPE)
    units["offset"] = columns.offsets[rows]
    units["size"] = columns.sizes[rows]
    units["tags_code"] = columns.tags_codes[rows]
    return rows, starts, stops, columns.queue_offsets[rows], units


def notify_listeners(listeners: list[ArrivalListener], changes: dict[QueueKey, int]) -> None:
    """Tell every listener which queues' frontiers moved; a listener's bug must not stop dispatch."""
    for listener in listeners:
        try:
            listener(changes)
        except Exception:
            log.exception("arrival listener failed")


class DispatchSink(Protocol):
    name: str

    def dispatch(self, requests: list[DispatchRequest], changes: dict[QueueKey, int]) -> None:
        """Index `requests`; record each queue whose frontier moved in `changes`."""

    # optional: def dispatch_batch(self, batch: DispatchBatch, changes) -> None, the same in
    # columnar form; a sink without it is given `batch.requests`; and reads_keys = True for a
    # sink that asks each batch for `columns.index_keys()`: the scan then makes them as it walks

    def covered_offset(self) -> int:
        """A commit-log offset below which everything is indexed (recovery restarts there)."""

    def truncate(self, commit_log_end: int) -> None:
        """Forget entries for records at or past `commit_log_end`."""

    def flush(self) -> None: ...

    def close(self) -> None: ...
