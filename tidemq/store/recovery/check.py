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
from ..format.special_queues import LMQ_PREFIX, LMQ_QUEUE_ID, PROPERTY_DELAY, lmq_units, queue_tags_code
from ..light.queues import KV_DIRECTORY
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
    # what `store repair` writes into the light queues: (form "file" or "kv", name, slot, the
    # unit (commit-log offset, size, tags code, store time) the log lists there, or None: delete
    # the unit there)
    light_fixes: list[tuple[str, str, int, tuple[int, int, int, int] | None]] = field(default_factory=list)

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


class _Records:
    """The log's segments mapped read-only, for looking up the record a unit points at."""

    def __init__(self, paths: list[Path]) -> None:
        self.maps = {int(p.name): _map(p) for p in paths}
        self.segment_size = (paths[0].stat().st_size if paths else 0) or 1
        self.first = int(paths[0].name) if paths else 0

    def unit_problem(self, where: str, topic: str, queue_id: int, slot: int, offset: int, size: int, tags: int):
        """(a problem with the unit at `slot` of `topic`/`queue_id`, or None; the record)."""
        base = offset - offset % self.segment_size
        mm = self.maps.get(base)
        if mm is None:
            return f"{where}: commit-log offset {offset} is in no segment", None
        rec = record.decode(mm, offset - base, base_offset=base, check_crc=False, read_body=False)
        if type(rec) is not record.Record:
            return f"{where}: no valid record at commit-log offset {offset}", None
        expected = expected_unit(rec, topic, queue_id)
        if rec.total_size != size or expected is None or expected[0] != slot:
            return (
                f"{where}: unit (size {size}) does not match the record at {offset} "
                f"({rec.topic}/{rec.queue_id} offset {rec.queue_offset}, size {rec.total_size})"
            ), rec
        if expected[1] != tags:
            return f"{where}: tags code {tags} differs from the record's", rec
        return None, rec

    def light_unit(self, offset: int) -> tuple[int, int, int, int] | None:
        """The light-queue unit (commit-log offset, size, tags code, store time) of the record at
        `offset`, or None if no valid record is there."""
        base = offset - offset % self.segment_size
        mm = self.maps.get(base)
        rec = record.decode(mm, offset - base, base_offset=base, check_crc=False, read_body=False) if mm else None
        if type(rec) is not record.Record:
            return None
        return offset, rec.total_size, record.tags_code(rec.tags), rec.store_timestamp

    def close(self) -> None:
        for mm in self.maps.values():
            if mm is not None:
                mm.close()


def check(store_dir: Path) -> CheckReport:
    """Every record's layout and CRCs (body, and whole record where it carries one); every
    ConsumeQueue unit against its record; the light queues (`check_light_queues`).  A damaged
    record whose size field holds is reported once and the walk goes on after it."""
    report = CheckReport()
    paths = segment_paths(store_dir)
    ended = False
    listed: dict[str, list[tuple[int, int]]] = {}  # light queue -> (offset, record) the log lists
    for path in paths:
        result = None
        stranded: list[int] = []  # records after the end of the log: one problem for them all
        for result in iter_segment(path, past_damaged=True):
            if type(result) is record.Record:
                if ended:
                    stranded.append(result.commit_log_offset)
                report.records += 1
                _list_light_units(result, listed)
            elif type(result) is record.Invalid:  # reported once; the walk goes on past it if it can
                report.problems.append(f"invalid record at commit-log offset {result.offset}: {result.reason}")
            elif type(result) is record.EndOfData:
                ended = True
        if type(result) is record.Invalid:  # the walk could not go past it: the log ends there
            ended = True
        if stranded:
            report.problems.append(f"{len(stranded)} record(s) from offset {stranded[0]} follow the end of the log")
    records = _Records(paths)
    try:
        for topic, queue_id, queue_dir in queue_dirs(store_dir):
            if queue_id == LMQ_QUEUE_ID and topic.startswith(LMQ_PREFIX):
                continue  # check_light_queues
            for start, units in iter_queue_units(queue_dir):
                for i, (offset, size, tags) in enumerate(units.tolist()):
                    if size == BLANK_UNIT_SIZE:
                        continue
                    report.units += 1
                    where = f"consume queue {topic}/{queue_id} offset {start + i}"
                    problem, _ = records.unit_problem(where, topic, queue_id, start + i, offset, size, tags)
                    if problem is not None:
                        report.problems.append(problem)
        check_light_queues(store_dir, listed, records, report)
    finally:
        records.close()
    return report


# ---------------------------------------------------------------------------------------------
# Light queues (multi-dispatch, `tidemq.store.light`), in RocketMQ's file queues or the key-value
# tables: every unit points at a record that lists that light queue at that offset, and every
# offset a record lists has its unit.  Each unit wrong or missing is reported once (missing ones
# as runs of offsets).  Not reported: units of records the log no longer holds (older segments
# deleted: readers skip them); records past the tables' dispatched mark (the store's next open
# dispatches them); a light queue the tables do not hold at all, or the records of an earlier
# life of a name (its offsets start again at 0): idle light queues expire from the tables.


def _list_light_units(rec: record.Record, listed: dict[str, list[tuple[int, int]]]) -> None:
    if rec.sysflag & record.TRANSACTION_TYPE_MASK not in record.QUEUE_ENTRY_KINDS:
        return  # a prepared (or rolled back) message is dispatched by its commit record
    for name, queue_id, offset in lmq_units(rec.topic, rec.queue_id, rec.properties.get):
        if queue_id != LMQ_QUEUE_ID or not name.startswith(LMQ_PREFIX):
            continue
        found = listed.setdefault(name, [])
        if not found or found[-1] != (offset, rec.commit_log_offset):  # a name given twice: one unit
            found.append((offset, rec.commit_log_offset))


def _latest_life(listed: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (offset, record) a light queue's current life lists: offsets rise from record to
    record until the name is used again after its queue expired."""
    start = 0
    for i in range(1, len(listed)):
        if listed[i][0] <= listed[i - 1][0]:
            start = i
    return listed[start:]


def _missing(name: str, listed: list[tuple[int, int]], present: set[int]) -> list[str]:
    """One problem per run of consecutive offsets that records list and the queue lacks."""
    gaps = sorted((offset, where) for offset, where in listed if offset not in present)
    problems = []
    i = 0
    while i < len(gaps):
        j = i
        while j + 1 < len(gaps) and gaps[j + 1][0] == gaps[j][0] + 1:
            j += 1
        first, last = gaps[i][0], gaps[j][0]
        span = f"offset {first}" if first == last else f"offsets {first}..{last}"
        problems.append(
            f"light queue {name}: {j - i + 1} unit(s) missing at {span} "
            f"(listed by the record at commit-log offset {gaps[i][1]}{' and after' if j > i else ''})"
        )
        i = j + 1
    return problems


def _file_light_units(queue_dir: Path) -> Iterator[tuple[int, int, int, int]]:
    """(slot, commit-log offset, size, tags code) of each written unit of a light file queue,
    past holes (a zeroed unit is a missing one) and the blank units below its first entry."""
    for path in sorted(p for p in queue_dir.iterdir() if p.name.isdigit()):
        data = path.read_bytes()
        units = np.frombuffer(data[: len(data) - len(data) % UNIT_SIZE], dtype=UNIT_DTYPE)
        first = int(path.name) // UNIT_SIZE
        written = np.nonzero((units["offset"] >= 0) & (units["size"] > 0) & (units["size"] != BLANK_UNIT_SIZE))[0]
        for i in written.tolist():
            offset, size, tags = units[i].tolist()
            yield first + i, offset, size, tags


def check_light_queues(
    store_dir: Path, listed: dict[str, list[tuple[int, int]]], records: _Records, report: CheckReport
) -> None:
    """The light queues against `listed` (name -> (offset, commit-log offset) of each unit the
    log's records list, in log order); see the section comment above."""
    from ..light.kv import offline_tables

    in_files = {}
    for topic, queue_id, queue_dir in queue_dirs(store_dir):
        if queue_id == LMQ_QUEUE_ID and topic.startswith(LMQ_PREFIX):
            in_files[topic] = queue_dir

    def verify(name: str, slot: int, offset: int, size: int, tags: int, store_time: int | None) -> bool:
        report.units += 1
        if offset < records.first:
            return True  # its record is deleted with its segment
        where = f"light queue {name} offset {slot}"
        problem, rec = records.unit_problem(where, name, LMQ_QUEUE_ID, slot, offset, size, tags)
        if problem is None and rec is not None and store_time is not None and store_time != rec.store_timestamp:
            problem = f"{where}: store time {store_time} differs from the record's"
        if problem is not None:
            report.problems.append(problem)
        return problem is None

    def fix(form: str, name: str, life: list[tuple[int, int]], wrong: list[int], present: set[int]) -> None:
        wanted = dict(life)
        for slot in wrong:
            unit = records.light_unit(wanted[slot]) if slot in wanted else None
            if unit is not None or form == "kv":  # a file queue keeps a slot no record lists
                report.light_fixes.append((form, name, slot, unit))
        for slot, offset in life:
            unit = records.light_unit(offset) if slot not in present else None
            if unit is not None:
                report.light_fixes.append((form, name, slot, unit))

    for name, queue_dir in in_files.items():
        present, wrong = set(), []
        for slot, offset, size, tags in _file_light_units(queue_dir):
            present.add(slot)
            if not verify(name, slot, offset, size, tags, None):
                wrong.append(slot)
        life = [unit for unit in _latest_life(listed.get(name, [])) if unit[1] >= records.first]
        gaps = _missing(name, life, present)
        report.problems += gaps
        if gaps or wrong:
            fix("file", name, life, wrong, present)
    with offline_tables(Path(store_dir) / KV_DIRECTORY) as tables:
        held = set()
        if tables is not None:
            for state in tables.queues():
                if state.name in in_files:
                    continue  # the store reads the file queue
                held.add(state.name)
                life = [
                    unit
                    for unit in _latest_life(listed.get(state.name, []))
                    if records.first <= unit[1] < tables.dispatched
                ]
                present, wrong = set(), []
                for slot, offset, size, tags, store_time in tables.units(state.number):
                    present.add(slot)
                    sound = verify(state.name, slot, offset, size, tags, store_time)
                    if sound and not state.min_offset <= slot < state.max_offset:
                        sound = False
                        report.problems.append(
                            f"light queue {state.name} offset {slot}: a unit outside the queue's "
                            f"offsets [{state.min_offset}, {state.max_offset})"
                        )
                    if not sound:
                        wrong.append(slot)
                gaps = _missing(state.name, life, present)
                report.problems += gaps
                if gaps or wrong:
                    fix("kv", state.name, life, wrong, present)
        for name, units in listed.items():
            if name in in_files or name in held or tables is not None:
                continue
            report.problems += _missing(name, [u for u in _latest_life(units) if u[1] >= records.first], set())
