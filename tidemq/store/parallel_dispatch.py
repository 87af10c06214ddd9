"""Parallel, order-preserving dispatch (RIP-52) with worker processes.

CPython threads would serialise on the GIL, so the work runs in **worker processes** that share
the store's files through their own mappings:

- The coordinator (the store's dispatch thread) walks only the record headers (size and magic,
  like RocketMQ's reput pre-check) from `_cut_offset` and cuts record-aligned **batches** of at
  most `batch_bytes`, numbered in log order.  A blank ends a segment's last batch.
- A worker (`BatchBuilder`) maps the commit-log segment read-only, decodes the batch with the
  columnar decoder (`scan`), and writes each ConsumeQueue unit **at its slot** (queue offsets
  were assigned at append time) through its own mapping of the queue file, creating files as
  needed: a queue's contiguous run of slots in the batch is one copy of a unit array.  For the key
  index it computes the entries (hash of `topic#key`, commit-log offset, store time) but does not
  write them.  It answers with, per queue, the slots it wrote, and the index entries.
- The coordinator commits each batch's slots as soon as the batch's answer arrives, in any order:
  `ConsumeQueue.commit_range` moves a queue's commit frontier only over contiguous written slots,
  so readers and long-polling listeners (told only of frontier moves) never see a gap or a
  reordering.  Index entries are appended, and `dispatched_offset` advances, strictly in batch
  order: `dispatched_offset` is the end of the longest prefix of completely built batches, which is
  what the checkpoint records and what recovery restarts from.
- A queue the coordinator has never seen is started (`ConsumeQueue.adopt_files`) only when its
  first batch is the oldest outstanding one, because only then is its first slot known.

Small backlogs (under `inline_bytes`, nothing in flight) are built in the coordinator itself with
the same `BatchBuilder`, so an idle store starts no process and a trickle pays no IPC.  Workers
start on first need (fresh interpreters, `python -m tidemq.store.dispatch_worker`: the threaded
store process is never forked) and are replaced if one dies; its batches are built again, which
rewrites the same bytes.  A worker whose coordinator died stops before writing a batch.

Batches are backlog / (4 × workers), between 64 KiB and `batch_bytes`, with up to 3 × workers
outstanding, so that one slow batch does not leave the other workers idle.

Crashes: the checkpoint's confirm offset is `dispatched_offset`, so after an abnormal exit recovery
(which runs the sequential `Dispatcher`) restarts at or below the oldest unfinished batch even when
later batches are written: the queues' furthest entry, `ConsumeQueueStore.covered_offset`, is only
trusted after a clean shutdown, when every batch is finished.  Units written past a queue's first
unwritten slot are zeroed when the queue is loaded, so they are never taken for entries.

Ownership: one coordinator thread calls `dispatch_until`; workers write disjoint 20-byte slots and
create queue files with O_CREAT + ftruncate to the common size (idempotent); only the coordinator
touches `ConsumeQueue` objects, the key index and the listeners.
"""

from __future__ import annotations

import logging
import mmap
import multiprocessing
import multiprocessing.connection
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import record
from .commit_log import CommitLog
from .consume_queue import UNIT, UNIT_DTYPE, UNIT_SIZE, ConsumeQueue, file_name
from .dispatch import ArrivalListener, ConsumeQueueStore, DispatchBatch, DispatchStats, QueueKey, dispatch_to, notify_listeners
from .scan import scan

log = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct(">ii")
_MESSAGE_MAGICS = (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2)
MIN_RECORD_SIZE = 91

DEFAULT_BATCH_BYTES = 4 << 20  # RocketMQ's BATCH_SIZE
DEFAULT_INLINE_BYTES = 64 << 10
CRASH_ENV = "TIDEMQ_DISPATCH_WORKER_CRASH"
CRASH_EXIT_CODE = 75


@dataclass(slots=True, frozen=True)
class BatchTask:
    batch_id: int
    segment_path: str
    segment_start: int
    segment_size: int
    begin: int  # commit-log offsets, record-aligned, inside the segment
    end: int


@dataclass(slots=True)
class BatchResult:
    batch_id: int
    begin: int
    end: int  # where building stopped: the task's end unless `error`
    error: str | None
    records: int
    last_store_timestamp: int
    # (topic, queue id, first slot, slot count, extra slots or None): the slots written, in order
    # [first, first + count) followed by `extra` when the queue's slots were not contiguous
    queues: list[tuple[str, int, int, int, list[int] | None]]
    index_hashes: np.ndarray
    index_phys: np.ndarray
    index_timestamps: np.ndarray


_MAGIC_PREFIX = b"\xda\xa3\x20"  # the first three bytes of both message magic codes
_I64 = struct.Struct(">q")


def _record_after(mm, base: int, pos: int, stop: int) -> int | None:
    """The first position at or after `pos` (and before `stop`) holding what looks like a record
    header: a message magic code and a PHYSICALOFFSET equal to its own commit-log offset.  A
    candidate, not a proof: bytes inside a body could pass; the walk over the batch before it
    confirms the boundary."""
    find = mm.find
    while True:
        at = find(_MAGIC_PREFIX, pos + 4, stop)
        if at < 0:
            return None
        start = at - 4
        if start + 36 <= stop and mm[at + 3] in (0xA7, 0xAB) and _I64.unpack_from(mm, start + 28)[0] == base + start:
            return start
        pos = start + 1


# ---------------------------------------------------------------------------------------------
# Building a batch (worker side; also used inline by the coordinator)


class BatchBuilder:
    """Decodes one batch of records and writes their ConsumeQueue units at their slots through
    its own file mappings.  Caches segment and queue-file mappings between batches."""

    MAX_QUEUE_FILES = 30_000  # mappings kept open (vm.max_map_count is 65,530 by default)
    MAX_SEGMENTS = 4

    def __init__(self, consume_queue_root: str, default_units_per_file: int, index_enabled: bool) -> None:
        self.root = Path(consume_queue_root)
        self.default_units_per_file = default_units_per_file
        self.index_enabled = index_enabled
        self._segments: dict[str, mmap.mmap] = {}
        self._units_per_file: dict[QueueKey, int] = {}
        self._files: dict[tuple[str, int, int], mmap.mmap] = {}
        self.exit_after_units = 0  # fault injection for crash tests: die after writing this many units
        self.coordinator_pid = 0  # set in a worker: stop before writing a batch if the coordinator died

    def _segment(self, task: BatchTask) -> mmap.mmap:
        mm = self._segments.get(task.segment_path)
        if mm is None:
            if len(self._segments) >= self.MAX_SEGMENTS:
                oldest = next(iter(self._segments))
                self._segments.pop(oldest).close()
            with open(task.segment_path, "rb") as f:
                mm = mmap.mmap(f.fileno(), task.segment_size, access=mmap.ACCESS_READ)
            self._segments[task.segment_path] = mm
        return mm

    def _queue_units_per_file(self, key: QueueKey) -> int:
        upf = self._units_per_file.get(key)
        if upf is None:
            directory = self.root / key[0] / str(key[1])
            upf = self.default_units_per_file
            if directory.is_dir():
                sizes = [p.stat().st_size for p in directory.iterdir() if p.name.isdigit() and len(p.name) == 20]
                if sizes and max(sizes) >= UNIT_SIZE:
                    upf = max(sizes) // UNIT_SIZE  # an existing queue keeps its file size
            self._units_per_file[key] = upf
        return upf

    def _queue_file(self, topic: str, queue_id: int, file_start: int, upf: int) -> mmap.mmap:
        if len(self._files) >= self.MAX_QUEUE_FILES:
            self.close_queue_files()
        directory = f"{self.root}/{topic}/{queue_id}"
        size = upf * UNIT_SIZE
        path = f"{directory}/{file_name(file_start * UNIT_SIZE)}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # every creator extends to the same size: idempotent
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._files[(topic, queue_id, file_start)] = mm
        return mm

    def build(self, task: BatchTask) -> BatchResult:
        mm = self._segment(task)
        base = task.segment_start
        columns = scan(mm, task.begin - base, task.end - base, base)
        error = None
        end = columns.end
        if end < task.end:
            rec = record.decode(mm, end - base, base_offset=base, check_crc=False, read_body=False)
            if type(rec) is record.EndOfSegment:
                end = base + task.segment_size  # the blank closes the segment: the batch takes it
            elif type(rec) is not record.Record:  # (a Record runs past the end: a short batch)
                error = f"{type(rec).__name__} at commit-log offset {end}" + (
                    f": {rec.reason}" if type(rec) is record.Invalid else ""
                )
        if self.coordinator_pid and os.getppid() != self.coordinator_pid:
            os._exit(0)  # orphaned: the store is gone, and a reopened one may be recovering
        queues = self._write_units(columns) if len(columns) else []
        if self.index_enabled:
            hashes, phys, times = columns.index_keys()
        else:
            hashes, phys, times = np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return BatchResult(
            batch_id=task.batch_id,
            begin=task.begin,
            end=end,
            error=error,
            records=len(columns),
            last_store_timestamp=int(columns.store_timestamps[-1]) if len(columns) else 0,
            queues=queues,
            index_hashes=hashes,
            index_phys=phys,
            index_timestamps=times,
        )

    def _write_units(self, columns) -> list:
        """Write every queue entry of `columns` at its slot; returns, per queue, the slots
        written as (topic, queue id, first, count, extra slots or None): [first, first + count)
        followed by `extra` when the queue's slots in this batch were not contiguous."""
        kinds = columns.sysflags & record.TRANSACTION_TYPE_MASK
        rows = np.flatnonzero((kinds == record.TRANSACTION_NOT) | (kinds == record.TRANSACTION_COMMIT))
        if not len(rows):
            return []
        queue_keys = (columns.topic_ids[rows].astype(np.int64) << 32) | (columns.queue_ids[rows].astype(np.int64) & 0xFFFFFFFF)
        order = np.argsort(queue_keys, kind="stable")
        rows = rows[order]
        sorted_keys = queue_keys[order]
        bounds = (np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1).tolist()
        slots = columns.queue_offsets[rows]
        units = np.empty(len(rows), dtype=UNIT_DTYPE)
        units["offset"] = columns.offsets[rows]
        units["size"] = columns.sizes[rows]
        units["tags_code"] = columns.tags_codes[rows]
        starts = np.array([0] + bounds, dtype=np.int64)
        stops = np.array(bounds + [len(rows)], dtype=np.int64)
        # a group is one contiguous run when no slot inside it breaks the +1 sequence
        breaks = np.zeros(len(rows), dtype=np.int64)
        breaks[1:] = np.cumsum(slots[1:] != slots[:-1] + 1)
        contiguous = (breaks[stops - 1] == breaks[starts]).tolist()
        unit_bytes = memoryview(units.tobytes())
        first_slots = slots[starts].tolist()
        names = columns.topic_names
        group_topics = columns.topic_ids[rows[starts]].tolist()
        group_queues = columns.queue_ids[rows[starts]].tolist()
        files = self._files
        upf_of = self._units_per_file
        crash_test = self.exit_after_units
        answer = []
        for start, stop, first, whole, tid, queue_id in zip(
            starts.tolist(), stops.tolist(), first_slots, contiguous, group_topics, group_queues
        ):
            topic = names[tid]
            key = (topic, queue_id)
            upf = upf_of.get(key) or self._queue_units_per_file(key)
            if crash_test or not whole:
                answer.append(self._write_slots(topic, queue_id, upf, slots[start:stop].tolist(), units[start:stop]))
                continue
            count = stop - start
            file_start = first - first % upf
            if first + count <= file_start + upf:  # the run lies in one file
                qmm = files.get((topic, queue_id, file_start))
                if qmm is None:
                    qmm = self._queue_file(topic, queue_id, file_start, upf)
                pos = (first - file_start) * UNIT_SIZE
                qmm[pos : pos + count * UNIT_SIZE] = unit_bytes[start * UNIT_SIZE : stop * UNIT_SIZE]
            else:
                done = start
                while done < stop:  # one copy per queue file the run spans
                    slot = first + done - start
                    file_start = slot - slot % upf
                    qmm = files.get((topic, queue_id, file_start))
                    if qmm is None:
                        qmm = self._queue_file(topic, queue_id, file_start, upf)
                    n = min(stop - done, file_start + upf - slot)
                    pos = (slot - file_start) * UNIT_SIZE
                    qmm[pos : pos + n * UNIT_SIZE] = unit_bytes[done * UNIT_SIZE : (done + n) * UNIT_SIZE]
                    done += n
            answer.append((topic, queue_id, first, count, None))
        return answer

    def _write_slots(self, topic: str, queue_id: int, upf: int, slots: list[int], units: np.ndarray) -> tuple:
        """One unit at a time, for a queue whose slots in the batch are not one contiguous run."""
        files = self._files
        unit_pack = UNIT.pack_into
        run_first = slots[0]
        run_next = run_first
        extra = None
        for slot, unit in zip(slots, units.tolist()):
            file_start = slot - slot % upf
            qmm = files.get((topic, queue_id, file_start))
            if qmm is None:
                qmm = self._queue_file(topic, queue_id, file_start, upf)
            unit_pack(qmm, (slot - file_start) * UNIT_SIZE, *unit)
            if self.exit_after_units:
                self.exit_after_units -= 1
                if not self.exit_after_units:
                    os._exit(CRASH_EXIT_CODE)  # a worker killed mid-batch (tests only)
            if slot == run_next and extra is None:
                run_next = slot + 1
            else:
                if extra is None:
                    extra = []
                extra.append(slot)
        return (topic, queue_id, run_first, run_next - run_first, extra)

    def close_queue_files(self) -> None:
        for mm in self._files.values():
            mm.close()
        self._files.clear()

    def close(self) -> None:
        self.close_queue_files()
        for mm in self._segments.values():
            mm.close()
        self._segments.clear()


def _worker_main(conn, consume_queue_root: str, default_units_per_file: int, index_enabled: bool) -> None:
    """A worker process: build each task it receives and send back the result; None stops it."""
    builder = BatchBuilder(consume_queue_root, default_units_per_file, index_enabled)
    builder.coordinator_pid = os.getppid()
    # TIDEMQ_DISPATCH_WORKER_CRASH="N:MARKER" (crash tests): the first worker to create MARKER
    # dies after writing N units of its first batch
    crash = os.environ.get(CRASH_ENV)
    if crash:
        count, _, marker = crash.partition(":")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            builder.exit_after_units = int(count)
        except FileExistsError:
            pass
    try:
        while True:
            try:
                task = conn.recv()
            except EOFError:
                return
            if task is None:
                return
            if task == "ping":
                conn.send("pong")
                continue
            try:
                result = builder.build(task)
            except Exception as exc:  # an I/O error: the coordinator logs it and stalls there
                result = BatchResult(task.batch_id, task.begin, task.begin, f"worker failed: {exc!r}", 0, 0, [],
                                     np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))
            conn.send(result)
    finally:
        builder.close()


class _Worker:
    """A worker process (`python -m tidemq.store.dispatch_worker`, talking pickled messages over
    two pipes): a fresh interpreter, so the threaded store process is never forked and the
    caller's main module is never re-imported."""

    __slots__ = ("process", "conn", "tasks")

    def __init__(self, consume_queue_root: str, units_per_file: int, index_enabled: bool) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tidemq.store.dispatch_worker", str(to_child_r), str(from_child_w),
                 consume_queue_root, str(units_per_file), "1" if index_enabled else "0"],
                pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.conn = _Channel(from_child_r, to_child_w)
        self.tasks: dict[int, BatchTask] = {}

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


class _Channel:
    """Both ends of a worker's pipes as one duplex connection."""

    __slots__ = ("reader", "writer")

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.reader = multiprocessing.connection.Connection(read_fd, writable=False)
        self.writer = multiprocessing.connection.Connection(write_fd, readable=False)

    def send(self, obj) -> None:
        self.writer.send(obj)

    def recv(self):
        return self.reader.recv()

    def poll(self) -> bool:
        return self.reader.poll()

    def fileno(self) -> int:
        return self.reader.fileno()

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


# ---------------------------------------------------------------------------------------------
# The coordinator


@dataclass(slots=True)
class SinkProgress:
    """How far one sink is built: everything below `offset` is indexed; the newest record
    indexed was stored at `last_store_timestamp`."""

    offset: int
    last_store_timestamp: int = 0


class ParallelDispatcher:
    """Drop-in for `Dispatcher` (dispatched_offset, listeners, stats, dispatch_until) building
    batches with `workers` processes."""

    def __init__(
        self,
        commit_log: CommitLog,
        queues: ConsumeQueueStore,
        key_index=None,
        start_offset: int = 0,
        workers: int = 2,
        *,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        inline_bytes: int = DEFAULT_INLINE_BYTES,
    ) -> None:
        if workers < 1:
            raise ValueError(f"dispatch workers must be at least 1, not {workers}")
        self.commit_log = commit_log
        self.queues = queues
        self.key_index = key_index
        self.sinks = [queues] + ([key_index] if key_index is not None else [])
        self.extra_sinks: list = []  # other sinks get DispatchRequests in log order (decoded here)
        self.worker_count = workers
        self.batch_bytes = batch_bytes
        self.inline_bytes = inline_bytes
        self.dispatched_offset = start_offset
        self.listeners: list[ArrivalListener] = []
        self.stats = DispatchStats()
        self.progress = {sink.name: SinkProgress(start_offset) for sink in self.sinks}
        self.limit_source: Callable[[], int] | None = None  # re-read while dispatching, if set
        self._cut_offset = start_offset
        self._next_id = 0
        self._head_id = 0
        self._tasks: dict[int, BatchTask] = {}  # outstanding: cut, not yet processed in order
        self._done: dict[int, BatchResult] = {}  # built inline (or empty), not yet collected
        self._answers: dict[int, BatchResult] = {}  # answered out of order, waiting to be the head
        self._blank_ends: dict[int, int] = {}  # batch id -> segment end, for an empty batch at a blank
        self._stalled = False
        self._workers: list[_Worker] = []
        self._builder: BatchBuilder | None = None
        self.inline_batches = 0
        self.worker_batches = 0
        self.workers_restarted = 0
        self._closed = False

    # -- the public face of Dispatcher ---------------------------------------------------------

    def add_sink(self, sink) -> None:
        self.extra_sinks.append(sink)
        self.sinks.append(sink)
        self.progress[sink.name] = SinkProgress(self.dispatched_offset)

    def dispatch_until(self, limit: int, notify: bool = True) -> int:
        """Dispatch every record wholly below `limit` (and below what `limit_source` says when
        set); returns how many records were dispatched in order."""
        total = 0
        while True:
            if self.limit_source is not None:
                limit = max(limit, self.limit_source())
            self._fill(limit)
            if not self._tasks:
                return total
            changes: dict[QueueKey, int] = {}
            for result in self._collect():
                total += self._complete(result, changes)
            if notify and changes:
                notify_listeners(self.listeners, changes)
            if self._stalled:
                self._stalled = False
                return total

    # -- cutting batches ---------------------------------------------------------------------------

    def _cut(self, limit: int, size: int) -> BatchTask | None:
        """The next batch from `_cut_offset` (a record boundary), or None if no whole record is
        readable there.  Its end is the first record boundary at or after `size` bytes, found by
        looking for a record header that names its own position (magic code, PHYSICALOFFSET),
        not by walking every record: the worker's walk confirms it (`_advance`)."""
        offset = self._cut_offset
        if offset < limit and offset < self.commit_log.min_offset:
            offset = self._cut_offset = self.commit_log.min_offset
            if not self._tasks:
                self.dispatched_offset = offset
        segment = self.commit_log.segment_for(offset)
        if segment is None:
            return None
        mm = segment.mm
        base = segment.start
        seg_end = segment.end
        pos = offset - base
        hard_stop = min(limit, seg_end) - base
        if pos >= hard_stop or pos + 8 > segment.size:
            return None
        total, magic = _SIZE_MAGIC.unpack_from(mm, pos)
        if magic == record.BLANK_MAGIC_CODE and pos + total == segment.size:
            # the blank closes the segment: an empty batch moves the dispatched offset past it
            task = BatchTask(self._next_id, str(segment.path), base, segment.size, offset, offset)
            self._next_id += 1
            self._blank_ends[task.batch_id] = seg_end
            self._cut_offset = seg_end
            return task
        if magic not in _MESSAGE_MAGICS or total < MIN_RECORD_SIZE or pos + total > hard_stop:
            return None  # not written yet, or damage the sequential walk reports; never skip past it
        end = hard_stop
        if pos + size < hard_stop - (size >> 2):  # else take the rest rather than leave a sliver
            boundary = _record_after(mm, base, max(pos + size, pos + total), hard_stop)
            if boundary is not None:
                end = boundary
        task = BatchTask(self._next_id, str(segment.path), base, segment.size, offset, base + end)
        self._next_id += 1
        self._cut_offset = base + end
        return task

    def _fill(self, limit: int) -> None:
        max_outstanding = 3 * self.worker_count
        while len(self._tasks) < max_outstanding and self._cut_offset < limit:
            backlog = limit - self._cut_offset
            # several batches per worker, so that one slow batch does not idle the others
            size = min(self.batch_bytes, max(self.inline_bytes, 64 << 10, backlog // (4 * self.worker_count)))
            task = self._cut(limit, size)
            if task is None:
                break
            self._tasks[task.batch_id] = task
            if task.end == task.begin:
                self._done[task.batch_id] = self._empty_result(task)
            elif backlog <= self.inline_bytes and len(self._tasks) == 1:
                self._done[task.batch_id] = self._build_inline(task)
            else:
                self._submit(task)

    def _empty_result(self, task: BatchTask) -> BatchResult:
        return BatchResult(task.batch_id, task.begin, self._blank_ends.pop(task.batch_id, task.end), None, 0, 0, [], np.zeros(0, np.int32),
                           np.zeros(0, np.int64), np.zeros(0, np.int64))

    def _build_inline(self, task: BatchTask) -> BatchResult:
        if self._builder is None:
            self._builder = BatchBuilder(str(self.queues.root), self.queues.units_per_file, self.key_index is not None)
        self.inline_batches += 1
        return self._builder.build(task)

    # -- workers -------------------------------------------------------------------------------------

    def _start_worker(self) -> _Worker:
        return _Worker(str(self.queues.root), self.queues.units_per_file, self.key_index is not None)

    def start_workers(self) -> None:
        """Start the worker processes now rather than on the first large backlog."""
        if not self._workers:
            self._workers = [self._start_worker() for _ in range(self.worker_count)]
            log.info("dispatch: started %d worker processes", self.worker_count)

    def wait_ready(self) -> None:
        """Start the workers and wait until each has answered once (benchmarks: keep the
        interpreter start out of the timing)."""
        self.start_workers()
        for worker in self._workers:
            worker.conn.send("ping")
        for worker in self._workers:
            assert worker.conn.recv() == "pong"

    def _submit(self, task: BatchTask) -> None:
        self.start_workers()
        worker = min(self._workers, key=lambda w: len(w.tasks))
        worker.tasks[task.batch_id] = task
        self.worker_batches += 1
        try:
            worker.conn.send(task)
        except (OSError, EOFError):
            pass  # a dead worker is noticed and replaced by _collect

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    def _collect(self) -> list[BatchResult]:
        """Answers that are ready (waiting for at least one if none is)."""
        results = [self._done.pop(i) for i in sorted(self._done)]
        if results:
            return results
        busy = [w for w in self._workers if w.tasks]
        if not busy:
            return results
        ready = multiprocessing.connection.wait([w.conn.reader for w in busy])
        for worker in busy:
            if worker.conn.reader in ready:
                try:
                    while worker.conn.poll():
                        result = worker.conn.recv()
                        if worker.tasks.pop(result.batch_id, None) is not None:
                            results.append(result)
                except (EOFError, OSError):  # the pipe closed: the worker died
                    worker.process.wait()
                    self._replace(worker)
        return results

    def _replace(self, dead: _Worker) -> None:
        log.warning(
            "dispatch worker %s died (exit code %s); rebuilding its %d batch(es) in a new one",
            dead.pid, dead.process.returncode, len(dead.tasks),
        )
        dead.conn.close()
        replacement = self._start_worker()
        self.workers_restarted += 1
        self._workers[self._workers.index(dead)] = replacement
        for batch_id, task in sorted(dead.tasks.items()):
            replacement.tasks[batch_id] = task
            replacement.conn.send(task)

    # -- completing batches ----------------------------------------------------------------------------

    def _complete(self, result: BatchResult, changes: dict[QueueKey, int]) -> int:
        """Keep a batch's answer (they come in any order); then process every batch now at the
        head, in order."""
        if result.batch_id not in self._tasks:
            return 0  # from a generation that was discarded
        self._answers[result.batch_id] = result
        total = 0
        while self._head_id in self._answers:
            total += self._advance(self._answers.pop(self._head_id), changes)
        return total

    def _advance(self, head: BatchResult, changes: dict[QueueKey, int]) -> int:
        """`head` is the oldest outstanding batch: commit its slots (every earlier batch is
        committed, so each queue's run starts at its frontier, or starts the queue), append its
        index entries, move the dispatched offset."""
        task = self._tasks.pop(head.batch_id)
        self._head_id += 1
        queues = self.queues
        table = queues.queues
        for entry in head.queues:
            topic, queue_id, first, count, extra = entry
            key = (topic, queue_id)
            cq = table.get(key)
            if cq is None or not cq._files:
                if cq is None:
                    cq = table[key] = ConsumeQueue(queues.root, topic, queue_id, queues.units_per_file, load=False)
                cq.adopt_files(first)
            if cq.commit_range(first, first + count) | (extra is not None and self._commit_extra(cq, extra)):
                changes[key] = cq.commit_frontier
        end = head.end
        if self.key_index is not None and len(head.index_hashes):
            self.key_index.append_entries(head.index_hashes, head.index_phys, head.index_timestamps, end)
        elif self.key_index is not None:
            self.key_index.indexed_until = max(self.key_index.indexed_until, end)
        if self.extra_sinks and end > head.begin:
            batch = _read_batch(self.commit_log, head.begin, end)
            for sink in self.extra_sinks:
                dispatch_to(sink, batch, changes)
        if head.records:
            self.stats.records += head.records
            self.stats.last_store_timestamp = head.last_store_timestamp
            queues.logics_msg_timestamp = head.last_store_timestamp
            for progress in self.progress.values():
                progress.last_store_timestamp = head.last_store_timestamp
        self.stats.bytes += end - task.begin
        self.dispatched_offset = end
        for progress in self.progress.values():
            progress.offset = end
        if head.error is not None:
            log.error("dispatch stopped at commit-log offset %d: %s", end, head.error)
            self._discard_after(end)
        elif end != task.end:
            # the walk did not land on the batch's end: the rest of the log is not readable yet,
            # or the cut took bytes inside a record for a header; cut again from where it stopped
            self._discard_after(end)
        return head.records

    @staticmethod
    def _commit_extra(cq: ConsumeQueue, extra: list[int]) -> bool:
        moved = False
        for slot in extra:
            moved = cq.commit_range(slot, slot + 1) or moved
        return moved

    def _discard_after(self, end: int) -> None:
        """Forget every later batch (written, but never committed) and cut again from `end`;
        dispatch stalls at a damaged record as the sequential dispatcher does."""
        for batch_id in list(self._tasks):
            self._tasks.pop(batch_id)
            self._blank_ends.pop(batch_id, None)
        self._answers.clear()
        self._done.clear()
        for worker in self._workers:
            worker.tasks.clear()  # their answers, when they come, are ignored
        self._head_id = self._next_id
        self._cut_offset = end
        self._stalled = True

    # -- lag and closing ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (OSError, EOFError):
                pass
        deadline = time.monotonic() + 5
        for worker in self._workers:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            worker.conn.close()
        self._workers = []
        if self._builder is not None:
            self._builder.close()
            self._builder = None


def _read_batch(commit_log: CommitLog, begin: int, end: int) -> DispatchBatch:
    """The records of [begin, end) (one built batch) for sinks the workers do not build."""
    segment = commit_log.segment_for(begin)
    if segment is None:
        return DispatchBatch(scan(b"", 0, 0, begin))
    return DispatchBatch(scan(segment.mm, begin - segment.start, end - segment.start, segment.start))
