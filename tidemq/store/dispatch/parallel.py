"""Parallel, order-preserving dispatch (RIP-52) with worker processes.

CPython threads would serialise on the GIL, so the work runs in **worker processes** that share
the store's files through their own mappings:

- The coordinator (the store's dispatch thread) cuts **batches** of about `batch_bytes`,
  numbered in log order, without walking every record: a batch starts at a known record boundary
  (its first header checked: a whole record, or the blank that closes the segment) and ends at
  the first record header past the target size that names its own position (magic code and
  PHYSICALOFFSET), or at the limit.  Such a header is only a candidate boundary (a body could
  hold those bytes); the worker's walk over the batch confirms it (`batch_cut`).
- **Workers** (`batch_builder.BatchBuilder`; its docstring has the details): worker k of N owns
  the queues `batch_builder.owner_of` gives k (a replacement owns the same) and alone makes their
  files.  A worker maps the batch's segment read-only, decodes it with the columnar decoder
  (`scan`), and writes the ConsumeQueue units **at their slots** (queue offsets were assigned at
  append time) through its own mappings of the queue files, one copy per queue's run of slots
  (`_dispatch.write_runs`): of its own queues, of another worker's queues whose files are made,
  and of every queue of a batch naming few (`batch_builder.DIRECT_QUEUES`); the other workers'
  units it did not write it packs, per owner, into a `UnitsHandover`.  It computes the key-index
  entries (hash of `topic#key`, commit-log offset, store time) and keeps them.  It answers with,
  per queue of the batch, the batch's slots, how many index entries it holds, where its walk
  ended (past the blank if one closes the segment), and the handovers, pickled.
- The coordinator forwards each handover, unopened, to its owner, who writes the units and
  answers `UnitsWritten`; a batch's answer is complete when every owner it handed units to has
  written them (`handovers`).
- Complete answers arrive in any order; the coordinator processes them strictly in batch order.
  When a batch becomes the head, the worker building it (or holding its entries) is asked to
  append its index entries to the newest index file, and nothing else is appended until it
  answers (`index_appends`: one append at a time, in log order).  Then a batch whose walk ended
  exactly at its cut is committed: each queue's run of slots starts at that queue's commit
  frontier (`ConsumeQueue.commit_range`), so readers and long-polling listeners (told only of
  frontier moves) never see a gap or a reordering; a queue seen for the first time is started
  there (`ConsumeQueue.adopted_many` or `adopt_files`), its first slot now known.  Then
  `dispatched_offset` advances: it is the end of the longest prefix of completely built (units,
  handed-over units and index entries) batches, which is what the checkpoint records and what
  recovery restarts from.  A walk that ended short (a damaged record, data not readable yet, or a
  cut inside a record) stops there: later batches are dropped uncommitted and cut again from
  there.

Small backlogs (under `inline_bytes`, nothing in flight) are built in the coordinator itself with
the same `BatchBuilder`, owning every queue, so an idle store starts no process and a trickle pays
no IPC; with 0 workers (the store's `dispatch_workers = 0`) every batch is, one `batch_bytes` batch
at a time.  That builder writes the queues the store already has through their `ConsumeQueue`
mappings (`batch_builder.ThreadBuilder`).  Workers start on first need (fresh interpreters,
`python -P -m tidemq.store.dispatch.worker_entry`: the threaded store process is never forked) and are
replaced if one dies: its replacement (same number, same queues) is sent the units handed over to
it and not yet written, then its unanswered batches, which are built again (rewriting the same
bytes); so are the batches whose index entries it held (only the first answer's handovers of a
batch are forwarded: a second build hands over the same units); if it died while appending, the
index is first cut back to the batch's first record (`index_appends`).  When workers die too
often, the coordinator builds every batch itself and writes the units handed over to a worker it
gave up.  A worker whose coordinator died stops before writing a batch, handed-over units, or to
the index.

Batches are backlog / (4 × workers), between `MIN_BATCH_BYTES` (1 MiB: a batch's fixed costs stay
small beside its records) and `batch_bytes`, with up to 3 × workers sent and not answered, so that
one slow batch does not leave the other workers idle, and up to 8 × workers not committed, so that
batches built while the head waits for its index append do not leave the workers without work.
Both pipes of a worker hold 1 MB; the coordinator's sends block, a worker's never do without
reading what comes in (see dispatch_messages), so the two never wait for each other for ever.  The
coordinator keeps its workers in a `worker_process.WorkerPool` and waits for answers on its one
`select.poll`, in which every worker's answer pipe is registered once (a replacement's when it
starts, a dead worker's taken out before its pipes close), and takes in every answer a pipe holds
with one read (`dispatch_messages.Channel`); the messages are pickled as their fields, arrays as
bytes.

Crashes: the checkpoint's confirm offset is `dispatched_offset`, so after an abnormal exit recovery
(which redispatches with this dispatcher too) restarts at or below the oldest unfinished batch even
when later batches are written: the queues' furthest entry, `ConsumeQueueStore.covered_offset`, is
only trusted after a clean shutdown, when every batch is finished.  Units written past a queue's
first unwritten slot are zeroed when the queue is loaded, so they are never taken for entries.

Ownership: one coordinator thread calls `dispatch_until`; each worker writes the slots of the
queues it owns, of other queues whose files are made, and of every queue of a batch naming few
queues it builds (and the coordinator's inline builder any slot), disjoint 20-byte slots in any
case, and creates queue files with O_CREAT + ftruncate to the common size (idempotent); only the
coordinator touches `ConsumeQueue` objects, the `KeyIndex` (its file list) and the listeners; the
one worker it asked writes into the newest index file's mapping while the coordinator waits for
it.  Open files: a worker maps the files of its share of the queues, of other queues while its
mappings are under half its budget, and of the few queues of the batches it writes whole, within
its budget (`open_files.mapping_budget`); the coordinator's mappings are `consume_queue.MAPPINGS`
and its inline builder's.  Units a worker wrote for a batch that is
dropped lie above the frontiers and are overwritten when the batch is built again.
"""

from __future__ import annotations

import errno
import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import StoreIOError
from ..format import record
from ..format.scan import scan
from ..log.commit_log import CommitLog
from ..queues.queue_set import ConsumeQueueStore
from . import trickle
from .batch_cut import batch_end
from .builder import NO_SPACE, NO_SPACE_ERRNOS, BatchBuilder, ThreadBuilder
from .commit import QueueCommitter
from .handovers import Handovers
from .index_appends import APPENDED, FAILED, IndexAppends
from .messages import BatchResult, BatchTask, IndexAppend, IndexAppended, QueueRuns, UnitsWritten
from .requests import ArrivalListener, DispatchBatch, QueueKey, dispatch_to, notify_listeners
from .sequential import DispatchStats, reads_keys
from .workers import WorkerPool, WorkerProcess

log = logging.getLogger(__name__)

# 4 times RocketMQ's BATCH_SIZE: a batch's costs per queue it names (a run to commit, a file to
# look up and copy into, units handed over) and the coordinator's per batch (waking up, taking
# an answer, committing, sending the next task and the append request, on the workers' cores)
# are spread over 4 times the records; a larger batch's handovers outgrow the pipes
# (workers.RESULT_PIPE_BYTES).
DEFAULT_BATCH_BYTES = 16 << 20
DEFAULT_INLINE_BYTES = 64 << 10
# a batch's fixed costs (its messages, the head's index-append round trip, a worker's setup)
# outweigh the work on its records below this size, so the tail of a large backlog is not cut
# into smaller batches
MIN_BATCH_BYTES = 1 << 20
BATCHES_PER_WORKER = 4  # a backlog is cut in batches of backlog / (this x workers)
UNBUILT_PER_WORKER = 3  # batches sent to workers and not answered yet, per worker
# batches cut and not committed yet, per worker: built ones wait at the head for the index
# appends before them (one at a time, each when its worker reaches a point where it reads), so
# more are cut than are unbuilt, or the workers wait for want of a batch
OUTSTANDING_PER_WORKER = 8
MAX_WORKER_DEATHS_IN_A_ROW = 4


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
    batches with `workers` processes, or with none (0) on the calling thread alone, through the
    same compiled builder."""

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
        if workers < 0:
            raise ValueError(f"dispatch workers must be 0 (the dispatch thread alone) or more, not {workers}")
        self.commit_log = commit_log
        self.queues = queues
        self.key_index = key_index
        self.sinks = [queues] + ([key_index] if key_index is not None else [])
        self.extra_sinks: list = []  # other sinks get DispatchRequests in log order (decoded here)
        self._extra_keys = False  # whether one of them reads the key index's keys (`reads_keys`)
        self.worker_count = workers
        self.batch_bytes = batch_bytes
        self.inline_bytes = inline_bytes
        self.dispatched_offset = start_offset
        self._last_records: tuple[int, int] | None = None  # [begin, end) of the newest run holding records
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
        self._handovers = Handovers(self._forward)
        self._appends = IndexAppends(key_index, commit_log, self._send_append)
        self._committer = QueueCommitter(queues)
        self._blank_ends: dict[int, int] = {}  # batch id -> segment end, for an empty batch at a blank
        self._stalled = False
        self._no_space: str | None = None  # why the stall: the disk is full (raised by dispatch_until)
        self._waits_at = -1  # where a batch last waited for disk space
        self._pool = WorkerPool(
            workers, str(queues.root), queues.units_per_file, queues.file_sizes, key_index is not None
        )
        self._builder: BatchBuilder | None = None
        self.inline_batches = 0
        self.trickles = 0  # rounds of a few records dispatched without a batch (`trickle`)
        self.worker_batches = 0
        self.handovers_forwarded = 0  # units handed over by one worker, forwarded to their owner
        self.workers_restarted = 0
        self._deaths_in_a_row = 0  # worker deaths since a worker last answered
        # no workers (none asked for, or they died too often): every batch is built on this thread
        self._inline_only = workers == 0
        self._closed = False

    # -- the public face of Dispatcher ---------------------------------------------------------

    def add_sink(self, sink) -> None:
        self.extra_sinks.append(sink)
        self._extra_keys = reads_keys(self.extra_sinks)
        self.sinks.append(sink)
        self.progress[sink.name] = SinkProgress(self.dispatched_offset)

    def dispatch_until(self, limit: int, notify: bool = True) -> int:
        """Dispatch every record wholly below `limit` (and below what `limit_source` says when
        set); returns how many records were dispatched in order."""
        total = 0
        while True:
            if self.limit_source is not None:
                limit = max(limit, self.limit_source())
            if not self._tasks and limit - self._cut_offset <= trickle.MAX_BYTES:
                before = self._cut_offset
                changes: dict[QueueKey, int] = {}
                total += self._trickle(limit, changes)
                if notify and changes:
                    notify_listeners(self.listeners, changes)
                if self._cut_offset != before:
                    continue
            self._fill(limit)
            if not self._tasks:
                return total
            changes = {}
            for result in self._collect():
                total += self._complete(result, changes)
            if notify and changes:
                notify_listeners(self.listeners, changes)
            if self._stalled:
                self._stalled = False
                if self._no_space is not None:  # the store's dispatch loop says so once and waits
                    error, self._no_space = self._no_space, None
                    raise StoreIOError(errno.ENOSPC, f"dispatch waits at commit-log offset {self._cut_offset}: {error}")
                return total

    def _trickle(self, limit: int, changes: dict[QueueKey, int]) -> int:
        """With nothing in flight, dispatch the few records from the cut offset on this thread
        (`trickle`); returns how many.  When it moved nothing, the batch path takes what is
        there."""
        begin = self._cut_offset
        if begin >= limit or begin < self.commit_log.min_offset:
            return 0
        segment = self.commit_log.segment_for(begin)
        if segment is None:
            return 0
        end, records, last_timestamp = trickle.dispatch_trickle(
            segment.mm, segment.start, begin, min(limit, segment.end), self._committer.queue_at, self.key_index, changes
        )
        if end == begin:
            return 0
        self.trickles += 1
        self._cut_offset = end
        self._dispatched(begin, end, records, last_timestamp, changes)
        return records

    def last_record_offset(self) -> int | None:
        """The commit-log offset of the newest record dispatched since the start, or None: the
        checkpoint's logicsPhysicalOffset.  Called from another thread: reads one tuple."""
        run = self._last_records
        if run is None:
            return None
        begin, end = run
        segment = self.commit_log.segment_for(begin)
        if segment is None:
            return None
        columns = scan(segment.mm, begin - segment.start, end - segment.start, base_offset=segment.start)
        return int(columns.offsets[-1]) if len(columns) else None

    def _dispatched(
        self, begin: int, end: int, records: int, last_timestamp: int, changes: dict[QueueKey, int]
    ) -> None:
        """[begin, end) of the log is built into the queues and the key index (`records`
        records, the last stored at `last_timestamp`): tell the other sinks, move the
        dispatched offset and the statistics."""
        if self.extra_sinks and end > begin:
            batch = None
            for sink in self.extra_sinks:
                dispatch_range = getattr(sink, "dispatch_range", None)
                if dispatch_range is not None:  # a sink that reads the range itself, if it needs to
                    dispatch_range(self.commit_log, begin, end, changes)
                    continue
                if batch is None:
                    batch = _read_batch(self.commit_log, begin, end, self._extra_keys)
                dispatch_to(sink, batch, changes)
        if records:
            self._last_records = (begin, end)
            self.stats.records += records
            self.stats.last_store_timestamp = self.queues.logics_msg_timestamp = last_timestamp
            for progress in self.progress.values():
                progress.last_store_timestamp = last_timestamp
        self.stats.bytes += end - begin
        self.dispatched_offset = end
        for progress in self.progress.values():
            progress.offset = end

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
        if record.closes_segment(mm, pos, segment.size):
            # an empty batch moves the dispatched offset past the blank
            task = BatchTask(self._next_id, str(segment.path), base, segment.size, offset, offset)
            self._next_id += 1
            self._blank_ends[task.batch_id] = seg_end
            self._cut_offset = seg_end
            return task
        end = batch_end(mm, base, pos, hard_stop, size)
        if end is None:
            return None  # not written yet, or damage the sequential walk reports; never skip past it
        task = BatchTask(self._next_id, str(segment.path), base, segment.size, offset, base + end)
        self._next_id += 1
        self._cut_offset = base + end
        return task

    def _fill(self, limit: int) -> None:
        inline = self._inline_only
        # on this thread alone, one whole batch at a time (no worker to keep busy, fewer files to
        # look up): each is committed, and its listeners told, as soon as it is built
        max_outstanding = 1 if inline else OUTSTANDING_PER_WORKER * self.worker_count
        max_unbuilt = UNBUILT_PER_WORKER * max(self.worker_count, 1)
        while len(self._tasks) < max_outstanding and self._cut_offset < limit and self._pool.unbuilt() < max_unbuilt:
            backlog = limit - self._cut_offset
            # several batches per worker, so that one slow batch does not idle the others
            size = (
                self.batch_bytes
                if inline
                else min(
                    self.batch_bytes,
                    max(self.inline_bytes, MIN_BATCH_BYTES, backlog // (BATCHES_PER_WORKER * self.worker_count)),
                )
            )
            task = self._cut(limit, size)
            if task is None:
                break
            self._tasks[task.batch_id] = task
            if task.end == task.begin:
                self._done[task.batch_id] = self._empty_result(task)
            elif inline or (backlog <= self.inline_bytes and len(self._tasks) == 1):
                self._done[task.batch_id] = self._build_inline(task)
            else:
                self._submit(task)

    def _empty_result(self, task: BatchTask) -> BatchResult:
        return BatchResult(
            task.batch_id,
            task.begin,
            self._blank_ends.pop(task.batch_id, task.end),
            None,
            0,
            0,
            QueueRuns.empty(),
            np.zeros(0, np.int32),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
        )

    def _inline_builder(self) -> BatchBuilder:
        """The dispatch thread's builder: it owns every queue (no units handed over)."""
        if self._builder is None:
            self._builder = ThreadBuilder(self.queues, self.key_index is not None)
        return self._builder

    def _build_inline(self, task: BatchTask) -> BatchResult:
        self.inline_batches += 1
        return self._inline_builder().build(task)

    # -- workers -------------------------------------------------------------------------------------

    def start_workers(self) -> None:
        """Start the worker processes now rather than on the first large backlog."""
        if not self._inline_only and self._pool.start():
            log.info("dispatch: started %d worker processes", self.worker_count)

    def wait_ready(self) -> None:
        """Start the workers and wait until each has answered once (benchmarks: keep the
        interpreter start out of the timing)."""
        self.start_workers()
        self._pool.wait_ready()

    def _submit(self, task: BatchTask) -> None:
        self.start_workers()
        worker = self._pool.least_busy()
        worker.tasks[task.batch_id] = task
        self.worker_batches += 1
        try:
            worker.conn.send(task)
        except (OSError, EOFError):
            pass  # a dead worker is noticed and replaced by _collect

    def worker_pids(self) -> list[int]:
        return self._pool.pids()

    @property
    def worker_appends(self) -> int:
        """Index appends done by workers (IndexAppended answers)."""
        return self._appends.count

    def _collect(self) -> list[BatchResult]:
        """Answers that are ready (waiting for at least one if none is)."""
        results = [self._done.pop(i) for i in sorted(self._done)]
        if results:
            return results
        # one append at a time: the head's
        if not self._pool.owes_answers(self._appends.waited_on()):
            return results
        # every worker's pipe is registered (`WorkerPool.ready`): one that is not busy has nothing
        # to say, or says it died, or answers for a batch since dropped (ignored below)
        for worker in self._pool.ready():
            if not self._pool.watching(worker):
                continue  # replaced meanwhile
            try:
                messages = worker.conn.take()
            except (EOFError, OSError):  # the pipe closed: the worker died
                worker.process.wait()
                self._replace(worker)
                continue
            if messages:
                self._deaths_in_a_row = 0
            for result in messages:
                kind = type(result)
                if kind is IndexAppended:
                    results.append(result)
                elif kind is UnitsWritten:
                    payload = worker.handovers.pop(result.batch_id, None)
                    if payload is not None:
                        if result.error is not None and result.error.startswith(NO_SPACE):
                            self._wait_for_space(self.dispatched_offset, result.error)
                            return results
                        if result.error is not None:
                            log.error(
                                "dispatch worker %s could not write the units handed over by batch %d: %s; "
                                "writing them on the dispatch thread",
                                worker.pid,
                                result.batch_id,
                                result.error,
                            )
                            if not self._write_handover_here(payload):
                                return results
                        built = self._handovers.written(result.batch_id, worker.number)
                        if built is not None:
                            results.append(built)
                elif worker.tasks.pop(result.batch_id, None) is not None:
                    self._appends.held(result, worker)
                    if self._handovers.hand_over(result):
                        results.append(result)
        return results

    # -- units handed over between workers -------------------------------------------------------

    def _forward(self, owner: int, batch_id: int, payload: bytes) -> bool:
        """Send units handed over to worker `owner`; True if it was sent (its answer is awaited),
        False if they were written here (that worker is gone: workers have given way)."""
        worker = self._pool.numbered(owner)
        if worker is None:
            self._write_handover_here(payload)  # (on a full disk every batch is dropped, to be cut again)
            return False
        worker.handovers[batch_id] = payload
        self.handovers_forwarded += 1
        try:
            worker.conn.send_bytes(payload)
        except (OSError, EOFError):
            pass  # a dead worker is noticed and replaced by _collect, which sends them again
        return True

    def _write_handover_here(self, payload: bytes) -> bool:
        """Write units handed over on this thread; False if the disk had no room for them: then
        every outstanding batch is dropped, and dispatch waits for space (`_wait_for_space`)."""
        try:
            self._inline_builder().write_handover(pickle.loads(payload))
        except OSError as exc:
            if exc.errno not in NO_SPACE_ERRNOS:
                raise
            self._wait_for_space(self.dispatched_offset, f"{NO_SPACE}: {exc.strerror or exc}")
            return False
        return True

    def _replace(self, dead: WorkerProcess) -> None:
        self._pool.retire(dead)
        self._deaths_in_a_row += 1
        # the batches whose index entries died with it are built again, with its unanswered ones
        for batch_id in self._appends.died(dead, self._tasks):
            self._answers.pop(batch_id, None)
            self._handovers.rebuilding(batch_id)
            dead.tasks[batch_id] = self._tasks[batch_id]
        if self._deaths_in_a_row >= MAX_WORKER_DEATHS_IN_A_ROW:
            # workers that cannot finish a batch (a broken install, no memory): stop starting
            # them, and build on this thread, slower but without losing or reordering anything
            if not self._inline_only:
                log.error(
                    "dispatch workers died %d times in a row without answering (last: pid %s, exit code %s); "
                    "building the indexes on the dispatch thread from now on",
                    self._deaths_in_a_row,
                    dead.pid,
                    dead.process.returncode,
                )
            self._inline_only = True
            self._pool.remove(dead)
            for batch_id, payload in sorted(dead.handovers.items()):
                if not self._write_handover_here(payload):
                    return
                built = self._handovers.written(batch_id, dead.number)
                if built is not None:
                    self._done[batch_id] = built
            for batch_id, task in sorted(dead.tasks.items()):
                self._done[batch_id] = self._build_inline(task)
            return
        log.warning(
            "dispatch worker %s died (exit code %s); rebuilding its %d batch(es) in a new one",
            dead.pid,
            dead.process.returncode,
            len(dead.tasks),
        )
        replacement = self._pool.replace(dead)
        self.workers_restarted += 1
        # the units handed over to it and not yet written first: the head may be waiting for them
        for batch_id, payload in sorted(dead.handovers.items()):
            replacement.handovers[batch_id] = payload
            replacement.conn.send_bytes(payload)
        for batch_id, task in sorted(dead.tasks.items()):
            replacement.tasks[batch_id] = task
            replacement.conn.send(task)

    # -- completing batches ----------------------------------------------------------------------------

    def _complete(self, result: BatchResult | IndexAppended, changes: dict[QueueKey, int]) -> int:
        """Keep a batch's answer (they come in any order), or take a worker's index append
        answer; then process every batch now at the head, in order."""
        appends = self._appends
        if type(result) is IndexAppended:
            if result.batch_id != appends.appending:
                return 0  # for a batch since dropped or built again
            task = self._tasks[result.batch_id]
            outcome = appends.answered(result, task.begin)
            # the disk had no room for the entries, or for the batch itself (the worker answered
            # it built nothing as it was asked to append): wait for space, and build it again
            built = self._answers.get(result.batch_id)
            no_space = [e for e in (result.error, built and built.error) if e and e.startswith(NO_SPACE)]
            if outcome == FAILED and no_space:
                self._wait_for_space(task.begin, no_space[0])
                return 0
            if outcome == FAILED:
                # build and append it on this thread (the worker's answer, should it come, is
                # ignored: it no longer holds entries)
                log.error(
                    "dispatch worker could not append the index entries of commit-log offsets [%d, %d): %s; "
                    "building them on the dispatch thread",
                    task.begin,
                    task.end,
                    result.error,
                )
                self._answers[result.batch_id] = self._build_inline(task)
            elif outcome != APPENDED:
                return 0
        elif result.batch_id not in self._tasks:
            return 0  # from a generation that was discarded
        elif appends.lost(result):
            return 0  # its worker died after answering: the batch is being built again
        else:
            self._answers[result.batch_id] = result
        total = 0
        while appends.appending is None and self._head_id in self._answers:
            head = self._answers[self._head_id]
            if appends.owed(head):
                # its worker appends its index entries first; the head waits for the answer
                appends.start(head.batch_id)
                break
            total += self._advance(self._answers.pop(self._head_id), changes)
        if appends.appending is None and self.key_index is not None and self._head_id in self._tasks:
            # the head is not built yet: its worker is asked now, and appends as soon as it has
            # built it, instead of when its answer has come here and the request gone back (by
            # then it is in the middle of its next batch, and the chain of appends, one batch
            # at a time, fell behind 2 workers' builds)
            builder = self._pool.building(self._head_id)
            if builder is not None:
                appends.start(self._head_id, builder)
        return total

    def _send_append(self, worker: WorkerProcess, request: IndexAppend) -> None:
        try:
            worker.conn.send(request)
        except (OSError, EOFError):
            pass  # a dead worker is noticed and replaced by _collect

    def _advance(self, head: BatchResult, changes: dict[QueueKey, int]) -> int:
        """`head` is the oldest outstanding batch: append its index entries (as a worker appends
        them before its answer is processed), commit its slots (every earlier batch is committed,
        so each queue's run starts at its frontier, or starts the queue), move the dispatched
        offset."""
        task = self._tasks[head.batch_id]
        end = head.end
        if head.error is not None and head.error.startswith(NO_SPACE):
            self._wait_for_space(task.begin, head.error)
            return 0
        if self.key_index is not None and len(head.index_hashes):
            # before the queues are committed: on a full disk the batch is built again, whole
            try:
                self.key_index.append_entries(head.index_hashes, head.index_phys, head.index_timestamps, end)
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
                    self._wait_for_space(task.begin, f"{NO_SPACE}: {exc.strerror or exc}")
                    return 0
                self._discard_after(task.begin)  # built again, from its beginning, when dispatch is retried
                raise
        elif self.key_index is not None:
            self.key_index.indexed_until = max(self.key_index.indexed_until, end)
        del self._tasks[head.batch_id]
        self._handovers.processed(head.batch_id)
        self._appends.processed(head.batch_id)
        self._head_id += 1
        if len(head.queues):
            self._committer.commit(head.queues, changes, bool(self.listeners))
        self._dispatched(task.begin, end, head.records, head.last_store_timestamp, changes)
        if head.error is not None:
            log.error("dispatch stopped at commit-log offset %d: %s", end, head.error)
            self._discard_after(end)
        elif end != task.end:
            # the walk did not land on the batch's end: the rest of the log is not readable yet,
            # or the cut took bytes inside a record for a header; cut again from where it stopped
            self._discard_after(end)
        return head.records

    def _wait_for_space(self, begin: int, error: str) -> None:
        """The disk had no room for a batch from `begin` (the head): forget it and every later
        one, and stall there; `dispatch_until` raises StoreIOError (ENOSPC), and the next call
        cuts again from `begin`.  Units written meanwhile are written again, at the same slots."""
        if begin != self._waits_at:  # said once for each place it waits at
            log.warning("dispatch: the batch at commit-log offset %d waits for disk space (%s)", begin, error)
            self._waits_at = begin
        self._discard_after(begin)
        self._no_space = error

    def _discard_after(self, end: int) -> None:
        """Forget every later batch (written, but never committed) and cut again from `end`;
        dispatch stalls at a damaged record as the sequential dispatcher does."""
        for batch_id in list(self._tasks):
            self._tasks.pop(batch_id)
            self._blank_ends.pop(batch_id, None)
        self._answers.clear()
        self._done.clear()
        self._appends.clear()
        self._handovers.clear()
        self._pool.forget_batches()  # the workers' answers, when they come, are ignored
        self._head_id = self._next_id
        self._cut_offset = end
        self._stalled = True

    # -- lag and closing ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        if self._builder is not None:
            self._builder.close()
            self._builder = None


def _read_batch(commit_log: CommitLog, begin: int, end: int, keys: bool) -> DispatchBatch:
    """The records of [begin, end) (one built batch) for sinks the workers do not build (`keys`:
    one of them reads the key index's keys)."""
    segment = commit_log.segment_for(begin)
    if segment is None:
        return DispatchBatch(scan(b"", 0, 0, begin))
    return DispatchBatch(scan(segment.mm, begin - segment.start, end - segment.start, segment.start, keys=keys))
