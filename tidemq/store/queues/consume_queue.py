"""ConsumeQueue: the per-(topic, queue id) index of a queue's messages in the CommitLog.

Byte layout (big-endian), RocketMQ-compatible:

    unit = commit-log offset i64 + size i32 + tags code i64 = 8 + 4 + 8 = 20 bytes
    file = 300,000 units = 6,000,000 bytes (configurable), named by its 20-digit byte offset
    path = {store}/consumequeue/{topic}/{queue id}/{byte offset}

The logical (queue) offset of a unit is its byte position / 20.  A slot below the queue's first
real entry is padded with the blank unit (0, Integer.MAX_VALUE, 0).  An all-zero unit was never
written.

Entries may be written out of order (parallel dispatch); readers only see slots below the
**commit frontier**, the first slot not yet written.  Ownership: one dispatcher writes a queue at a
time; `ConsumeQueue._lock` (one of a shared few) guards the file list and the frontier for readers on
other threads.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..blocks import back_with_blocks
from . import open_files

log = logging.getLogger(__name__)

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size  # 8 + 4 + 8 = 20
DEFAULT_UNITS_PER_FILE = 300_000
BLANK_UNIT_SIZE = 0x7FFFFFFF  # Integer.MAX_VALUE: a padding unit
BLANK_UNIT = UNIT.pack(0, BLANK_UNIT_SIZE, 0)
UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE


_MADV_RANDOM = getattr(mmap, "MADV_RANDOM", None)


def file_name(byte_offset: int) -> str:
    return f"{byte_offset:020d}"


def map_queue_file(path: str, size: int, create: bool = True, random_access: bool = False) -> mmap.mmap:
    """Map the queue file at `path`, opened (made, with its directory, when `create`) and
    extended to `size` bytes if shorter: idempotent, so a store and its dispatch workers may make
    the same file at once.  Mapped MADV_RANDOM when `random_access`, and always when just
    extended: a write fault on a new (sparse) file otherwise reads ahead the file's holes into
    the page cache as zero pages (the whole of the file, for its first unit written)."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if not create:
            raise
        _make_directory(os.path.dirname(path))
        fd = os.open(path, flags, 0o644)
    try:
        extended = os.fstat(fd).st_size < size
        if extended:
            os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    if (random_access or extended) and _MADV_RANDOM is not None:
        mm.madvise(_MADV_RANDOM)
    return mm


def _make_directory(directory: str) -> None:
    """A queue's directory (another process may be making it too)."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        pass
    except FileNotFoundError:  # the topic's too
        os.makedirs(directory, exist_ok=True)


@dataclass(slots=True, frozen=True)
class Unit:
    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int


class _QueueFile:
    """One file of a queue, mapped when opened, or (`lazy`: a file parallel-dispatch workers
    made) on first use of `mm`.  Its path is made from its queue's when asked for: parallel
    dispatch adopts thousands of new queues in one batch, and a light-queue broker holds
    millions, so a queue keeps no string of its own."""

    __slots__ = ("queue", "start", "_mm")

    def __init__(self, queue: ConsumeQueue, start: int, create: bool, lazy: bool = False) -> None:
        self.queue = queue
        self.start = start  # first logical offset in the file
        self._mm: mmap.mmap | None = None
        if not lazy:
            self._map(create)

    @property
    def path(self) -> str:
        return f"{self.queue._directory}/{file_name(self.start * UNIT_SIZE)}"

    @property
    def size(self) -> int:
        return self.queue.file_size

    def _map(self, create: bool, random_access: bool = False) -> mmap.mmap:
        """Map the file (see `map_queue_file`) and count the mapping against the budget."""
        mm = self._mm = map_queue_file(self.path, self.size, create, random_access)
        MAPPINGS.added(self)
        return mm

    @property
    def mm(self) -> mmap.mmap:
        mm = self._mm
        if mm is None:
            with _LAZY_MAPPING:  # readers on several threads: one mapping
                mm = self._mm
                if mm is None:
                    # as the workers open it (idempotent), or make it; or again, after MAPPINGS
                    # dropped the mapping to stay within the open-file budget.  Random access:
                    # a file dispatch made is holes past what it wrote, and the dispatch
                    # thread's first write to a page not in the page cache would otherwise read
                    # the holes ahead (read_ahead_kb was 8 MiB here: the rest of each file, 0.9
                    # ms of kernel time a queue)
                    mm = self._map(create=True, random_access=True)
        return mm

    def flush(self) -> None:
        if self._mm is not None:
            self._mm.flush()
        else:  # never mapped here: what the workers wrote is in the page cache, and synced by the file
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return  # not made yet: nothing written
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        MAPPINGS.removed(self)
        if self._mm is None:
            return
        try:
            self._mm.close()
        except BufferError:  # a reader still holds a view; the mapping goes with it
            pass

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


_LAZY_MAPPING = threading.Lock()


class _Mappings:
    """The queue files this process has mapped, oldest first.  Each mapping holds an open file
    (see `open_files`); past `budget` the oldest is dropped: its `_QueueFile` forgets it, the
    mapping closes once no reader holds it any more (no one is cut off mid-read or mid-write),
    and the file is mapped again on next use.  Written pages stay in the page cache, and a
    file's `flush` without a mapping syncs them through the file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapped: dict[_QueueFile, None] = {}
        self.budget = 0  # set from the open-file limit at the first mapping (tests set it)
        # how many mappings were dropped (past the budget) or closed so far: a cache of them
        # elsewhere (batch_builder.ThreadBuilder) lets its copies go when this moves
        self.dropped = 0

    def added(self, queue_file: _QueueFile) -> None:
        with self._lock:
            if not self.budget:
                self.budget = open_files.mapping_budget(open_files.CONSUME_QUEUE_SHARE)
            mapped = self._mapped
            mapped[queue_file] = None
            while len(mapped) > self.budget:
                oldest = next(iter(mapped))
                del mapped[oldest]
                oldest._mm = None
                self.dropped += 1

    def removed(self, queue_file: _QueueFile) -> None:
        with self._lock:
            if queue_file in self._mapped:
                del self._mapped[queue_file]
                self.dropped += 1

    @property
    def full(self) -> bool:
        """At the budget: the next mapping drops the oldest."""
        return bool(self.budget) and len(self._mapped) >= self.budget

    def __len__(self) -> int:
        return len(self._mapped)


MAPPINGS = _Mappings()


class FrontierTable:
    """The commit frontiers of many ConsumeQueues in NumPy arrays, one row per queue, so that
    parallel dispatch advances the frontiers of a whole batch's queues with one assignment.
    Beside each frontier: the first slot past the queue's mapped files (-1 without files) and
    whether slots above the frontier may be pending.  One writer (the dispatching thread); a
    reader sees each value whole."""

    def __init__(self, capacity: int = 16) -> None:
        self.frontiers = np.zeros(capacity, dtype=np.int64)
        self.files_end = np.full(capacity, -1, dtype=np.int64)
        self.pending = np.zeros(capacity, dtype=bool)
        self.size = 0

    def allocate(self, count: int = 1) -> int:
        """Take `count` new rows (frontier 0, no files, nothing pending); the number of the first,
        the others following it."""
        if self.size + count > len(self.frontiers):
            grow = max(len(self.frontiers), self.size + count - len(self.frontiers))
            self.frontiers = np.concatenate([self.frontiers, np.zeros(grow, np.int64)])
            self.files_end = np.concatenate([self.files_end, np.full(grow, -1, np.int64)])
            self.pending = np.concatenate([self.pending, np.zeros(grow, bool)])
        self.size += count
        return self.size - count


_NOTHING_PENDING: frozenset[int] = frozenset()  # every queue's `_pending` until a slot is pending
# the queues' locks (`ConsumeQueue._lock`), a queue taking the one its key hashes to (a lock of
# its own would make every queue bigger; bench/commit.py prints the bytes a queue takes).  No
# code holds a queue's lock while it takes another's, so queues sharing one lock only wait for
# each other, for as long as one read or one commit holds it
_QUEUE_LOCKS = tuple(threading.Lock() for _ in range(256))


class ConsumeQueue:
    """One queue's 20-byte-unit files.  Not safe for two writers; readers may be on any thread.
    Its commit frontier lives in a `FrontierTable` row (the store's, or its own).  Slotted, its
    directory and its files' paths made when asked for, and its set of pending slots shared (empty)
    until it has one: a broker may hold millions of light queues (`adopted_many`)."""

    __slots__ = (
        "topic",
        "queue_id",
        "root",
        "units_per_file",
        "_files",
        "_lock",
        "table",
        "row",
        "min_offset",
        "_pending",
        "max_physical_offset",
    )

    def __init__(
        self,
        root: Path | str,
        topic: str,
        queue_id: int,
        units_per_file: int = DEFAULT_UNITS_PER_FILE,
        load: bool = True,
        table: FrontierTable | None = None,
        row: int | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.root = str(root)  # the store's directory (`ConsumeQueueStore.root_name`, one string for all)
        self.units_per_file = units_per_file
        self._files: list[_QueueFile] = []
        self._lock = _QUEUE_LOCKS[hash((topic, queue_id)) % len(_QUEUE_LOCKS)]
        self.table = table if table is not None else FrontierTable(1)
        # its row in the table: a new one (frontier 0), or one `adopted_many` took and set
        self.row = self.table.allocate() if row is None else row
        self.min_offset = 0
        # the commit frontier (exclusive: slots below it are all written) is table.frontiers[row]
        self._pending: set[int] | frozenset[int] = (
            _NOTHING_PENDING  # written slots above the frontier (`_pending_slots`)
        )
        self.max_physical_offset = 0  # end of the furthest commit-log record indexed
        if load:  # load=False: parallel dispatch adopts files its workers are writing (adopt_files)
            self._load()

    @property
    def file_size(self) -> int:
        return self.units_per_file * UNIT_SIZE

    @property
    def _directory(self) -> str:
        return f"{self.root}/{self.topic}/{self.queue_id}"

    @property
    def directory(self) -> Path:
        return Path(self._directory)

    @property
    def commit_frontier(self) -> int:
        return int(self.table.frontiers[self.row])

    @commit_frontier.setter
    def commit_frontier(self, value: int) -> None:
        self.table.frontiers[self.row] = value

    def _files_changed(self) -> None:
        files = self._files
        self.table.files_end[self.row] = files[-1].start + self.units_per_file if files else -1

    def _pending_changed(self) -> None:
        self.table.pending[self.row] = bool(self._pending)

    def _pending_slots(self) -> set[int]:
        """The set of pending slots, to add to (`_lock` held): its own from the first."""
        pending = self._pending
        if not isinstance(pending, set):  # _NOTHING_PENDING
            pending = self._pending = set()
        return pending

    # -- loading and recovery -------------------------------------------------------------

    def _load(self) -> None:
        if not self.directory.is_dir():
            return
        names = sorted(p for p in self.directory.iterdir() if p.name.isdigit() and len(p.name) == 20)
        sizes = [p.stat().st_size for p in names]
        if sizes and max(sizes) >= UNIT_SIZE:
            # existing files keep the size they were written with
            self.units_per_file = max(sizes) // UNIT_SIZE
        for path in names:
            byte_offset = int(path.name)
            if byte_offset % self.file_size:
                log.warning(
                    "consume queue file %s is not aligned to the %d-byte file size; ignored", path, self.file_size
                )
                continue
            self._files.append(_QueueFile(self, byte_offset // UNIT_SIZE, create=False))
        if not self._files:
            return
        self.min_offset = self._files[0].start
        frontier = self._files[0].start
        for qf in self._files:
            if qf.start != frontier:
                break  # a missing file: what follows is unreachable until rebuilt
            units = np.frombuffer(qf.mm, dtype=UNIT_DTYPE)
            bad = (units["offset"] < 0) | (units["size"] <= 0)
            count = int(np.argmax(bad)) if bad.any() else len(units)
            frontier = qf.start + count
            if count:
                real = units[:count][units["size"][:count] != BLANK_UNIT_SIZE]
                if len(real):
                    last = real[-1]
                    self.max_physical_offset = int(last["offset"]) + int(last["size"])
            if count < len(units):
                # units after the hole were written out of order (parallel dispatch) and never
                # committed: zero them, so that a later load cannot take them for entries
                # (only those: the pages of the holes between them stay unwritten, without blocks)
                tail = units[count:]
                for i in np.flatnonzero(
                    (tail["offset"] != 0) | (tail["size"] != 0) | (tail["tags_code"] != 0)
                ).tolist():
                    at = (count + i) * UNIT_SIZE
                    qf.mm[at : at + UNIT_SIZE] = bytes(UNIT_SIZE)
                break
        # files after a hole hold nothing reachable; drop them
        for qf in [f for f in self._files if f.start > frontier]:
            self._drop_file(qf)
        self._files_changed()
        self.commit_frontier = frontier
        self._skip_leading_blanks()

    def _skip_leading_blanks(self) -> None:
        while self.min_offset < self.commit_frontier:
            unit = self._unit_at(self.min_offset)
            if unit[1] != BLANK_UNIT_SIZE:
                break
            self.min_offset += 1

    def _drop_file(self, qf: _QueueFile) -> None:
        self._files.remove(qf)
        self._files_changed()
        qf.close()
        qf.unlink()

    # -- writing ----------------------------------------------------------------------------

    def _file_for(self, queue_offset: int, create: bool, lazy: bool = False) -> _QueueFile | None:
        files = self._files
        if files:
            index = (queue_offset - files[0].start) // self.units_per_file
            if 0 <= index < len(files):
                return files[index]
            if queue_offset < files[0].start:
                return None
        if not create:
            return None
        if not files:
            raise ValueError(
                f"{self.topic}/{self.queue_id} has no file yet: slot {queue_offset} needs initialize_at() first"
            )
        while files[-1].start + self.units_per_file <= queue_offset:
            self._add_file(files[-1].start + self.units_per_file, lazy)
        return files[-1]

    def mapping_of(self, file_start: int) -> mmap.mmap | None:
        """The mapping of this queue's file starting at slot `file_start` (mapped now if it is
        not), or None if the queue has no such file yet."""
        with self._lock:  # retention drops the oldest files on another thread
            queue_file = self._file_for(file_start, create=False)
        return queue_file.mm if queue_file is not None else None

    def _add_file(self, start: int, lazy: bool = False) -> _QueueFile:
        # map_queue_file makes the queue's directory when the file's open finds it missing
        qf = _QueueFile(self, start, create=True, lazy=lazy)
        with self._lock:
            self._files.append(qf)
            self._files_changed()
        return qf

    @property
    def is_empty(self) -> bool:
        """No file at all: the queue has never been written (or was destroyed)."""
        return not self._files

    def initialize_at(self, first_offset: int) -> None:
        """Start an empty queue at `first_offset`: its file begins at the aligned slot below and
        the slots before `first_offset` get the blank unit, as RocketMQ pads a late first file."""
        if self._files:
            raise ValueError(f"{self.topic}/{self.queue_id} already has files")
        self._add_file(first_offset - first_offset % self.units_per_file)
        self._start_at(first_offset)

    def _start_at(self, first_offset: int) -> None:
        """Pad the slots below `first_offset` in the first file with the blank unit (as RocketMQ
        pads a late first file) and make it the queue's minimum and commit frontier."""
        count = first_offset % self.units_per_file
        if count:
            back_with_blocks(self._files[0].mm, 0, count * UNIT_SIZE)  # raises on a full disk, having written nothing
            self._files[0].mm[0 : count * UNIT_SIZE] = BLANK_UNIT * count
        with self._lock:
            self.min_offset = first_offset
            self.commit_frontier = first_offset
            self._pending = _NOTHING_PENDING
            self._pending_changed()
            self._files_changed()

    def write(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        """Write one unit at its slot; False if the slot is already below the frontier."""
        if queue_offset < self.commit_frontier:
            return False
        if not self._files:
            self.initialize_at(0)
        qf = self._file_for(queue_offset, create=True)
        if qf is None:
            raise ValueError(f"queue offset {queue_offset} of {self.topic}/{self.queue_id} is below its first file")
        at = (queue_offset - qf.start) * UNIT_SIZE
        back_with_blocks(qf.mm, at, UNIT_SIZE)  # raises on a full disk, having written nothing
        UNIT.pack_into(qf.mm, at, commit_log_offset, size, tags_code)
        end = commit_log_offset + size
        if end > self.max_physical_offset:
            self.max_physical_offset = end
        return True

    def commit(self, queue_offset: int) -> bool:
        """Mark a written slot as complete; True if the frontier moved."""
        with self._lock:
            if queue_offset != self.commit_frontier:
                if queue_offset > self.commit_frontier:
                    self._pending_slots().add(queue_offset)
                    self.table.pending[self.row] = True
                return False
            self._advance_to(queue_offset + 1)
            return True

    def _advance_to(self, frontier: int) -> None:
        """Set the frontier to `frontier`, then past every pending slot contiguous with it
        (`_lock` held)."""
        pending = self._pending
        if isinstance(pending, set):  # not _NOTHING_PENDING, which holds no slot
            while frontier in pending:
                pending.remove(frontier)
                frontier += 1
        self.commit_frontier = frontier
        if not pending:
            self.table.pending[self.row] = False

    def commit_range(self, first: int, end: int) -> bool:
        """Mark the written slots [first, end) as complete (parallel dispatch: a batch's slots of
        this queue); True if the frontier moved.  The files they are in must exist."""
        if end <= first:
            return False
        files = self._files
        if not (files and files[0].start <= first and end <= files[-1].start + self.units_per_file):
            # files a worker process made, mapped when first read, not on the dispatch thread
            # as each is reached
            self._file_for(end - 1, create=True, lazy=True)
        with self._lock:
            frontier = self.commit_frontier
            if first > frontier:
                self._pending_slots().update(range(first, end))
                self.table.pending[self.row] = True
                return False
            if end <= frontier:
                return False
            self._advance_to(end)
            return True

    def adopt_files(self, first_offset: int) -> None:
        """Start a new queue at `first_offset` whose files parallel-dispatch workers have been
        writing (built with load=False): take the one holding `first_offset` as it is, trusting
        none of its units, mapped when first used (or at once, to pad the slots below
        `first_offset` in it with the blank unit), and made then if no worker has.  Later files
        are mapped when `commit_range` reaches them."""
        if self._files:
            raise ValueError(f"{self.topic}/{self.queue_id} already has files")
        start = first_offset - first_offset % self.units_per_file
        if start == first_offset:
            # mapped when first used (made then if no worker has): the coordinator commits a
            # burst of new queues without opening and mapping each file on its thread
            with self._lock:
                self._files.append(self._lazy_file(start))
        else:
            self._add_file(start)  # mapped now: the slots below `first_offset` get the blank
        self._start_at(first_offset)

    @classmethod
    def adopted_many(
        cls,
        root: Path | str,
        units_per_file: int,
        table: FrontierTable,
        keys: Sequence[tuple[str, int]],
        firsts: Sequence[int],
        ends: Sequence[int],
    ) -> list[ConsumeQueue]:
        """New queues whose files starting at `firsts` parallel-dispatch workers made, queue i's
        slots [firsts[i], ends[i]) written and now committed: what `ConsumeQueue(load=False)`,
        `adopt_files(first)` and `commit_range(first, end)` make of each, in one step (a batch may
        bring 10,000 new queues).  Their rows of `table` are taken together and their frontiers
        and file ends set with one NumPy assignment each, so that each queue costs the dispatch
        thread its objects only: a slotted queue and file, and a list."""
        starts, stops = np.asarray(firsts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        bad = np.flatnonzero((starts % units_per_file != 0) | (stops <= starts) | (stops > starts + units_per_file))
        if len(bad):
            (topic, queue_id), first, end = keys[bad[0]], firsts[bad[0]], ends[bad[0]]
            raise ValueError(f"{topic}/{queue_id}: slots [{first}, {end}) are not in one file starting at the first")
        start = table.allocate(len(keys))
        rows = slice(start, start + len(keys))
        table.frontiers[rows] = stops
        table.files_end[rows] = starts + units_per_file
        root = str(root)  # one string for all
        queues = []
        for (topic, queue_id), first, row in zip(keys, firsts, range(start, start + len(keys))):
            cq = cls(root, topic, queue_id, units_per_file, load=False, table=table, row=row)
            cq._files.append(cq._lazy_file(first))
            cq.min_offset = first
            queues.append(cq)
        return queues

    def _lazy_file(self, start: int) -> _QueueFile:
        """The queue's file starting at slot `start`, mapped when first used (and made then if no
        worker has made it)."""
        return _QueueFile(self, start, create=True, lazy=True)

    def put(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        """Write and commit one unit (sequential dispatch); True if the frontier moved."""
        if not self.write(queue_offset, commit_log_offset, size, tags_code):
            return False
        return self.commit(queue_offset)

    def put_run(self, slots: np.ndarray, units: np.ndarray) -> bool:
        """`put` for a run of units (a `UNIT_DTYPE` array) at `slots`, in log order: when the
        slots are contiguous and not below the frontier, the units are copied into the files in
        bulk; True if the frontier moved."""
        count = len(slots)
        first = int(slots[0])
        last = int(slots[-1])
        if (
            first < self.commit_frontier
            or last - first != count - 1
            or not self._files
            or (count > 1 and not bool((slots[1:] - slots[:-1] == 1).all()))
        ):
            moved = False
            for slot, unit in zip(slots.tolist(), units.tolist()):
                moved = self.put(slot, *unit) or moved
            return moved
        done = 0
        while done < count:
            slot = first + done
            qf = self._file_for(slot, create=True)
            if qf is None:
                raise ValueError(f"queue offset {slot} of {self.topic}/{self.queue_id} is below its first file")
            n = min(count - done, qf.start + self.units_per_file - slot)
            pos = (slot - qf.start) * UNIT_SIZE
            back_with_blocks(qf.mm, pos, n * UNIT_SIZE)  # raises on a full disk, having written nothing
            qf.mm[pos : pos + n * UNIT_SIZE] = units[done : done + n].tobytes()
            done += n
        end = int(units["offset"][-1]) + int(units["size"][-1])
        if end > self.max_physical_offset:
            self.max_physical_offset = end
        with self._lock:
            if first == self.commit_frontier:
                self._advance_to(last + 1)
                return True
            self._pending_slots().update(range(first, last + 1))
            self.table.pending[self.row] = True
            return False

    # -- reading ----------------------------------------------------------------------------

    def _unit_at(self, queue_offset: int) -> tuple[int, int, int]:
        qf = self._file_for(queue_offset, create=False)
        if qf is None:
            raise IndexError(queue_offset)
        return UNIT.unpack_from(qf.mm, (queue_offset - qf.start) * UNIT_SIZE)

    @property
    def max_offset(self) -> int:
        """Exclusive maximum visible offset (the commit frontier)."""
        return self.commit_frontier

    def read(self, queue_offset: int, max_count: int) -> list[Unit]:
        """Units from `queue_offset` (clamped to the minimum) up to the frontier, at most `max_count`."""
        with self._lock:
            start = max(queue_offset, self.min_offset)
            end = min(self.commit_frontier, start + max_count)
            out: list[Unit] = []
            offset = start
            while offset < end:
                qf = self._file_for(offset, create=False)
                if qf is None:
                    break
                stop = min(end, qf.start + self.units_per_file)
                pos = (offset - qf.start) * UNIT_SIZE
                for i, (off, size, tags) in enumerate(UNIT.iter_unpack(qf.mm[pos : pos + (stop - offset) * UNIT_SIZE])):
                    if size != BLANK_UNIT_SIZE:
                        out.append(Unit(offset + i, off, size, tags))
                offset = stop
            return out

    def offset_for_timestamp(
        self, timestamp: int, store_time_of: Callable[[int], int | None], upper: bool = False
    ) -> int:
        """The queue offset whose message was stored at `timestamp` (spec §2).

        `store_time_of(commit_log_offset)` reads a record's store time, or None if that record is
        gone (treated as older than everything).  LOWER (default): the first entry with store time
        ≥ timestamp; UPPER: the last entry with store time ≤ timestamp.  Clamped to [min, max]."""

        def time_at(q: int) -> int:
            t = store_time_of(self._unit_at(q)[0])
            return -1 if t is None else t

        return offset_by_time(self.min_offset, self.commit_frontier, time_at, timestamp, upper)

    # -- maintenance --------------------------------------------------------------------------

    def truncate(self, commit_log_end: int) -> int:
        """Drop units whose record starts at or past `commit_log_end`; returns how many slots."""
        with self._lock:
            self._pending = {q for q in self._pending if q < self.commit_frontier}
            self._pending_changed()
            frontier = self.commit_frontier
            new_frontier = frontier
            while new_frontier > self.min_offset:
                off, size, _ = self._unit_at(new_frontier - 1)
                if size != BLANK_UNIT_SIZE and off < commit_log_end:
                    break
                new_frontier -= 1
            if new_frontier == frontier:
                return 0
            for q in range(new_frontier, frontier):
                qf = self._file_for(q, create=False)
                if qf is not None:
                    pos = (q - qf.start) * UNIT_SIZE
                    qf.mm[pos : pos + UNIT_SIZE] = bytes(UNIT_SIZE)
            for qf in [f for f in self._files if f.start >= new_frontier and f.start > self.min_offset]:
                self._files.remove(qf)
                qf.close()
                qf.unlink()
            self._files_changed()
            self.commit_frontier = new_frontier
            self.max_physical_offset = 0
            if new_frontier > self.min_offset:
                off, size, _ = self._unit_at(new_frontier - 1)
                self.max_physical_offset = off + size
            if not self._files or new_frontier == self.min_offset:
                self.max_physical_offset = 0
            return frontier - new_frontier

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        """Move the minimum past units whose records were deleted; drop files wholly below it."""
        with self._lock:
            lo, hi = self.min_offset, self.commit_frontier
            while lo < hi:
                mid = (lo + hi) // 2
                off, size, _ = self._unit_at(mid)
                if size == BLANK_UNIT_SIZE or off < min_commit_log_offset:
                    lo = mid + 1
                else:
                    hi = mid
            self.min_offset = lo
            while len(self._files) > 1 and self._files[1].start <= self.min_offset:
                qf = self._files.pop(0)
                self._files_changed()
                qf.close()
                qf.unlink()

    def flush(self) -> None:
        with self._lock:
            files = list(self._files[-2:])
        for qf in files:
            qf.flush()

    def close(self) -> None:
        with self._lock:
            for qf in self._files:
                qf.close()
            self._files.clear()
            self._files_changed()

    def destroy(self) -> None:
        self.close()
        if self.directory.is_dir():
            for p in self.directory.iterdir():
                p.unlink()
            self.directory.rmdir()


def offset_by_time(low: int, high: int, time_at: Callable[[int], int], timestamp: int, upper: bool) -> int:
    """Over the slots [low, high), whose store times (`time_at`, -1 for a record that is gone)
    do not decrease: LOWER, the first slot stored at or after `timestamp` (high if none); UPPER,
    the last stored at or before it (low if none)."""
    if upper:
        left, right = low - 1, high - 1
        while left < right:
            middle = (left + right + 1) // 2
            if time_at(middle) <= timestamp:
                left = middle
            else:
                right = middle - 1
        return max(left, low)
    left, right = low, high
    while left < right:
        middle = (left + right) // 2
        if time_at(middle) < timestamp:
            left = middle + 1
        else:
            right = middle
    return left
