"""Parallel, order-preserving dispatch (RIP-52) with worker processes: the I/O driver.

Every decision below (which batch goes where, when a batch is committed, what a dead worker's
replacement is sent, when dispatch stalls) is `coordinator.Coordinator`'s, which does no I/O:
`ParallelDispatcher` cuts the batches from the log, feeds the coordinator what happens (a batch
cut or built, a worker's answers, its death) and carries out the commands it returns (sends over
the pipes, builds on this thread, commits into the queues and the key index, starts processes).

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

Batches are backlog / (4 × workers), between `coordinator.MIN_BATCH_BYTES` (1 MiB: a batch's
fixed costs stay small beside its records) and `batch_bytes`, with up to 3 × workers sent and not answered, so that
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

from ..errors import StoreIOError
from ..format import record
from ..format.scan import scan
from ..log.commit_log import CommitLog
from ..queues.queue_set import ConsumeQueueStore
from . import trickle
from .batch_cut import batch_end
from .builder import NO_SPACE, NO_SPACE_ERRNOS, BatchBuilder, ThreadBuilder
from .commit import QueueCommitter
from .coordinator import (
    AppendProgress,
    AskAppend,
    BuildHere,
    Command,
    Commit,
    Coordinator,
    Forward,
    Respawn,
    Retire,
    Send,
    Stall,
    UndoIndex,
    WriteHere,
)
from .index_appends import append_request, undo
from .messages import BatchResult, BatchTask, IndexAppended, UnitsWritten
from .requests import ArrivalListener, DispatchBatch, QueueKey, dispatch_to, notify_listeners
from .sequential import DispatchStats, reads_keys
from .workers import WorkerPool

log = logging.getLogger(__name__)

# 4 times RocketMQ's BATCH_SIZE: a batch's costs per queue it names (a run to commit, a file to
# look up and copy into, units handed over) and the coordinator's per batch (waking up, taking
# an answer, committing, sending the next task and the append request, on the workers' cores)
# are spread over 4 times the records; a larger batch's handovers outgrow the pipes
# (workers.RESULT_PIPE_BYTES).
DEFAULT_BATCH_BYTES = 16 << 20
DEFAULT_INLINE_BYTES = 64 << 10


@dataclass(slots=True)
class SinkProgress:
    """How far one sink is built: everything below `offset` is indexed; the newest record
    indexed was stored at `last_store_timestamp`."""

    offset: int
    last_store_timestamp: int = 0


def commit_batch(
    committer: QueueCommitter, key_index, result: BatchResult, changes: dict[QueueKey, int], listeners: bool
) -> None:
    """Commit the head batch: append its index entries (`append_index_of`), then commit its
    queue runs (`changes`: the queues moved, the fast path's only when `listeners`)."""
    append_index_of(key_index, result)
    if len(result.queues):
        committer.commit(result.queues, changes, listeners)


def append_index_of(key_index, result: BatchResult) -> None:
    """Append the head batch's index entries (those no worker holds), or note the index built up
    to its end.  Before the queues are committed: on a full disk the batch is built again, whole."""
    if key_index is not None and len(result.index_hashes):
        key_index.append_entries(result.index_hashes, result.index_phys, result.index_timestamps, result.end)
    elif key_index is not None:
        key_index.indexed_until = max(key_index.indexed_until, result.end)


def no_space(exc: BaseException) -> str | None:
    """What a full disk's error says (`builder.NO_SPACE` first), or None for another error."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
        return f"{NO_SPACE}: {exc.strerror or exc}"
    return None


def apply_append_progress(key_index, progress: AppendProgress) -> None:
    """What a worker's index append says of the key index: its newest store time, and the next
    file to start when the newest is full."""
    if progress.last_timestamp:
        key_index.last_store_timestamp = progress.last_timestamp
    if progress.next_file_at is not None:
        key_index.start_file(progress.next_file_at)


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
        self.coordinator = Coordinator(
            workers, start_offset, batch_bytes=batch_bytes, inline_bytes=inline_bytes, index=key_index is not None
        )
        self.commit_log = commit_log
        self.queues = queues
        self.key_index = key_index
        self.sinks = [queues] + ([key_index] if key_index is not None else [])
        self.extra_sinks: list = []  # other sinks get DispatchRequests in log order (decoded here)
        self._extra_keys = False  # whether one of them reads the key index's keys (`reads_keys`)
        self.worker_count = workers
        self.dispatched_offset = start_offset
        self._last_records: tuple[int, int] | None = None  # [begin, end) of the newest run holding records
        # runs built into the queues and the key index but not yet into the extra sinks, in log order
        # (one failed, or follows one that did): the dispatched offset stays at the first one's begin
        self._owed: list[tuple[int, int]] = []
        self._sink_error: BaseException | None = None  # an extra sink's, raised when the round's commands are done
        self.listeners: list[ArrivalListener] = []
        self.stats = DispatchStats()
        self.progress = {sink.name: SinkProgress(start_offset) for sink in self.sinks}
        self.limit_source: Callable[[], int] | None = None  # re-read while dispatching, if set
        self._committer = QueueCommitter(queues)
        self._stalled = False
        self._no_space: str | None = None  # why the stall: the disk is full (raised by dispatch_until)
        self._waits_at = -1  # where a batch last waited for disk space
        self._pool = WorkerPool(
            workers, str(queues.root), queues.units_per_file, queues.file_sizes, key_index is not None
        )
        self._builder: BatchBuilder | None = None
        self.trickles = 0  # rounds of a few records dispatched without a batch (`trickle`)
        self._failed: str | None = None  # why the last commit failed
        self._closed = False

    # -- the public face of Dispatcher ---------------------------------------------------------

    @property
    def batch_bytes(self) -> int:
        return self.coordinator.batch_bytes

    @property
    def inline_bytes(self) -> int:
        return self.coordinator.inline_bytes

    @inline_bytes.setter
    def inline_bytes(self, value: int) -> None:
        self.coordinator.inline_bytes = value

    @property
    def inline_batches(self) -> int:
        """Batches built on the dispatch thread."""
        return self.coordinator.inline_batches

    @property
    def worker_batches(self) -> int:
        """Batches sent to worker processes."""
        return self.coordinator.worker_batches

    @property
    def handovers_forwarded(self) -> int:
        """Units handed over by one worker, forwarded to their owner."""
        return self.coordinator.handovers_forwarded

    @property
    def workers_restarted(self) -> int:
        return self.coordinator.workers_restarted

    @property
    def worker_appends(self) -> int:
        """Index appends done by workers (IndexAppended answers)."""
        return self.coordinator.worker_appends

    def add_sink(self, sink) -> None:
        self.extra_sinks.append(sink)
        self._extra_keys = reads_keys(self.extra_sinks)
        self.sinks.append(sink)
        self.progress[sink.name] = SinkProgress(self.dispatched_offset)

    def dispatch_until(self, limit: int, notify: bool = True) -> int:
        """Dispatch every record wholly below `limit` (and below what `limit_source` says when
        set); returns how many records were dispatched in order.  An extra sink's error is raised
        once the round's commands are carried out (the runs it refused stay owed)."""
        if self._owed:  # what a sink refused is retried before anything new is cut
            paid: dict[QueueKey, int] = {}
            self._pay_extra_sinks(paid)
            if notify and paid:
                notify_listeners(self.listeners, paid)
        total = self._dispatch_round(limit, notify)
        if self._sink_error is not None:
            error, self._sink_error = self._sink_error, None
            raise error
        return total

    def _dispatch_round(self, limit: int, notify: bool) -> int:
        coordinator = self.coordinator
        total = 0
        while True:
            if self.limit_source is not None:
                limit = max(limit, self.limit_source())
            if not coordinator.outstanding and limit - coordinator.cut_offset <= trickle.MAX_BYTES:
                before = coordinator.cut_offset
                changes: dict[QueueKey, int] = {}
                total += self._trickle(limit, changes)
                if notify and changes:
                    notify_listeners(self.listeners, changes)
                if coordinator.cut_offset != before:
                    continue
            self._fill(limit)
            if not coordinator.outstanding:
                return total
            changes = {}
            total += self._collect(changes)
            if notify and changes:
                notify_listeners(self.listeners, changes)
            if self._stalled:
                self._stalled = False
                if self._no_space is not None:  # the store's dispatch loop says so once and waits
                    error, self._no_space = self._no_space, None
                    raise StoreIOError(
                        errno.ENOSPC, f"dispatch waits at commit-log offset {coordinator.cut_offset}: {error}"
                    )
                return total

    def _trickle(self, limit: int, changes: dict[QueueKey, int]) -> int:
        """With nothing in flight, dispatch the few records from the cut offset on this thread
        (`trickle`); returns how many.  When it moved nothing, the batch path takes what is
        there."""
        begin = self.coordinator.cut_offset
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
        self.coordinator.trickled(end)
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
        dispatched offset and the statistics.  When an extra sink raises, the run (and every
        later one) is owed to the extra sinks and retried by the next `dispatch_until`; the
        dispatched offset moves only past runs every sink holds."""
        if records:
            self._last_records = (begin, end)
            self.stats.records += records
            self.stats.last_store_timestamp = self.queues.logics_msg_timestamp = last_timestamp
            for progress in self.progress.values():
                progress.last_store_timestamp = last_timestamp
        self.stats.bytes += end - begin
        if self.extra_sinks and end > begin:
            self._owed.append((begin, end))
            if self._sink_error is None:  # raising here would void the commands after this one
                try:
                    self._pay_extra_sinks(changes)
                except Exception as exc:
                    self._sink_error = exc
        else:
            self._advance(end)

    def _pay_extra_sinks(self, changes: dict[QueueKey, int]) -> None:
        """Hand the owed runs to the extra sinks in log order, moving the dispatched offset past
        each; a sink's error is raised with that run still owed (a sink takes a run again whole)."""
        while self._owed:
            begin, end = self._owed[0]
            batch = None
            for sink in self.extra_sinks:
                dispatch_range = getattr(sink, "dispatch_range", None)
                if dispatch_range is not None:  # a sink that reads the range itself, if it needs to
                    dispatch_range(self.commit_log, begin, end, changes)
                    continue
                if batch is None:
                    batch = _read_batch(self.commit_log, begin, end, self._extra_keys)
                dispatch_to(sink, batch, changes)
            del self._owed[0]
            self._advance(end)

    def _advance(self, end: int) -> None:
        if self._owed:  # never past a run an extra sink does not hold
            end = min(end, self._owed[0][0])
        self.dispatched_offset = end
        for progress in self.progress.values():
            progress.offset = end

    # -- cutting batches ---------------------------------------------------------------------------

    def _fill(self, limit: int) -> None:
        """Cut batches while the coordinator wants more, and carry out where each goes."""
        coordinator = self.coordinator
        if coordinator.cut_offset < limit and coordinator.cut_offset < self.commit_log.min_offset:
            coordinator.skip_to(self.commit_log.min_offset)  # retention removed the log below
            if not coordinator.outstanding:
                self._advance(coordinator.cut_offset)
        while (size := coordinator.next_cut(limit)) is not None:
            cut = self._cut(limit, size)
            if cut is None:
                break
            task, resume = cut
            self._run(coordinator.cut(task, limit, resume), {})

    def _cut(self, limit: int, size: int) -> tuple[BatchTask, int | None] | None:
        return cut_batch(self.commit_log, self.coordinator.next_id, self.coordinator.cut_offset, limit, size)

    # -- carrying out the coordinator's commands -----------------------------------------------------

    def _run(self, commands: list[Command], changes: dict[QueueKey, int]) -> int:
        """Carry out `commands` in order; returns the records committed."""
        records = 0
        for command in commands:
            if isinstance(command, Commit):
                committed = self._commit(command, changes)
                if committed is None:  # it failed: the commands after it are void
                    return records + self._run(self.coordinator.commit_failed(command.task, self._failed), changes)
                records += committed
            elif isinstance(command, Send):
                self.start_workers()
                self._send(command.worker, command.task)
            elif isinstance(command, AskAppend):
                self._send(command.worker, append_request(self.key_index, command.batch_id))
            elif isinstance(command, Forward):
                self._send(command.worker, command.payload, pickled=True)
            elif isinstance(command, BuildHere):
                self.coordinator.built_here(self.inline_builder().build(command.task))
            elif isinstance(command, AppendProgress):
                apply_append_progress(self.key_index, command)
            elif isinstance(command, WriteHere):
                if command.error is not None:
                    worker = self._pool.numbered(command.worker) if command.worker is not None else None
                    log.error(
                        "dispatch worker %s could not write the units handed over by batch %d: %s; "
                        "writing them on the dispatch thread",
                        worker.pid if worker is not None else command.worker,
                        command.batch_id,
                        command.error,
                    )
                try:
                    self.inline_builder().write_handover(pickle.loads(command.payload))
                except OSError as exc:
                    error = no_space(exc)
                    if error is None:
                        raise
                    # the commands after it are void: every outstanding batch is dropped
                    return records + self._run(self.coordinator.no_space_here(error), changes)
            elif isinstance(command, UndoIndex):
                undo(self.key_index, self.commit_log, command.task.begin)
                if command.error is not None:
                    log.error(
                        "dispatch worker could not append the index entries of commit-log offsets [%d, %d): %s; "
                        "building them on the dispatch thread",
                        command.task.begin,
                        command.task.end,
                        command.error,
                    )
            elif isinstance(command, Stall):
                self._stalled = True
                if command.no_space is not None:
                    if command.offset != self._waits_at:  # said once for each place it waits at
                        log.warning(
                            "dispatch: the batch at commit-log offset %d waits for disk space (%s)",
                            command.offset,
                            command.no_space,
                        )
                        self._waits_at = command.offset
                    self._no_space = command.no_space
            elif isinstance(command, Respawn):
                self._respawn(command)
            elif isinstance(command, Retire):
                self._retire(command)
            else:
                raise AssertionError(f"unknown command {command!r}")
        return records

    def _commit(self, command: Commit, changes: dict[QueueKey, int]) -> int | None:
        """Carry out a commit; None if its index entries could not be appended for want of disk
        space (`_failed` says why); another error is raised, the batch dropped first."""
        head = command.result
        try:
            append_index_of(self.key_index, head)
        except Exception as exc:
            self._failed = no_space(exc)
            if self._failed is not None:
                return None
            self._run(self.coordinator.commit_failed(command.task, None), changes)  # built again when retried
            raise
        if len(head.queues):
            self._committer.commit(head.queues, changes, bool(self.listeners))
        self._dispatched(command.task.begin, head.end, head.records, head.last_store_timestamp, changes)
        if head.error is not None:
            log.error("dispatch stopped at commit-log offset %d: %s", head.end, head.error)
        return head.records

    def _send(self, number: int, message, pickled: bool = False) -> None:
        worker = self._pool.numbered(number)
        if worker is None:
            raise AssertionError(f"no dispatch worker {number}")
        try:
            if pickled:
                worker.conn.send_bytes(message)
            else:
                worker.conn.send(message)
        except (OSError, EOFError):
            pass  # a dead worker is noticed, and what it was sent sent again, by _collect

    def _respawn(self, command: Respawn) -> None:
        dead = self._pool.numbered(command.worker)
        assert dead is not None
        log.warning(
            "dispatch worker %s died (exit code %s); rebuilding its %d batch(es) in a new one",
            dead.pid,
            dead.process.returncode,
            command.batches,
        )
        self._pool.replace(dead)

    def _retire(self, command: Retire) -> None:
        dead = self._pool.numbered(command.worker)
        assert dead is not None
        if command.first:
            log.error(
                "dispatch workers died %d times in a row without answering (last: pid %s, exit code %s); "
                "building the indexes on the dispatch thread from now on",
                command.deaths,
                dead.pid,
                dead.process.returncode,
            )
        self._pool.remove(dead)

    def inline_builder(self) -> BatchBuilder:
        """The dispatch thread's builder: it owns every queue (no units handed over)."""
        if self._builder is None:
            self._builder = ThreadBuilder(self.queues, self.key_index is not None)
        return self._builder

    # -- workers -------------------------------------------------------------------------------------

    def start_workers(self) -> None:
        """Start the worker processes now rather than on the first large backlog."""
        if not self.coordinator.inline_only and self._pool.start():
            log.info("dispatch: started %d worker processes", self.worker_count)

    def wait_ready(self) -> None:
        """Start the workers and wait until each has answered once (benchmarks: keep the
        interpreter start out of the timing)."""
        self.start_workers()
        self._pool.wait_ready()

    def worker_pids(self) -> list[int]:
        return self._pool.pids()

    def _collect(self, changes: dict[QueueKey, int]) -> int:
        """Take the answers that are ready (waiting for at least one if none is) and carry out
        what follows; returns the records committed."""
        coordinator = self.coordinator
        if coordinator.has_done:
            return self._run(coordinator.take_done(), changes)
        if not coordinator.awaiting_workers:
            return 0
        total = 0
        # every worker's pipe is registered (`WorkerPool.ready`): one that is not busy has nothing
        # to say, or says it died, or answers for a batch since dropped (ignored by the coordinator)
        for worker in self._pool.ready():
            if not self._pool.watching(worker):
                continue  # replaced meanwhile
            try:
                messages = worker.conn.take()
            except (EOFError, OSError):  # the pipe closed: the worker died
                worker.process.wait()
                self._pool.retire(worker)
                total += self._run(coordinator.worker_died(worker.number), changes)
                continue
            for message in messages:
                kind = type(message)
                if kind is IndexAppended:
                    commands = coordinator.index_appended(message)
                elif kind is UnitsWritten:
                    commands = coordinator.units_written(worker.number, message.batch_id, message.error)
                else:
                    commands = coordinator.answered(worker.number, message)
                total += self._run(commands, changes)
        return total

    # -- closing ------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        if self._builder is not None:
            self._builder.close()
            self._builder = None


def cut_batch(
    commit_log: CommitLog, batch_id: int, offset: int, limit: int, size: int
) -> tuple[BatchTask, int | None] | None:
    """Batch `batch_id` from commit-log offset `offset` (a record boundary), and where the one
    after starts if not at its end (past the blank closing a segment); None if no whole record
    below `limit` is readable there.  Its end is the first record boundary at or after `size`
    bytes, found by looking for a record header that names its own position (magic code,
    PHYSICALOFFSET), not by walking every record: the builder's walk confirms it."""
    segment = commit_log.segment_for(offset)
    if segment is None:
        return None
    mm = segment.mm
    base = segment.start
    pos = offset - base
    hard_stop = min(limit, segment.end) - base
    if pos >= hard_stop or pos + 8 > segment.size:
        return None
    if record.closes_segment(mm, pos, segment.size):
        # an empty batch moves the dispatched offset past the blank
        return BatchTask(batch_id, str(segment.path), base, segment.size, offset, offset), segment.end
    end = batch_end(mm, base, pos, hard_stop, size)
    if end is None:
        return None  # not written yet, or damage the sequential walk reports; never skip past it
    return BatchTask(batch_id, str(segment.path), base, segment.size, offset, base + end), None


def _read_batch(commit_log: CommitLog, begin: int, end: int, keys: bool) -> DispatchBatch:
    """The records of [begin, end) (one built batch) for sinks the workers do not build (`keys`:
    one of them reads the key index's keys)."""
    segment = commit_log.segment_for(begin)
    if segment is None:
        return DispatchBatch(scan(b"", 0, 0, begin))
    return DispatchBatch(scan(segment.mm, begin - segment.start, end - segment.start, segment.start, keys=keys))
