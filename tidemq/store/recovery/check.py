"""Read-only inspection and checking of a store directory (the `tidemq store` commands).

Nothing here writes: files are mapped read-only, so `inspect` and `check` are safe on a store a
broker has open.  Both decode with the shared record codec.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..format import record
from ..format.special_queues import PROPERTY_DELAY, lmq_units, queue_tags_code
from ..log.commit_log import segment_paths
from ..queues.consume_queue import BLANK_UNIT_SIZE, UNIT_DTYPE, UNIT_SIZE


@dataclass
class SegmentInfo:
    name: str
    start: int
    size: int
    used: int  # bytes up to the end of the last record or blank
    records: int


@dataclass
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    max_physical_offset: int


@dataclass
class CheckReport:
    records: int = 0
    units: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        return not self.problems


def _map(path: Path) -> mmap.mmap | None:
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return None
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def iter_segment(path: Path, check_crc: bool = True, past_damaged: bool = False) -> Iterator[record.DecodeResult]:
    """Every decode result of one segment, ending with its EndOfSegment, EndOfData or Invalid;
    `past_damaged`: an Invalid whose size field holds (the record after it decodes) is yielded
    and the walk goes on after it."""
    start = int(path.name)
    mm = _map(path)
    if mm is None:
        yield record.EndOfData(start)
        return
    with mm:
        pos = 0
        while True:
            result = record.decode(mm, pos, base_offset=start, check_crc=check_crc, read_body=False)
            yield result
            if type(result) is record.Invalid and past_damaged and result.size >= 91 and pos + result.size < len(mm):
                after = record.decode(mm, pos + result.size, base_offset=start, check_crc=False, read_body=False)
                if type(after) in (record.Record, record.EndOfSegment):
                    pos += result.size
                    continue
            if type(result) is not record.Record:
                return
            pos += result.total_size


def queue_dirs(store_dir: Path) -> Iterator[tuple[str, int, Path]]:
    root = Path(store_dir) / "consumequeue"
    if not root.is_dir():
        return
    for topic_dir in sorted(root.iterdir()):
        for queue_dir in sorted(topic_dir.iterdir()) if topic_dir.is_dir() else ():
            if queue_dir.is_dir() and queue_dir.name.lstrip("-").isdigit():
                yield topic_dir.name, int(queue_dir.name), queue_dir


def iter_queue_units(queue_dir: Path) -> Iterator[tuple[int, np.ndarray]]:
    """(first queue offset, written units) for each file of a queue, stopping at the first hole."""
    for path in sorted(p for p in queue_dir.iterdir() if p.name.isdigit()):
        data = path.read_bytes()
        units = np.frombuffer(data[: len(data) - len(data) % UNIT_SIZE], dtype=UNIT_DTYPE)
        bad = (units["offset"] < 0) | (units["size"] <= 0)
        count = int(np.argmax(bad)) if bad.any() else len(units)
        yield int(path.name) // UNIT_SIZE, units[:count]
        if count < len(units):
            return


def inspect(store_dir: Path) -> tuple[list[SegmentInfo], list[QueueInfo], int]:
    """Segments, queues and the log end (offset past the last valid record)."""
    segments: list[SegmentInfo] = []
    log_end = 0
    for path in segment_paths(store_dir):
        start = int(path.name)
        count = 0
        used = 0
        for result in iter_segment(path, check_crc=False):
            if type(result) is record.Record:
                count += 1
                used = result.commit_log_offset + result.total_size - start
            elif type(result) is record.EndOfSegment:
                used = result.offset + result.size - start
        if count:
            log_end = start + used
        segments.append(SegmentInfo(path.name, start, path.stat().st_size, used, count))
    queues: list[QueueInfo] = []
    for topic, queue_id, queue_dir in queue_dirs(store_dir):
        first = None
        last = 0
        max_phy = 0
        for start, units in iter_queue_units(queue_dir):
            if first is None:
                real = np.nonzero(units["size"] != BLANK_UNIT_SIZE)[0]
                first = start + (int(real[0]) if len(real) else len(units))
            last = start + len(units)
            if len(units) and units["size"][-1] != BLANK_UNIT_SIZE:
                max_phy = int(units["offset"][-1]) + int(units["size"][-1])
        if first is not None:
            queues.append(QueueInfo(topic, queue_id, first, last, max_phy))
    return segments, queues, log_end


def expected_unit(rec: record.Record, topic: str, queue_id: int) -> tuple[int, int] | None:
    """(queue offset, tags code) of the unit `rec` has in queue `topic`/`queue_id`: its own, or
    a light queue's it is multi-dispatched to (special_queues); None if it has none there."""
    code = record.tags_code(rec.tags)
    if (rec.topic, rec.queue_id) == (topic, queue_id):
        return rec.queue_offset, queue_tags_code(
            rec.topic, rec.properties.get(PROPERTY_DELAY), rec.store_timestamp, code
        )
    for lmq_topic, lmq_queue_id, lmq_offset in lmq_units(rec.topic, rec.queue_id, rec.properties.get):
        if (lmq_topic, lmq_queue_id) == (topic, queue_id):
            return lmq_offset, code
    return None


def check(store_dir: Path) -> CheckReport:
    """Every record's layout and CRCs (body, and whole record where it carries one); every
    ConsumeQueue unit against its record.  A damaged record whose size field holds is reported
    once and the walk goes on after it."""
    report = CheckReport()
    paths = segment_paths(store_dir)
    ended = False
    for path in paths:
        result = None
        stranded: list[int] = []  # records after the end of the log: one problem for them all
        for result in iter_segment(path, past_damaged=True):
            if type(result) is record.Record:
                if ended:
                    stranded.append(result.commit_log_offset)
                report.records += 1
            elif type(result) is record.Invalid:  # reported once; the walk goes on past it if it can
                report.problems.append(f"invalid record at commit-log offset {result.offset}: {result.reason}")
            elif type(result) is record.EndOfData:
                ended = True
        if type(result) is record.Invalid:  # the walk could not go past it: the log ends there
            ended = True
        if stranded:
            report.problems.append(f"{len(stranded)} record(s) from offset {stranded[0]} follow the end of the log")
    maps = {int(p.name): _map(p) for p in paths}
    segment_size = (paths[0].stat().st_size if paths else 0) or 1
    try:
        for topic, queue_id, queue_dir in queue_dirs(store_dir):
            for start, units in iter_queue_units(queue_dir):
                for i, (offset, size, tags) in enumerate(units.tolist()):
                    if size == BLANK_UNIT_SIZE:
                        continue
                    report.units += 1
                    where = f"consume queue {topic}/{queue_id} offset {start + i}"
                    base = offset - offset % segment_size
                    mm = maps.get(base)
                    if mm is None:
                        report.problems.append(f"{where}: commit-log offset {offset} is in no segment")
                        continue
                    rec = record.decode(mm, offset - base, base_offset=base, check_crc=False, read_body=False)
                    if type(rec) is not record.Record:
                        report.problems.append(f"{where}: no valid record at commit-log offset {offset}")
                        continue
                    expected = expected_unit(rec, topic, queue_id)
                    if rec.total_size != size or expected is None or expected[0] != start + i:
                        report.problems.append(
                            f"{where}: unit (size {size}) does not match the record at {offset} "
                            f"({rec.topic}/{rec.queue_id} offset {rec.queue_offset}, size {rec.total_size})"
                        )
                    elif expected[1] != tags:
                        report.problems.append(f"{where}: tags code {tags} differs from the record's")
    finally:
        for mm in maps.values():
            if mm is not None:
                mm.close()
    return report
