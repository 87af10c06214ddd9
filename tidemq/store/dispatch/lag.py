"""Dispatch lag, per sink: how far each index is behind the CommitLog.

    bytes        = confirmed offset (what dispatch may read) - the offset below which the sink
                   has everything (RocketMQ's dispatchBehindBytes)
    milliseconds = store time of the newest record - store time of the last record the sink
                   indexed (dispatchBehindMilliseconds); 0 when nothing is behind

`sink_lags` serves a running store (MessageStore.dispatch_lag, the broker's metrics);
`offline_lags` serves `tidemq store inspect` on a directory, reading files only.
"""

from __future__ import annotations

import logging
import mmap
from pathlib import Path

from ..format import record

log = logging.getLogger(__name__)


def sink_lags(dispatcher, confirmed: int, newest_timestamp: int) -> dict[str, tuple[int, int]]:
    """{sink name: (bytes behind, milliseconds behind)} for a running dispatcher."""
    progress = getattr(dispatcher, "progress", None)
    out: dict[str, tuple[int, int]] = {}
    for sink in dispatcher.sinks:
        if progress is not None and sink.name in progress:
            offset, last = progress[sink.name].offset, progress[sink.name].last_store_timestamp
        else:  # the sequential dispatcher feeds every sink of a batch in the same call
            offset = dispatcher.dispatched_offset
            last = dispatcher.stats.last_store_timestamp
        behind = max(0, confirmed - offset)
        out[sink.name] = (behind, milliseconds_behind(dispatcher.commit_log, offset, last, newest_timestamp, behind))
    return out


def milliseconds_behind(commit_log, offset: int, last: int, newest_timestamp: int, behind: int) -> int:
    """Store time of the newest record - `last`, that of the last record dispatched (0 when not
    `behind`); with nothing dispatched since opening (`last` 0), the age of the oldest record
    waiting, the one at `offset`."""
    if not behind:
        return 0
    if not last:
        last = _store_time_at(commit_log, offset) or newest_timestamp
    return max(0, newest_timestamp - last)


def _store_time_at(commit_log, offset: int) -> int | None:
    rec = commit_log.read_record(offset, check_crc=False, read_body=False, read_properties=False)
    return rec.store_timestamp if type(rec) is record.Record else None


def offline_lags(store_dir: Path, log_end: int, queue_covered: int) -> dict[str, tuple[int, int]]:
    """{sink name: (bytes, milliseconds)} from the files of a store directory.  `queue_covered` is
    the ConsumeQueues' furthest indexed offset (exact after a clean shutdown)."""
    from ..index.index_file import IndexFile
    from ..index.key_index import index_paths
    from ..log.commit_log import segment_paths

    segments = {int(p.name): p for p in segment_paths(store_dir)}
    size = next(iter(segments.values())).stat().st_size if segments else 0
    maps: dict[int, mmap.mmap] = {}  # each segment mapped once

    def read(offset: int) -> record.Record | None:
        base = offset - offset % size if size else 0
        if base not in segments:
            return None
        mm = maps.get(base)
        if mm is None:
            with open(segments[base], "rb") as f:
                mm = maps[base] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        rec = record.decode(
            mm, offset - base, base_offset=base, check_crc=False, read_body=False, read_properties=False
        )
        return rec if type(rec) is record.Record else None

    def newest_before(end: int) -> int:
        """Store time of the record that ends at `end` (0 if none): scan its segment."""
        if end <= 0 or not size:
            return 0
        base = (end - 1) - (end - 1) % size
        offset, last = base, 0
        while offset < end:
            rec = read(offset)
            if rec is None:
                break
            last = rec.store_timestamp
            offset += rec.total_size
        return last

    try:
        newest = newest_before(log_end)
        out = {}
        covered = {"consume_queue": queue_covered}
        index_files = index_paths(Path(store_dir) / "index")
        if index_files:
            try:
                last_file = IndexFile(index_files[-1], 1, 2, create=False, read_only=True)
            except ValueError as exc:  # a damaged index file: `tidemq store check` says more
                log.warning("key index not measured: %s", exc)
            else:
                try:
                    indexed = last_file.entry_count > 0
                    end_phy = last_file.end_phy if indexed else 0
                finally:
                    last_file.close()
                rec = read(end_phy) if indexed else None  # (the last entry may be the record at 0)
                covered["key_index"] = end_phy + rec.total_size if rec is not None else end_phy
        for name, offset in covered.items():
            behind = max(0, log_end - offset)
            out[name] = (behind, max(0, newest - newest_before(offset)) if behind else 0)
        return out
    finally:
        for mm in maps.values():
            mm.close()
