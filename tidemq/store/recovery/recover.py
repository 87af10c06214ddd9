"""Recovery: find the last valid record, cut what follows, and re-dispatch what the indexes miss.

Policy (spec §6, STYLE "corruption policy is explicit"):
- The log is validated (layout and body CRC) from the offset the checkpoint vouches for (below
  it everything was flushed and dispatched when it was saved; its record must be there and
  sound), after a clean stop and an abnormal exit (abort marker present) alike, as RocketMQ
  5.5.0's accelerated recovery does: records before it are not read again at open (reads check
  each record's CRCs, and `tidemq store check` validates the whole log).  Without such an offset
  (no checkpoint, or one older than RocketMQ 5.5.0's), from the segment holding the earliest offset any index
  may be missing, or — after an abnormal exit — from the segment the checkpoint says was safely
  flushed and dispatched.
- The first invalid record ends the log *if nothing valid follows it*: a torn tail.  It is cut
  (zeroed, later segments deleted) and the cut is logged with its offset and size.
- An invalid record *followed by valid data* is corruption in the middle.  The store refuses to
  open (CorruptStoreError names the offset) unless opened with repair=True, which cuts the log
  there and keeps a copy of every byte it cut under `{store}/repair/`.
- Indexes are truncated to the recovered end (the key index, after an abnormal exit, to what the
  checkpoint says it had flushed) and rebuilt from the log from each index's own end.

`recover` carries out this policy when a store opens; the rest of the module are its steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..dispatch.requests import QueueKey, queue_codes, queue_rows
from ..errors import CorruptStoreError
from ..format import record
from ..format.scan import RecordColumns, field_at, field_view, header_sizes, scan
from ..log.checkpoint import Checkpoint
from ..log.commit_log import CommitLog, Segment
from ..queues.queue_set import ConsumeQueueStore
from .quarantine import keep_damaged, placeholder

if TYPE_CHECKING:
    from ..index.key_index import KeyIndex

_compiled_crc_prefix: Callable[..., int] | None
try:
    from .._dispatch import crc_prefix as _compiled_crc_prefix
except ImportError:  # the extension is optional: without it, the loop over the bodies is Python's
    _compiled_crc_prefix = None

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


# bytes of the log validated per columnar scan (its columns for about 250,000 small records)
SCAN_CHUNK_BYTES = 64 << 20


def scan_log(commit_log: CommitLog, start: int, check_crc: bool = True) -> LogScan:
    """Validate records from `start` (a record boundary) to the end of the last segment.

    Runs of valid records are read by the columnar scan (`scan.scan`, the layout checks of
    `record.decode`), their body CRCs checked in one loop; wherever that stops, `record.decode`
    says why (a blank, the end of the data, or the typed reason a record is invalid)."""
    found = LogScan(end=start)
    offset = start
    while True:
        segment = commit_log.segment_for(offset)
        if segment is None:
            break
        pos = offset - segment.start
        columns = scan(
            segment.mm, pos, segment.size, segment.start, soft_stop=min(pos + SCAN_CHUNK_BYTES, segment.size)
        )
        good = len(columns)
        if good and check_crc:
            good = _crc_prefix(segment.mm, columns)
        if good:
            _take(found, columns, good)
            offset = found.end = int(columns.offsets[good - 1]) + int(columns.sizes[good - 1])
            if good == len(columns):
                continue
        result = record.decode(
            segment.mm,
            offset - segment.start,
            base_offset=segment.start,
            check_crc=check_crc,
            read_body=check_crc,
            read_properties=False,
        )
        if type(result) is record.Record:  # not expected: the scan takes every record decode does
            offset += result.total_size
            found.end = offset
            found.records += 1
            found.last_store_timestamp = result.store_timestamp
            if result.transaction_type in record.QUEUE_ENTRY_KINDS:
                found.queue_ends[(result.topic, result.queue_id)] = result.queue_offset + 1
        elif type(result) is record.EndOfSegment:
            offset = segment.end
            if commit_log.segment_for(offset) is None:
                break
            found.end = offset
        elif type(result) is record.EndOfData:
            break
        else:
            found.invalid = result
            found.valid_after_invalid = _valid_records_after(commit_log, segment, result)
            found.corrupt_in_middle = found.valid_after_invalid > 0
            break
    return found


def _crc_prefix(buf, columns: RecordColumns) -> int:
    """How many of the scanned records, from the first, have bodies matching their BODYCRC
    and, those that carry one, whole records matching their CRC property (`__CRC32#`)."""
    good = _body_crc_prefix(buf, columns)
    if not good:
        return good
    positions, sizes = columns.positions[:good], columns.sizes[:good]
    tails = positions + sizes - record.CRC32_PROPERTY_SIZE
    mark = np.frombuffer(record.CRC32_PROPERTY_MARK[:8], dtype=">i8")[0]
    i8 = field_view(buf, ">i8", 0, len(buf))
    try:
        marked = np.nonzero(field_at(i8, tails, 0) == mark)[0]
    finally:
        del i8
    for i in marked.tolist():
        at = int(positions[i])
        if record.whole_crc_mismatch(buf, at, at + int(sizes[i])):
            return i
    return good


def _body_crc_prefix(buf, columns: RecordColumns) -> int:
    """How many of the scanned records, from the first, have bodies matching their BODYCRC."""
    positions = columns.positions
    body_at = positions + header_sizes(columns.sysflags)
    i4 = field_view(buf, ">i4", 0, len(buf))
    try:
        lengths = field_at(i4, body_at - 4, 0)
        crcs = field_at(i4, positions + 8, 0)
    finally:
        del i4  # release the buffer export: the caller may close the mapping
    if _compiled_crc_prefix is not None:
        return _compiled_crc_prefix(buf, body_at, lengths, crcs, record.crc32)
    with memoryview(buf) as whole:
        for i, (at, length, crc) in enumerate(zip(body_at.tolist(), lengths.tolist(), crcs.tolist())):
            if record.crc32(whole[at : at + length]) & 0x7FFFFFFF != crc:
                return i
    return len(positions)


def _take(found: LogScan, columns: RecordColumns, count: int) -> None:
    """Count the first `count` scanned records: the newest store time, and each queue's end
    (one past the queue offset of its last queue-building record)."""
    found.records += count
    found.last_store_timestamp = int(columns.store_timestamps[count - 1])
    rows = queue_rows(columns, count)
    if not len(rows):
        return
    _, last = np.unique(queue_codes(columns, rows)[::-1], return_index=True)  # each queue's last row
    last_rows = rows[len(rows) - 1 - last]
    names = columns.topic_names
    ends = columns.queue_offsets[last_rows] + 1
    for topic_id, queue_id, end in zip(
        columns.topic_ids[last_rows].tolist(), columns.queue_ids[last_rows].tolist(), ends.tolist()
    ):
        found.queue_ends[(names[topic_id], queue_id)] = end


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
        if seg is None:  # past the log: nothing there
            continue
        result = record.decode(seg.mm, offset - seg.start, base_offset=seg.start, read_properties=False)
        if type(result) is record.Record:
            found += 1
    return found


def queue_units(queues: ConsumeQueueStore) -> int:
    """The units the ConsumeQueues hold, summed over the queues (each queue's next offset): it
    never falls while queue files are kept, so a sum below the checkpoint's says some were lost."""
    return sum(cq.commit_frontier for cq in list(queues.queues.values()))


def checkpointed_start(commit_log: CommitLog, checkpoint: Checkpoint) -> int | None:
    """The offset the checkpoint vouches for, if its record is there and sound: the earlier of
    the newest record the queues held (logicsPhysicalOffset) and the offset known durable and
    dispatched (confirmPhyOffset).  Everything below it was flushed, and dispatched into the
    queues before they were flushed, when the checkpoint was saved; from it on, the log is
    validated.  None when the checkpoint does not know (no checkpoint, or one without
    logicsPhysicalOffset) or the record there is not a valid one (the files changed since); `recover` does not ask when the
    queues hold fewer units than the checkpoint says they did (queue files were lost)."""
    if checkpoint.logics_physical_offset <= 0 or not commit_log.segments:
        return None
    start = min(checkpoint.logics_physical_offset, checkpoint.confirm_phy_offset)
    if start < commit_log.min_offset:
        return None
    found = commit_log.read_record(start, check_crc=True, read_body=True, read_properties=False)
    if type(found) is record.EndOfSegment and commit_log.segment_for(commit_log.next_segment_start(start)):
        found = commit_log.read_record(
            commit_log.next_segment_start(start), check_crc=True, read_body=True, read_properties=False
        )
    return start if type(found) is record.Record else None


def choose_scan_start(commit_log: CommitLog, covered: int, checkpoint: Checkpoint, abnormal: bool) -> int:
    """Where the log must be validated from when the checkpoint vouches for no offset: like
    RocketMQ, the start of the segment two before the one holding the earliest offset an index
    may miss."""
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
            first = commit_log.read_record(
                commit_log.segments[index].start, check_crc=False, read_body=False, read_properties=False
            )
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


class CutBackIndex(Protocol):
    """An index recovery cuts back to the recovered log end and asks where it must be rebuilt
    from (the light queues)."""

    def truncate(self, commit_log_end: int) -> None: ...

    def covered_offset(self) -> int: ...


class Redispatcher(Protocol):
    """What recovery asks of the dispatcher it starts."""

    dispatched_offset: int

    def dispatch_until(self, limit: int, notify: bool = True) -> int: ...

    def close(self) -> None: ...


class DispatcherFactory(Protocol):
    """Starts the store's dispatcher at a commit-log offset; `parallel=False`: one that builds
    every batch on the calling thread (no worker processes)."""

    def __call__(self, offset: int, parallel: bool = True) -> Redispatcher: ...


# A backlog up to this size is redispatched on the opening thread: starting the dispatch worker
# processes costs more than they save on it.  A crash leaves about one checkpoint interval of
# writes to redispatch, whatever the number of queues.
INLINE_REDISPATCH_BYTES = 16 << 20


@dataclass
class Recovered:
    report: RecoveryReport
    queue_offsets: dict[QueueKey, int]  # each queue's next queue offset
    last_written: tuple[int, int] | None  # (end, store timestamp) of the newest record; None: no record


def _frontier(queues: ConsumeQueueStore, key: QueueKey) -> int:
    queue = queues.get(*key)
    return queue.commit_frontier if queue is not None else 0


def _set_aside(commit_log: CommitLog, directory: Path, bad: record.Invalid, report: RecoveryReport) -> bool:
    """Repair: replace the damaged record `bad` by a placeholder of its size, if its size field
    holds (the record after it decodes); keep its bytes under repair/.  False if it cannot."""
    segment = commit_log.segment_for(bad.offset)
    if segment is None:
        return False
    pos = bad.offset - segment.start
    if pos < 0 or bad.size < 91 or pos + bad.size >= segment.size:
        return False
    after = record.decode(segment.mm, pos + bad.size, base_offset=segment.start, check_crc=False, read_body=False)
    if type(after) not in (record.Record, record.EndOfSegment):
        return False
    damaged = bytes(segment.mm[pos : pos + bad.size])
    stand_in = placeholder(damaged, bad.offset)
    if stand_in is None:
        return False
    kept = keep_damaged(directory, bad.offset, damaged)
    segment.mm[pos : pos + bad.size] = stand_in
    segment.mm.flush()
    msg = (
        f"damaged record at commit-log offset {bad.offset} ({bad.reason}): replaced by a placeholder of its "
        f"{bad.size} bytes that readers skip; the records after it are kept (damaged bytes in {kept})"
    )
    log.warning("repair: %s", msg)
    report.messages.append(msg)
    return True


def _index_flushed(checkpoint: Checkpoint, trusted: int | None) -> int:
    """The commit-log offset below which the key index's entries are known on disk (0: not
    known): the checkpoint's index offset, no further than the log was known durable then, if
    the checkpoint is to be trusted at all."""
    if trusted is None or checkpoint.index_physical_offset <= 0:
        return 0
    return min(checkpoint.index_physical_offset, checkpoint.confirm_phy_offset)


def recover(
    directory: Path,
    commit_log: CommitLog,
    queues: ConsumeQueueStore,
    key_index: KeyIndex | None,
    light_queues: CutBackIndex | None,
    checkpoint: Checkpoint,
    abnormal: bool,
    repair: bool,
    start_dispatcher: DispatcherFactory,
) -> Recovered:
    """Open-time recovery of a store (the policy in this module's docstring): validate the log,
    set damaged records aside (`repair`) or refuse to open, cut what follows the last valid
    record, cut the indexes back to it, and have the dispatcher `start_dispatcher(offset)` makes
    re-dispatch what they miss, rebuilding every queue from the whole log if one lost entries.
    The caller keeps the last dispatcher made, running, and each queue's next offset."""
    covered = queues.covered_offset()
    # as RocketMQ 5.5.0's accelerated recovery starts at its dispatch offset, validation starts
    # where the checkpoint vouches for everything before, after a clean stop and a crash alike
    trusted = (
        checkpointed_start(commit_log, checkpoint) if queue_units(queues) >= checkpoint.logics_unit_count else None
    )
    start = trusted if trusted is not None else choose_scan_start(commit_log, covered, checkpoint, abnormal)
    if repair and commit_log.segments:
        start = commit_log.segments[0].start  # a repair validates the whole log
    scan = scan_log(commit_log, start)
    report = RecoveryReport(abnormal=abnormal, scan_from=start, end=scan.end)
    while (
        repair
        and scan.corrupt_in_middle
        and scan.invalid is not None
        and _set_aside(commit_log, directory, scan.invalid, report)
    ):
        scan = scan_log(commit_log, start)
        report.end = scan.end
    if scan.invalid is not None:
        bad = scan.invalid
        if scan.corrupt_in_middle and not repair:
            raise CorruptStoreError(
                f"store {directory}: corrupt record at commit-log offset {bad.offset} ({bad.reason}) "
                f"with {scan.valid_after_invalid} valid record(s) after it; refusing to open. "
                f"Run 'tidemq store repair {directory}' to cut the log there (the cut bytes are kept "
                f"under repair/)",
                bad.offset,
            )
        report.cut_bytes = cut_tail(commit_log, scan.end, directory, keep_copy=scan.corrupt_in_middle)
        what = "corrupt record" if scan.corrupt_in_middle else "torn tail"
        msg = f"{what} at commit-log offset {bad.offset} ({bad.reason}): cut {report.cut_bytes} bytes from there"
        if scan.corrupt_in_middle:
            msg += f", including {scan.valid_after_invalid}+ valid record(s) (copy kept under repair/)"
        log.warning("recovery: %s", msg)
        report.messages.append(msg)
    elif commit_log.segments:
        commit_log.truncate(scan.end)
    commit_log.write_position = scan.end
    commit_log.flushed_position = min(commit_log.flushed_position, start)
    commit_log.flush()
    if not commit_log.segments:
        for cq in list(queues.queues.values()):
            cq.destroy()
        queues.queues.clear()
    queues.truncate(scan.end)
    if light_queues is not None:
        light_queues.truncate(scan.end)
    queues.correct_min_offset(commit_log.min_offset)
    if key_index is not None:
        key_index.recover_from_log(
            commit_log, scan.end, abnormal, checkpoint.index_msg_timestamp, _index_flushed(checkpoint, trusted)
        )

    redispatch_from = queues.covered_offset()
    if abnormal:
        redispatch_from = min(redispatch_from, checkpoint.confirm_phy_offset)
    if key_index is not None:
        redispatch_from = min(redispatch_from, key_index.covered_offset())
    if light_queues is not None:
        redispatch_from = min(redispatch_from, light_queues.covered_offset())
    redispatch_from = min(max(redispatch_from, commit_log.min_offset), scan.end)
    report.redispatched_from = redispatch_from
    # the store's dispatcher (worker processes, or the dispatch thread alone) redispatches
    # what the indexes lack, and goes on from there once the store is open
    known = set(queues.queues)  # every loaded queue has a file
    inline = 0 < scan.end - redispatch_from <= INLINE_REDISPATCH_BYTES
    dispatcher = start_dispatcher(redispatch_from, parallel=not inline)
    dispatcher.dispatch_until(scan.end, notify=False)
    # a queue with no file that the redispatch started past slot 0 lost its files: its
    # earlier entries are in the log below where the redispatch began
    late = (
        []
        if redispatch_from <= commit_log.min_offset
        else [key for key, cq in queues.queues.items() if key not in known and cq.min_offset > 0]
    )
    behind = [key for key, end in scan.queue_ends.items() if _frontier(queues, key) < end]
    if late or queues.has_holes() or behind:
        msg = "consume queues have missing entries (deleted or damaged files); rebuilding them from the whole log"
        log.warning("recovery: %s", msg)
        report.messages.append(msg)
        # the workers map the files of the queues started late: they stop before those go
        dispatcher.close()
        for key in late:
            queues.queues.pop(key).destroy()
        dispatcher = start_dispatcher(commit_log.min_offset)
        dispatcher.dispatch_until(scan.end, notify=False)
    elif inline:  # the store's own dispatcher goes on from there, with its workers
        dispatched = dispatcher.dispatched_offset
        dispatcher.close()
        dispatcher = start_dispatcher(dispatched)
    queue_offsets = {key: cq.commit_frontier for key, cq in queues.queues.items()}
    last_written = (scan.end, scan.last_store_timestamp) if scan.records else None
    return Recovered(report, queue_offsets, last_written)
