"""The sequential Dispatcher: tails the CommitLog and feeds every sink, one batch at a time, on
the calling thread.  The parallel dispatcher builds the same files (tests compare the two).

The `Dispatcher` tails the log from `dispatched_offset` up to a limit the caller gives it,
decoding with the columnar scan (`scan.scan`) and asking the shared record codec why it stopped
where it did.  Ownership: `dispatch_until` runs on one thread at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..format import record
from ..format.scan import scan
from ..log.commit_log import CommitLog
from .requests import ArrivalListener, DispatchBatch, DispatchSink, QueueKey, dispatch_to, notify_listeners


@dataclass(slots=True)
class DispatchStats:
    records: int = 0
    bytes: int = 0
    last_store_timestamp: int = 0


def reads_keys(sinks: Iterable[DispatchSink]) -> bool:
    """Whether a sink asks each batch for `columns.index_keys()` (`reads_keys`, see
    DispatchSink): the scans are then asked for keys, and make them as they walk."""
    return any(getattr(sink, "reads_keys", False) for sink in sinks)


class Dispatcher:
    """Tails the CommitLog and feeds every sink, one batch of records at a time."""

    def __init__(self, commit_log: CommitLog, sinks: Iterable[DispatchSink], start_offset: int) -> None:
        self.commit_log = commit_log
        self.sinks = list(sinks)
        self._keys = reads_keys(self.sinks)
        self.dispatched_offset = start_offset
        self.listeners: list[ArrivalListener] = []
        self.stats = DispatchStats()
        self.batch_bytes = 4 << 20

    def dispatch_until(self, limit: int, notify: bool = True) -> int:
        """Dispatch every record wholly below `limit`; returns how many records."""
        total = 0
        while self.dispatched_offset < limit:
            batch, next_offset = self._read_batch(limit)
            if next_offset == self.dispatched_offset:
                break
            changes: dict[QueueKey, int] = {}
            count = len(batch)
            if count:
                for sink in self.sinks:
                    dispatch_to(sink, batch, changes)
                self.stats.records += count
                self.stats.last_store_timestamp = int(batch.columns.store_timestamps[-1])
            self.stats.bytes += next_offset - self.dispatched_offset
            self.dispatched_offset = next_offset
            total += count
            if notify and changes:
                notify_listeners(self.listeners, changes)
        return total

    def _read_batch(self, limit: int) -> tuple[DispatchBatch, int]:
        offset = self.dispatched_offset
        segment = self.commit_log.segment_for(offset)
        if segment is None:
            return DispatchBatch(scan(b"", 0, 0, offset)), offset
        mm = segment.mm
        base = segment.start
        stop = min(limit, segment.end)
        columns = scan(
            mm, offset - base, stop - base, base, soft_stop=offset + self.batch_bytes - base, keys=self._keys
        )
        return DispatchBatch(columns), self._past_blank(segment, columns.end, stop)

    @staticmethod
    def _past_blank(segment, offset: int, stop: int) -> int:
        """Where dispatch goes on from `offset`, where the scan stopped: past the segment's end if
        a blank is there; otherwise it stays (nothing more readable yet — the writer has not
        reached it — or damage that recovery will report: dispatch never skips past it)."""
        if offset >= stop:
            return offset
        result = record.decode(
            segment.mm,
            offset - segment.start,
            base_offset=segment.start,
            check_crc=False,
            read_body=False,
            read_properties=False,
        )
        if type(result) is record.EndOfSegment:
            return segment.end
        return offset
