"""Recovery: find the last valid record, cut what follows, and re-dispatch what the indexes miss.

Policy (spec §6, STYLE "corruption policy is explicit"):
- The log is validated (layout and body CRC) from the segment holding the earliest offset any
  index may be missing, or — after an abnormal exit (abort marker present) — from the segment
  the checkpoint says was safely flushed and dispatched.
- The first invalid record ends the log *if nothing valid follows it*: a torn tail.  It is cut
  (zeroed, later segments deleted) and the cut is logged with its offset and size.
- An invalid record *followed by valid data* is corruption in the middle.  The store refuses to
  open (CorruptStoreError names the offset) unless opened with repair=True, which cuts the log
  there and keeps a copy of every byte it cut under `{store}/repair/`.
- Indexes are truncated to the recovered end and rebuilt from the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from . import record
from .checkpoint import Checkpoint
from .commit_log import CommitLog, Segment

log = logging.getLogger(__name__)


@dataclass
class LogScan:
    """What a validation pass over the log found."""

    end: int  # offset just past the last valid record
    records: int = 0
    last_store_timestamp: int = 0
    # (topic, queue id) -> one past the highest queue offset of a queue-building record seen
    queue_ends: dict[tuple[str, int], int] = field(default_factory=dict)
    invalid: record.Invalid | None = None
    corrupt_in_middle: bool = False
    valid_after_invalid: int = 0  # valid records found after the invalid one (middle corruption)


@dataclass
class RecoveryReport:
    abnormal: bool
    scan_from: int
    end: int
    cut_bytes: int = 0
    redispatched_from: int = 0
    messages: list[str] = field(default_factory=list)


def scan_log(commit_log: CommitLog, start: int, check_crc: bool = True) -> LogScan:
    """Validate records from `start` (a record boundary) to the end of the last segment."""
    scan = LogScan(end=start)
    offset = start
    while True:
        segment = commit_log.segment_for(offset)
        if segment is None:
            break
        result = record.decode(segment.mm, offset - segment.start, base_offset=segment.start, check_crc=check_crc, read_body=check_crc, read_properties=False)
        if type(result) is record.Record:
            offset += result.total_size
            scan.end = offset
            scan.records += 1
            scan.last_store_timestamp = result.store_timestamp
            if result.sysflag & record.TRANSACTION_TYPE_MASK in (record.TRANSACTION_NOT, record.TRANSACTION_COMMIT):
                scan.queue_ends[(result.topic, result.queue_id)] = result.queue_offset + 1
        elif type(result) is record.EndOfSegment:
            offset = segment.end
            if commit_log.segment_for(offset) is None:
                break
            scan.end = offset
        elif type(result) is record.EndOfData:
            break
        else:
            scan.invalid = result
            scan.valid_after_invalid = _valid_records_after(commit_log, segment, result)
            scan.corrupt_in_middle = scan.valid_after_invalid > 0
            break
    return scan


def _valid_records_after(commit_log: CommitLog, segment: Segment, bad: record.Invalid) -> int:
    """Is there valid data after the invalid record?  Look at the record its declared size
    points to, and at the first record of every later segment."""
    candidates = []
    if bad.size >= 91 and bad.offset + bad.size < segment.end:
        candidates.append(bad.offset + bad.size)
    candidates.extend(s.start for s in commit_log.segments if s.start > segment.start)
    found = 0
    for offset in candidates:
        seg = commit_log.segment_for(offset)
        result = record.decode(seg.mm, offset - seg.start, base_offset=seg.start, read_properties=False)
        if type(result) is record.Record:
            found += 1
    return found


def choose_scan_start(commit_log: CommitLog, covered: int, checkpoint: Checkpoint, abnormal: bool) -> int:
    """The start of the segment from which the log must be validated: like RocketMQ, two
    segments before the one holding the earliest offset an index may miss."""
    if not commit_log.segments:
        return 0
    start = min(covered, checkpoint.confirm_phy_offset) if abnormal else covered
    start = max(start, commit_log.min_offset)
    segment = commit_log.segment_for(start) or commit_log.segments[-1]
    segment = commit_log.segments[max(0, commit_log.segments.index(segment) - 2)]
    if abnormal:
        # walk back while the segment's first record is newer than the checkpoint's safe time
        index = commit_log.segments.index(segment)
        while index > 0:
            first = commit_log.read_record(commit_log.segments[index].start, check_crc=False, read_body=False, read_properties=False)
            if type(first) is record.Record and first.store_timestamp <= checkpoint.min_timestamp:
                break
            index -= 1
        segment = commit_log.segments[index]
    return segment.start


def cut_tail(commit_log: CommitLog, end: int, store_dir: Path, keep_copy: bool) -> int:
    """Cut the log at `end`; with keep_copy, save the cut bytes under {store}/repair/."""
    cut = 0
    repair_dir = store_dir / "repair"
    for segment in list(commit_log.segments):
        if segment.end <= end:
            continue
        lo = max(end, segment.start) - segment.start
        data = segment.mm[lo:]
        used = len(data.rstrip(b"\0"))
        cut += used
        if keep_copy and used:
            repair_dir.mkdir(exist_ok=True)
            (repair_dir / f"{segment.start + lo:020d}.cut").write_bytes(data[:used])
    commit_log.truncate(end)
    return cut
