"""The worker side of parallel dispatch (see parallel): one batch of commit-log records built
into ConsumeQueue units at their slots, and key-index entries, by `BatchBuilder`, in a worker
process (workers) or in the coordinator itself (`ThreadBuilder`, which writes the queues the
store has through their own mappings); the messages it takes and answers are in messages.

Queue ownership: with N workers, worker k owns the queues for which `owner_of(topic, queue id, N)`
is k (a CRC-32 of the topic name plus the queue id, modulo N: the same in every process).
Building a batch, a worker writes the units of its own queues first, making their files, then
those of each other worker's queue whose slots in the batch are one run, into the queue's file
(`_other_queue_file`: mapped, and made if its owner has not made it yet, while the builder's
mappings are under half their budget); the rest of each other worker's queues it packs into a
`UnitsHandover` (per queue its first slot and count, the 20-byte units back to back), which
travels pickled inside the `BatchResult`; the coordinator forwards it unopened to the owner, who
writes the units and answers `UnitsWritten`.  So units are handed over only for a queue whose
slots are not one run, and with more queues than half a worker's mappings, when each worker keeps
to its own queues' files: writing where the file is costs less than a handover's messages and
copies, and any worker may make a missing file.  Two workers meeting the same new queues each
make its own share first, and then mostly find the other's made.  A batch naming few queues
(`DIRECT_QUEUES`) its builder writes whole without working out owners, as handing them over costs
more than making a few files in each worker.  The run of
slots of every queue of the batch, its own or not, is in the `BatchResult` (`QueueRuns`).  A
builder with one owner (the coordinator's inline builder) writes every queue itself.

In a worker process the key-index entries of a batch stay in the worker (`hold_index`): when the
batch reaches the head, the coordinator asks that worker to append them (`IndexAppend`) to the
newest index file, which the worker maps too, and waits for the answer (`IndexAppended`) before
the next batch's entries are appended, so appends happen one at a time in log order and the files
are those the single thread writes.  A worker answers append requests, and writes handed-over
units, before it builds the next batch it was sent (and between decoding a batch and writing it);
asked for a batch it has not built yet, it appends as soon as it has built it.

Ownership: each worker process has its own `BatchBuilder`, its own mappings of the segments and of
the queue files it writes; workers write disjoint 20-byte slots and create queue files with O_CREAT
+ ftruncate to the common size (idempotent: the coordinator's inline builder and its ConsumeQueues
open the same files, and a worker mapping a file its owner is making extends it too).  At most one
worker appends to the key index at a time, when the coordinator says so; only the coordinator
creates index files.
"""

from __future__ import annotations

import errno
import mmap
import os
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..blocks import back_with_blocks
from ..format import record
from ..format.scan import scan
from ..index.index_file import IndexFile
from ..queues import open_files
from ..queues.consume_queue import MAPPINGS, UNIT, UNIT_DTYPE, UNIT_SIZE, file_name, map_queue_file
from ..queues.queue_set import ConsumeQueueStore
from .faults import WorkerFaults
from .messages import BatchResult, BatchTask, IndexAppend, IndexAppended, QueueRuns, UnitsHandover
from .requests import QueueKey, group_by_queue, queue_rows

if TYPE_CHECKING:
    from .._dispatch import RunCache
    from ..queues._queue_file import Mapping

    QueueFileMap = mmap.mmap | Mapping  # a queue file mapped, by the extension or by Python

# the copies of all the runs of a batch (and of the units handed over) by one compiled loop; the
# Python loop does the same where the extension is not built
_RunCache: type[RunCache] | None
_write_runs: Callable[..., list[int]] | None
try:
    from .._dispatch import RunCache as _RunCache
    from .._dispatch import write_runs as _write_runs
except ImportError:  # the extension is optional: without it, a Python loop copies the runs
    _RunCache = _write_runs = None


def map_file_python(path: str, size: int, create: bool) -> mmap.mmap | None:
    """`_queue_file.map_file` with Python's mmap module (`consume_queue.map_queue_file`, random
    access): an `mmap.mmap`, or None when not `create` and the file is not there."""
    try:
        return map_queue_file(path, size, create=create, random_access=True)
    except FileNotFoundError:
        if create:
            raise
        return None


map_file: Callable[[str, int, bool], QueueFileMap | None]
try:
    from ..queues._queue_file import map_file

    MAPPINGS_HOLD_DESCRIPTORS = False  # a `_queue_file.Mapping` closes its file once it is mapped
except ImportError:  # optional too: without it, queue files are mapped with Python's mmap module
    map_file = map_file_python
    MAPPINGS_HOLD_DESCRIPTORS = True  # an `mmap.mmap` keeps a duplicate of the file's descriptor

# in a worker process, a batch naming at most this many queues is written whole by its builder,
# every queue, owned or not: handing a few queues' units over (two more messages through the
# coordinator, and copies) cost more than each worker mapping their few files
DIRECT_QUEUES = 16
MAX_HELD_BATCHES = 256  # index entries of batches never asked for (dropped batches) are let go


# a batch whose units the disk had no room for answers with an error that starts so: dispatch
# waits there for space (`ParallelDispatcher`), and builds the batch again
NO_SPACE = "no disk space"
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def failure(exc: Exception) -> str:
    """What a builder's answer says of a failure: `NO_SPACE` first for a full disk."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
        return f"{NO_SPACE}: {exc.strerror or exc}"
    return f"worker failed: {exc!r}"


def failed_result(task: BatchTask, error: str) -> BatchResult:
    """The answer for a batch that could not be built: nothing of it taken (it ends where it
    begins), `error` saying why."""
    empty32, empty64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
    return BatchResult(task.batch_id, task.begin, task.begin, error, 0, 0, QueueRuns.empty(), empty32, empty64, empty64)


def owner_of(topic: str, queue_id: int, owners: int) -> int:
    """The worker (0 to `owners` - 1) that writes the queue's units: CRC-32 of the topic name plus
    the queue id (as unsigned), modulo `owners`: the same in every process and every run (Python's
    str hash is not), and the consecutive queue ids of a topic alternate between workers."""
    return (zlib.crc32(topic.encode()) + (queue_id & 0xFFFFFFFF)) % owners


def _first_run(slots: list[int]) -> tuple[int, list[int] | None]:
    """A queue's slots in a batch, in log order, as a run from the first slot (its length) and
    the slots after it that do not continue it (None when all do)."""
    run_next = slots[0]
    extra = None
    for slot in slots:
        if slot == run_next and extra is None:
            run_next = slot + 1
        else:
            if extra is None:
                extra = []
            extra.append(slot)
    return run_next - slots[0], extra


class BatchBuilder:
    """Decodes one batch of records and writes their ConsumeQueue units at their slots through
    its own file mappings.  Caches segment and queue-file mappings between batches."""

    MAX_SEGMENTS = 4

    def __init__(
        self,
        consume_queue_root: str,
        default_units_per_file: int,
        index_enabled: bool,
        units_per_file: dict[QueueKey, int] | None = None,
        faults: WorkerFaults | None = None,
    ) -> None:
        self.root = Path(consume_queue_root)
        self.default_units_per_file = default_units_per_file
        self.index_enabled = index_enabled
        self._segments: dict[str, mmap.mmap] = {}
        # the queues whose files have another size than the default, as the coordinator's
        # ConsumeQueueStore loaded them (`ConsumeQueueStore.file_sizes`); every other queue is
        # new or has default-size files, so a worker learns a queue's file size without asking
        # the file system
        self._units_per_file: dict[QueueKey, int] = dict(units_per_file or {})
        # the queue files mapped, by (topic, queue id, first slot): `_queue_file.Mapping`s, which
        # hold no descriptor, or without the extension `mmap.mmap`s, each holding an open file
        # (open_files); all are closed at the budget
        self._files: dict[tuple[str, int, int], QueueFileMap] = {}
        # their addresses for the compiled copy loop, with their buffers exported: cleared before
        # they are closed
        self._run_cache = _RunCache() if _RunCache is not None else None
        self.max_queue_files = open_files.mapping_budget(open_files.INLINE_BUILDER_SHARE)
        self.faults = faults  # where a crash test's worker dies (see faults); None: nowhere
        self.coordinator_pid = 0  # set in a worker: stop before writing a batch if the coordinator died
        self.hold_index = False  # keep each batch's index entries for `append_index`
        self.between_steps: Callable[[], None] | None = (
            None  # called between decoding a batch and writing it (a worker answers appends there)
        )
        # this builder owns the queues `owner_of(..., owners)` gives it; of the others it writes
        # the runs while under half its budget and hands the rest over (`UnitsHandover`), unless
        # the batch names `direct_queues` at most; one owner: every queue is its own
        self.owner = 0
        self.owners = 1
        self.direct_queues = 0  # a worker process: DIRECT_QUEUES
        self._held: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._index_files: dict[str, IndexFile] = {}

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

    def _other_queue_file(self, topic: str, queue_id: int, file_start: int, upf: int):
        """A file of another worker's queue, mapped (and made, if its owner has not made it yet)
        while this builder's mappings are under half their budget (with more queues than that,
        each worker keeps to its own); None otherwise: the units are handed over."""
        return self._queue_file(topic, queue_id, file_start, upf) if self._maps_other_files() else None

    def _maps_other_files(self) -> bool:
        """Whether this builder still maps files of other workers' queues: while its mappings are
        under half their budget."""
        return self._own_mappings() < self.max_queue_files // 2

    def _queue_file(self, topic: str, queue_id: int, file_start: int, upf: int) -> QueueFileMap:
        """The queue's file starting at slot `file_start`, made if need be, mapped (a
        `_queue_file.Mapping`, or an `mmap.mmap` without the extension) and kept in `_files`."""
        if self._own_mappings() >= self.max_queue_files:
            self.close_queue_files()
        path = f"{self.root}/{topic}/{queue_id}/{file_name(file_start * UNIT_SIZE)}"
        # every creator extends to the same size: idempotent; random access, so that a first
        # write reads in one page, not the file (readahead): with 10,000 new queues that was
        # most of the cost of making their files
        mm = map_file(path, upf * UNIT_SIZE, True)
        assert mm is not None  # made when missing
        self._files[(topic, queue_id, file_start)] = mm
        return mm

    def _own_mappings(self) -> int:
        """How many queue files this builder has mapped itself (held against its budget)."""
        return len(self._files)

    def build(self, task: BatchTask) -> BatchResult:
        mm = self._segment(task)
        base = task.segment_start
        columns = scan(mm, task.begin - base, task.end - base, base, keys=self.index_enabled)
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
        self._exit_if_orphaned()
        if self.between_steps is not None:
            self.between_steps()
        try:
            queues, handovers = self._write_units(columns, task.batch_id) if len(columns) else (QueueRuns.empty(), [])
        except OSError as exc:  # a full disk: nothing of the batch is taken (its units are written again)
            if exc.errno not in NO_SPACE_ERRNOS:
                raise
            return failed_result(task, failure(exc))
        if self.index_enabled:
            hashes, phys, times = columns.index_keys()
        else:
            hashes, phys, times = np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)
        held = 0
        if self.hold_index and len(hashes):
            self._held[task.batch_id] = (hashes, phys, times)
            while len(self._held) > MAX_HELD_BATCHES:
                del self._held[next(iter(self._held))]
            held = len(hashes)
            hashes, phys, times = hashes[:0], phys[:0], times[:0]
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
            index_held=held,
            handovers=handovers,
        )

    def append_index(self, request: IndexAppend) -> IndexAppended:
        """Append the held entries of a batch (see `IndexAppend`).  The coordinator asks for the
        batches in log order, so entries held for an older batch than this one are stale (their
        batch was dropped and cut again) and are let go."""
        for stale in [b for b in self._held if b < request.batch_id]:
            del self._held[stale]
        held = self._held.get(request.batch_id)
        if held is None:
            return IndexAppended(request.batch_id, 0, 0, 0, 0, "no entries held for this batch")
        hashes, phys, times = held
        if len(phys) and int(phys[0]) < request.skip_below:  # indexed before (a restart below it)
            keep = phys >= request.skip_below
            hashes, phys, times = hashes[keep], phys[keep], times[keep]
        self._exit_if_orphaned()
        done = 0
        if len(hashes) and request.path is not None:
            index = self._index_file(request.path, request.hash_slots, request.max_entries)
            if self.faults is not None and self.faults.in_append and index.entry_count:
                self.faults.append_and_die(index, hashes, phys, times)
            done = index.append(hashes, phys, times)
        if done < len(hashes):
            self._held[request.batch_id] = (hashes[done:], phys[done:], times[done:])
        else:
            del self._held[request.batch_id]
        return IndexAppended(
            request.batch_id,
            done,
            len(hashes) - done,
            int(times[done]) if done < len(hashes) else 0,
            int(times[done - 1]) if done else 0,
        )

    def forget_index_files(self) -> None:
        for index in self._index_files.values():
            index.close()
        self._index_files.clear()

    def _index_file(self, path: str, hash_slots: int, max_entries: int) -> IndexFile:
        index = self._index_files.get(path)
        if index is None:
            while len(self._index_files) >= 2:  # the newest files only: older ones are full
                self._index_files.pop(next(iter(self._index_files))).close()
            index = self._index_files[path] = IndexFile(path, hash_slots or None, max_entries or None, create=False)
        return index

    def _owners_of(self, names: list[str], topic_ids: np.ndarray, queue_ids: np.ndarray) -> np.ndarray:
        """`owner_of` for each queue (`names[topic_ids[i]]`, `queue_ids[i]`).  The batch's topic
        names are hashed each time, not cached: a cache would grow with the topics (a light queue
        to each topic makes millions)."""
        topic_crcs = np.array([zlib.crc32(name.encode()) for name in names], dtype=np.int64)
        sums = topic_crcs[topic_ids] + (queue_ids.astype(np.int64) & 0xFFFFFFFF)  # never negative
        owners = self.owners
        # for a power of two (2 workers on 2 cores) the low bits are the remainder, and a mask
        # is cheaper than an int64 division
        return sums & (owners - 1) if owners & (owners - 1) == 0 else sums % owners

    def _write_units(self, columns, batch_id: int) -> tuple[QueueRuns, list[tuple[int, bytes]]]:
        """Write the queue entries of `columns`, each at its slot: its own queues' and the runs of
        the others' (see the module docstring; every queue when the batch names `direct_queues`
        at most); returns, per queue (owned or not), the slots of the batch, and the units handed
        over to each other owner."""
        rows = queue_rows(columns)
        if not len(rows):
            return QueueRuns.empty(), []
        rows, starts, stops, slots, units = group_by_queue(columns, rows)
        # a group is one contiguous run when no slot inside it breaks the +1 sequence
        breaks = np.zeros(len(rows), dtype=np.int64)
        breaks[1:] = np.cumsum(slots[1:] != slots[:-1] + 1)
        contiguous = breaks[stops - 1] == breaks[starts]
        names = columns.topic_names
        group_topic_ids = columns.topic_ids[rows[starts]]
        group_queue_ids = columns.queue_ids[rows[starts]]
        firsts = slots[starts]
        runs = QueueRuns(names, group_topic_ids, group_queue_ids, firsts, stops - starts, {})
        for group in np.flatnonzero(~contiguous).tolist():
            count, extra = _first_run(slots[starts[group] : stops[group]].tolist())
            assert extra is not None  # the group's slots are not one run
            runs.counts[group] = count
            runs.extras[group] = extra
        handovers = []
        unit_bytes = memoryview(units.tobytes())

        def write(groups: np.ndarray, open_file) -> list[int]:  # `_write_groups` of these groups, rotated
            return self._write_groups(
                names,
                self._rotated(groups),
                group_topic_ids,
                group_queue_ids,
                firsts,
                starts,
                stops,
                contiguous,
                slots,
                units,
                unit_bytes,
                open_file,
            )

        if self.owners > 1 and len(starts) > self.direct_queues:
            group_owners = self._owners_of(names, group_topic_ids, group_queue_ids)
            mine = group_owners == self.owner
            # its own queues first, then the runs of the other workers' queues, into their files
            # (made here if their owners have not made them yet, while under half the budget):
            # two workers meeting the same new queues each make its own share first, and then
            # mostly find the other's made; the rest (and every queue whose slots are not one
            # run) is handed over
            write(np.flatnonzero(mine), self._queue_file)
            # past half its budget, only into the files it has mapped already, without asking
            # `_other_queue_file` for each other queue (one Python call per queue and batch)
            open_other = self._other_queue_file if self._maps_other_files() else None
            unwritten = write(np.flatnonzero(~mine & contiguous), open_other)
            handed = ~mine & ~contiguous  # (a new array)
            handed[unwritten] = True
            for owner in range(self.owners):
                picked = handed & (group_owners == owner)
                if owner == self.owner or not picked.any():
                    continue
                picked_rows = np.repeat(picked, stops - starts)
                picked = np.flatnonzero(picked)
                handover = UnitsHandover(
                    batch_id,
                    names,
                    group_topic_ids[picked],
                    group_queue_ids[picked],
                    firsts[picked],
                    (stops - starts)[picked],
                    None if contiguous[picked].all() else slots[picked_rows],
                    units[picked_rows].tobytes(),
                )
                handovers.append((owner, pickle.dumps(handover, protocol=pickle.HIGHEST_PROTOCOL)))
        else:  # every queue is this builder's
            write(np.arange(len(starts)), self._queue_file)
        return runs, handovers

    def _write_groups(
        self,
        names: list[str],
        order: np.ndarray,
        topic_ids: np.ndarray,
        queue_ids: np.ndarray,
        firsts: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        whole: np.ndarray,
        slots: np.ndarray | None,
        units: np.ndarray,
        unit_bytes: memoryview,
        open_file,
    ) -> list[int]:
        """Write queues' units: for each group i of `order`, in that order, the queue
        (names[topic_ids[i]], queue_ids[i]) gets units[starts[i]:stops[i]]; a `whole` group's go to
        the slots from firsts[i] on, one copy per queue file (by `_dispatch.write_runs` where it is
        built), the others' one at a time to the slots slots[starts[i]:stops[i]] name.  A file not
        mapped yet is mapped by `open_file` (`_queue_file` makes it if need be); if that gives None,
        or `open_file` is None, the rest of the group is left unwritten.  Returns the groups left
        so."""
        unwritten: list[int] = []
        counted = self.faults is not None and self.faults.after_units  # every unit one at a time
        if _write_runs is not None and not counted:
            runs = order[whole[order]]
            if len(runs):
                table = np.empty((len(runs), 5), np.int64)
                for column, values in enumerate((topic_ids, queue_ids, firsts, starts, stops)):
                    table[:, column] = values[runs]
                skipped = _write_runs(
                    self._files,
                    names,
                    self._units_per_file,
                    self.default_units_per_file,
                    table,
                    unit_bytes,
                    open_file,
                    self._run_cache,
                )
                unwritten = runs[skipped].tolist() if skipped else []
            order = order[~whole[order]]
        files = self._files
        upf_of = self._units_per_file
        default_upf = self.default_units_per_file
        for group, start, stop, first, run, tid, queue_id in zip(
            order.tolist(),
            starts[order].tolist(),
            stops[order].tolist(),
            firsts[order].tolist(),
            whole[order].tolist(),
            topic_ids[order].tolist(),
            queue_ids[order].tolist(),
        ):
            topic = names[tid]
            upf = upf_of.get((topic, queue_id), default_upf)
            if counted or not run:
                group_slots = (
                    slots[start:stop].tolist() if slots is not None else list(range(first, first + stop - start))
                )
                self._write_slots(topic, queue_id, upf, group_slots, units[start:stop].tolist())
                continue
            done = start
            while done < stop:  # one copy per queue file the run spans
                slot = first + done - start
                file_start = slot - slot % upf
                qmm = files.get((topic, queue_id, file_start))
                if qmm is None:
                    qmm = open_file(topic, queue_id, file_start, upf) if open_file is not None else None
                    if qmm is None:
                        unwritten.append(group)
                        break
                n = min(stop - done, file_start + upf - slot)
                pos = (slot - file_start) * UNIT_SIZE
                back_with_blocks(qmm, pos, n * UNIT_SIZE)  # raises on a full disk, having written nothing
                qmm[pos : pos + n * UNIT_SIZE] = unit_bytes[done * UNIT_SIZE : (done + n) * UNIT_SIZE]
                done += n
        return unwritten

    def _exit_if_orphaned(self) -> None:
        """A worker whose coordinator died stops before it writes anything: the store is gone,
        and a reopened one may be recovering the queues and the index."""
        if self.coordinator_pid and os.getppid() != self.coordinator_pid:
            os._exit(0)

    def write_handover(self, handover: UnitsHandover) -> None:
        """Write the units another builder handed over (of queues this one owns)."""
        self._exit_if_orphaned()
        units = np.frombuffer(handover.units, dtype=UNIT_DTYPE)
        stops = np.cumsum(handover.counts)
        starts = stops - handover.counts
        whole = np.full(len(starts), handover.slots is None)
        order = np.arange(len(starts))
        dies = self.faults is not None and self.faults.handover_coming()
        if dies:
            order = order[: len(order) // 2 + 1]
        else:
            order = self._rotated(order)
        self._write_groups(
            handover.topic_names,
            order,
            handover.topic_ids,
            handover.queue_ids,
            handover.firsts,
            starts,
            stops,
            whole,
            handover.slots,
            units,
            memoryview(handover.units),
            self._queue_file,
        )
        if dies:
            WorkerFaults.die()

    def _rotated(self, order: np.ndarray) -> np.ndarray:
        """The groups `order` lists (by topic, then queue id) started `owner / owners` of the way
        through and wrapped round: workers meeting new queues of the same topics at the same time
        create them in different topics' directories (creating a queue's directory holds its topic
        directory's lock: two workers creating in one topic wait for each other)."""
        turn = len(order) * self.owner // self.owners
        return np.concatenate((order[turn:], order[:turn])) if turn else order

    def _write_slots(
        self, topic: str, queue_id: int, upf: int, slots: list[int], units: list[tuple[int, int, int]]
    ) -> None:
        """One unit at a time, for a queue whose slots in the batch are not one contiguous run
        (or a small batch): `units` are (commit-log offset, size, tags code)."""
        files = self._files
        unit_pack = UNIT.pack_into
        faults = self.faults if self.faults is not None and self.faults.after_units else None
        for slot, unit in zip(slots, units):
            file_start = slot - slot % upf
            qmm = files.get((topic, queue_id, file_start))
            if qmm is None:
                qmm = self._queue_file(topic, queue_id, file_start, upf)
            back_with_blocks(qmm, (slot - file_start) * UNIT_SIZE, UNIT_SIZE)  # raises on a full disk
            unit_pack(qmm, (slot - file_start) * UNIT_SIZE, *unit)
            if faults is not None:
                faults.unit_written()

    def close_queue_files(self) -> None:
        if self._run_cache is not None:
            self._run_cache.clear()
        for mm in self._files.values():
            mm.close()
        self._files.clear()

    def close(self) -> None:
        self.close_queue_files()
        for mm in self._segments.values():
            mm.close()
        self._segments.clear()
        for index in self._index_files.values():
            index.close()
        self._index_files.clear()
        self._held.clear()


class ThreadBuilder(BatchBuilder):
    """The dispatch thread's `BatchBuilder`.  It writes a queue the store already has through
    that queue's own mapping of the file (`ConsumeQueue.mapping_of`, counted in
    `consume_queue.MAPPINGS`), and maps only new queues' files itself.  So with more queues
    than the builder's own small budget of mappings (`open_files.INLINE_BUILDER_SHARE`),
    building on this thread alone (`dispatch_workers = 0`) does not map every file again in
    every batch.  Only the dispatch thread touches the `ConsumeQueue` objects
    (retention, on another thread, drops only files below the frontiers, under the queue's
    lock), and it is the thread that builds.

    The queues' mappings it is given are kept in `_files`, and so in the compiled loop's cache,
    while `MAPPINGS` is under its budget, so that a run does not ask its queue again (a Python
    call per run and batch).  A kept mapping that `MAPPINGS` drops
    (past its budget, or closed) stays mapped while it is kept (writes through it still reach
    the file), so the builder lets every kept one go when it sees `MAPPINGS.dropped` move (at
    the next batch, or the next file it asks for), and keeps none while `MAPPINGS` is full:
    the process holds no more mappings than the two budgets.  It never closes them: they are
    the queues'."""

    def __init__(self, queues: ConsumeQueueStore, index_enabled: bool) -> None:
        super().__init__(str(queues.root), queues.units_per_file, index_enabled, queues.file_sizes())
        self._store_queues = queues.queues
        self._borrowed: set[tuple[str, int, int]] = set()  # keys of `_files` holding the queues' mappings
        self._dropped = MAPPINGS.dropped

    def _own_mappings(self) -> int:
        return len(self._files) - len(self._borrowed)

    def build(self, task: BatchTask) -> BatchResult:
        self._let_borrowed_go(if_dropped=True)
        return super().build(task)

    def _queue_file(self, topic: str, queue_id: int, file_start: int, upf: int) -> QueueFileMap:
        cq = self._store_queues.get((topic, queue_id))
        if cq is not None:
            mm = cq.mapping_of(file_start)
            if mm is not None:
                self._let_borrowed_go(if_dropped=True)
                if not MAPPINGS.full:
                    key = (topic, queue_id, file_start)
                    self._files[key] = mm
                    self._borrowed.add(key)
                return mm
        return super()._queue_file(topic, queue_id, file_start, upf)

    def _let_borrowed_go(self, if_dropped: bool = False) -> None:
        """Forget the queues' mappings kept (the compiled loop's cache first: it holds their
        buffers); `if_dropped`: only if `MAPPINGS` dropped or closed one since it last looked."""
        if if_dropped and MAPPINGS.dropped == self._dropped:
            return
        self._dropped = MAPPINGS.dropped
        if not self._borrowed:
            return
        if self._run_cache is not None:
            self._run_cache.clear()
        for key in self._borrowed:
            del self._files[key]
        self._borrowed.clear()

    def close_queue_files(self) -> None:
        """Close the mappings this builder made; keep the queues' (they stay valid)."""
        kept = {key: self._files.pop(key) for key in self._borrowed}
        super().close_queue_files()
        self._files.update(kept)

    def close(self) -> None:
        self._let_borrowed_go()
        super().close()
