"""Planning a commit-log read: which logs, which segments, which record-aligned byte ranges.

A path names a store directory (`{store}/commitlog/` inside) or a commitlog directory itself;
each is one broker's log.  Paths may be local or URIs (`files`: file://, hdfs://, s3://).  Every
segment is cut into ranges of about `partition_size` bytes whose ends are record boundaries,
found **in the planner** by walking the TOTALSIZE chain (`record.skip_records`: 8 bytes read per
record, no decoding; a remote segment is read through once for it, so remote logs default to one
range per segment, which needs no walk).  Records never span segments, so a range never does
either.  A range holds the records that *start* inside it.

The last range of a segment runs to the segment's end (or the read's end offset), so the task
reading it meets whatever ends the data there — a blank, zeros or damage — and reports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from ..store import record
from . import files
from .files import Segment

SEGMENT_NAME_LENGTH = 20
DEFAULT_PARTITION_SIZE = 64 << 20
NO_END = 1 << 62


@dataclass(frozen=True)
class CommitLogDir:
    broker: str
    directory: str  # the commitlog directory


@dataclass
class SegmentRange(InputPartition):
    """Records starting in [lo, hi) of one segment (commit-log offsets)."""

    broker: str
    directory: str
    path: str
    segment_start: int
    lo: int
    hi: int

    def __post_init__(self) -> None:
        self.value = None


def resolve(paths: list[str], brokers: list[str] | None = None) -> list[CommitLogDir]:
    """The commit-log directories behind the given paths, each with its broker name (the store
    directory's name unless `brokers` names them).  A path with neither is the caller's error."""
    logs: list[CommitLogDir] = []
    for index, raw in enumerate(paths):
        location = files.normalize(raw)
        inside = files.join(location, "commitlog")
        if files.is_dir(inside):
            directory, store = inside, location
        elif files.is_dir(location) and (files.basename(location) == "commitlog" or _segment_files(location)):
            directory = location
            store = files.parent(location) if files.basename(location) == "commitlog" else location
        else:
            raise ValueError(f"{raw}: neither a store directory (with commitlog/) nor a commit-log directory")
        name = brokers[index] if brokers else (files.basename(store) or store)
        logs.append(CommitLogDir(name, directory))
    names = [log.broker for log in logs]
    if len(set(names)) != len(names):
        if brokers:
            raise ValueError(f"broker names must differ: {names}")
        logs = [CommitLogDir(files.parent(log.directory), log.directory) for log in logs]
    return logs


def paths_from_options(options) -> list[str]:
    """`load(path)` sets "path"; `load([p1, p2])` sets "paths" (a JSON list)."""
    paths: list[str] = []
    if options.get("paths"):
        raw = options["paths"]
        paths.extend(json.loads(raw) if raw.lstrip().startswith("[") else raw.split(","))
    if options.get("path"):
        paths.append(options["path"])
    if not paths:
        raise ValueError("tidemq-commitlog needs a path: .load(store_dir) or .load([store_dir, ...])")
    return paths


def _segment_files(directory: str) -> list[tuple[str, int]]:
    return [
        (name, size)
        for name, size, is_dir in files.listdir(directory)
        if not is_dir and name.isdigit() and len(name) == SEGMENT_NAME_LENGTH
    ]


def segments(directory: str) -> list[tuple[int, str, int]]:
    """(start offset, location, file size) of each segment, oldest first."""
    return [(int(name), files.join(directory, name), size) for name, size in _segment_files(directory)]


def default_partition_size(logs: list[CommitLogDir]) -> int:
    """64 MiB ranges for local logs; whole segments when a log is remote (no planner walk)."""
    if all(files.is_local(log.directory) for log in logs):
        return DEFAULT_PARTITION_SIZE
    return NO_END


def open_segment(location: str, start: int, size: int | None = None) -> Segment | None:
    """A segment opened for reading; None for an empty file."""
    segment = Segment(location, start, size)
    if segment.size == 0:
        segment.close()
        return None
    return segment


def plan_log(
    log: CommitLogDir, partition_size: int, start: int = 0, end: int = NO_END, start_aligned: bool = False
) -> list[SegmentRange]:
    """Record-aligned ranges covering the records of one log that start in [start, end).
    `start_aligned` says `start` is known to be a record boundary (a streaming offset), so the
    segment's chain need not be walked up to it."""
    ranges: list[SegmentRange] = []
    for seg_start, path, size in segments(log.directory):
        if seg_start + size <= start or seg_start >= end or size == 0:
            continue
        segment = open_segment(path, seg_start, size)
        if segment is None:
            continue
        with segment:
            limit = min(segment.size, end - seg_start)  # relative to the segment
            lo = 0
            if start > seg_start:
                lo = start - seg_start if start_aligned else segment.skip(0, start - seg_start)
            while lo < limit:
                target = lo + partition_size
                hi = segment.skip(lo, target) if target < limit else limit
                if hi < target or hi >= limit:
                    # the chain ends (or the read does) in this range: run it to the limit
                    hi = limit
                ranges.append(SegmentRange(log.broker, log.directory, path, seg_start, seg_start + lo, seg_start + hi))
                lo = hi
    return ranges


def plan(logs: list[CommitLogDir], partition_size: int, start: int = 0, end: int = NO_END) -> list[SegmentRange]:
    if partition_size < 1:
        raise ValueError(f"partitionSize must be positive, got {partition_size}")
    return [r for log in logs for r in plan_log(log, partition_size, start, end)]


def log_end(log: CommitLogDir, start: int, stop: int = NO_END) -> int:
    """The end of the last fully valid record at or after `start` (a record boundary): what a
    tailing reader may read now (or the first record boundary at or past `stop`).  Decodes with
    CRC, so a record still being written — its header in place, its body not yet — is left out."""
    position = start
    first = True
    for seg_start, path, size in segments(log.directory):
        if seg_start + size <= position:
            continue
        if seg_start > position:
            if not first:
                break  # a gap in the segment files: the readable log ends before it
            position = seg_start  # older segments were deleted (retention)
        first = False
        segment = open_segment(path, seg_start)
        if segment is None:
            break
        with segment:
            pos = position - seg_start
            result = None
            while seg_start + pos < stop:
                result = segment.decode(pos, read_body=False, read_properties=False)
                if type(result) is not record.Record:
                    break
                pos += result.total_size
        if seg_start + pos >= stop:
            return seg_start + pos
        if type(result) is record.EndOfSegment:
            position = seg_start + size
            continue
        position = seg_start + pos
        break
    return position


def record_boundary_from(log: CommitLogDir, offset: int) -> int:
    """The first record boundary at or after `offset` (or the end of the valid records, if that
    comes first): equal to `offset` exactly when a reader may start there.  A record there that
    names its own position settles it; otherwise its segment is walked from the start."""
    found = segments(log.directory)
    holding = [(seg_start, path) for seg_start, path, size in found if seg_start <= offset < seg_start + size]
    if holding:
        seg_start, path = holding[0]
        segment = open_segment(path, seg_start)
        if segment is not None:
            with segment:  # a record (or closing blank) that names this position: the common case
                result = segment.decode(offset - seg_start, read_body=False, read_properties=False)
            if type(result) is record.EndOfSegment or (
                type(result) is record.Record and result.commit_log_offset == offset
            ):
                return offset
    walk_from = holding[0][0] if holding else (found[-1][0] if found else 0)
    return log_end(log, min(walk_from, offset), stop=offset)


def first_offset(log: CommitLogDir) -> int:
    """The log's minimum offset: the start of its oldest segment (0 for an empty log)."""
    found = segments(log.directory)
    return found[0][0] if found else 0


def tail_damage(log: CommitLogDir) -> record.Invalid | None:
    """The invalid record that ends the log, if its last record is not valid: a torn tail.  Walks
    the newest non-empty segment's size chain (8 bytes per record) and decodes only the last
    record (CRC checked) and what follows it."""
    for seg_start, path, size in reversed(segments(log.directory)):
        segment = open_segment(path, seg_start, size)
        if segment is None:
            continue
        with segment:
            pos, last = 0, None
            while True:
                following = segment.skip(pos, pos + 1)
                if following == pos:
                    break
                last, pos = pos, following
            if last is None and pos == 0 and not any(segment.read(0, 8)):
                continue  # an empty segment: the tail is in an older one
            found = None
            if last is not None:
                result = segment.decode(last, read_properties=False)
                if type(result) is record.Invalid:
                    found = result
                del result
            if found is None:
                result = segment.decode(pos, read_properties=False)
                if type(result) is record.Invalid:
                    found = result
                del result
            return found
    return None


def chain_end(log: CommitLogDir) -> int:
    """Where the newest segment's size chain ends (8 bytes read per record, nothing validated):
    a cheap bound on what has been written so far."""
    for seg_start, path, _size in reversed(segments(log.directory)):
        segment = open_segment(path, seg_start)
        if segment is None:
            continue
        with segment:
            pos = segment.skip(0, segment.size)
            if pos == 0 and not any(segment.read(0, 8)):
                continue
            if pos < segment.size:
                ending = segment.decode(pos, read_body=False, read_properties=False)
                if type(ending) is record.EndOfSegment:
                    pos = segment.size
        return seg_start + pos
    return 0
