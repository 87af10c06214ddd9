"""The parallel dispatcher's decisions (RIP-52), without I/O: events in, commands out.

`Coordinator` owns the order of the batches and what is outstanding: the cut offset, the
numbered batches cut and not yet committed, the answers waiting to be the head, which worker
builds which batch and which units handed over it is still to write, which worker holds which
batch's index entries and the one index append under way (`index_appends`), the handovers a
batch waits for (`handovers`), and how often workers died in a row.  It reads no file, sends
nothing and starts no process: each event (a method) returns the commands that follow from it,
which its driver (`parallel.ParallelDispatcher`) carries out in order.

Events: a batch was cut (`cut`, after `next_cut` gave its size); a batch was built on the
dispatching thread (`built_here`); a worker answered a batch (`answered`), wrote units handed
over to it (`units_written`), or appended index entries (`index_appended`); a worker died
(`worker_died`); the cut offset moved past records dispatched without a batch (`trickled`,
`skip_to`).  Built batches complete in any order; `Commit` commands come strictly in batch order,
each only once every earlier batch is committed, so each queue's run of slots in a committed batch
starts at that queue's commit frontier.

Contract with the driver: it carries out every command, in the order given, before it feeds the
next event; a `BuildHere`'s result comes back through `built_here`; a worker's messages come back
in the order it sent them.  Worker numbers name a worker's share of the queues: a replacement
(`Respawn`) takes the dead one's number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .builder import NO_SPACE
from .handovers import Handovers
from .index_appends import APPENDED, ASKED_AGAIN, FAILED, IndexAppends
from .messages import BatchResult, BatchTask, IndexAppended, QueueRuns

# a backlog is cut in batches of backlog / (this x workers), so that one slow batch does not
# leave the other workers idle
BATCHES_PER_WORKER = 4
UNBUILT_PER_WORKER = 3  # batches sent to workers and not answered yet, per worker
# batches cut and not committed yet, per worker: built ones wait at the head for the index
# appends before them (one at a time), so more are cut than are unbuilt, or the workers wait
# for want of a batch
OUTSTANDING_PER_WORKER = 8
MAX_WORKER_DEATHS_IN_A_ROW = 4
# a batch's fixed costs (its messages, the head's index-append round trip, a worker's setup)
# outweigh the work on its records below this size, so the tail of a large backlog is not cut
# into smaller batches
MIN_BATCH_BYTES = 1 << 20


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send `task` to worker `worker` to build (its answer comes back as `answered`)."""

    worker: int
    task: BatchTask


@dataclass(frozen=True, slots=True)
class BuildHere:
    """Build `task` on the dispatching thread, owning every queue; report it with `built_here`."""

    task: BatchTask


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the units batch `batch_id` handed over (`payload`, a pickled `UnitsHandover`) to
    their owner, worker `worker` (its answer comes back as `units_written`)."""

    worker: int
    batch_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class WriteHere:
    """Write the units batch `batch_id` handed over on the dispatching thread: their owner is
    gone, or it could not write them (`worker`, `error`)."""

    batch_id: int
    payload: bytes
    worker: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class AskAppend:
    """Ask worker `worker` to append the index entries it holds (or will hold once built) of
    batch `batch_id` to the newest index file; nothing else is appended until it answers."""

    worker: int
    batch_id: int


@dataclass(frozen=True, slots=True)
class AppendProgress:
    """A worker appended index entries: the newest entry was stored at `last_timestamp` (0: none
    appended); `next_file_at` set: the newest file is full, start the next one named after that
    store time (an `AskAppend` for the rest follows)."""

    last_timestamp: int
    next_file_at: int | None


@dataclass(frozen=True, slots=True)
class UndoIndex:
    """Cut the key index back to the entries of records below `task.begin`: a worker appending
    them died, or could not append them (`error`; a `BuildHere` of the batch follows)."""

    task: BatchTask
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """`result` is the head, every earlier batch committed: commit its queues' runs of slots,
    append its index entries, and move the dispatched offset to `result.end`."""

    task: BatchTask
    result: BatchResult


@dataclass(frozen=True, slots=True)
class Stall:
    """Dispatch stops at commit-log offset `offset` (the last commit's walk ended short: damage,
    or data not readable yet; or `no_space`: the disk had no room for the batch from there): the
    outstanding batches are dropped and will be cut again from there; return to the caller."""

    offset: int
    no_space: str | None = None


@dataclass(frozen=True, slots=True)
class Respawn:
    """Worker `worker` died: start a process of the same number in its place (the units and the
    `batches` batches it owed are sent to the new one by the commands that follow)."""

    worker: int
    batches: int


@dataclass(frozen=True, slots=True)
class Retire:
    """Worker `worker` died, the `deaths`-th in a row without an answer between: let it go and
    start no other; `first`: the first worker let go (every batch is built here from now on)."""

    worker: int
    deaths: int
    first: bool


Command = (
    Send | BuildHere | Forward | WriteHere | AskAppend | AppendProgress | UndoIndex | Commit | Stall | Respawn | Retire
)


def empty_result(task: BatchTask, end: int) -> BatchResult:
    """The answer of a batch holding no record, ending at `end` (past a blank that closes a
    segment)."""
    return BatchResult(
        task.batch_id,
        task.begin,
        end,
        None,
        0,
        0,
        QueueRuns.empty(),
        np.zeros(0, np.int32),
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
    )


@dataclass(slots=True)
class _Worker:
    """What the coordinator sent one worker and awaits from it."""

    tasks: dict[int, BatchTask]  # batch id -> sent, not answered
    handovers: dict[int, bytes]  # batch id -> units handed over to it (pickled), not written


class Coordinator:
    """The order-preserving coordinator of `workers` workers (0: every batch is built on the
    dispatching thread), starting at commit-log offset `start_offset`; `index`: a key index is
    built (its entries are appended by the workers holding them, in log order)."""

    def __init__(self, workers: int, start_offset: int, *, batch_bytes: int, inline_bytes: int, index: bool) -> None:
        if workers < 0:
            raise ValueError(f"dispatch workers must be 0 (the dispatch thread alone) or more, not {workers}")
        self.worker_count = workers
        self.batch_bytes = batch_bytes
        self.inline_bytes = inline_bytes
        self.index = index
        self.cut_offset = start_offset  # where the next batch starts
        self.next_id = 0  # the number of the next batch cut
        self.head_id = 0  # the oldest batch not committed
        self._tasks: dict[int, BatchTask] = {}  # outstanding: cut, not committed
        self._done: dict[int, BatchResult] = {}  # complete (built here, or empty), not yet taken
        self._answers: dict[int, BatchResult] = {}  # complete, waiting to be the head
        self._workers = {number: _Worker({}, {}) for number in range(workers)}
        self._handovers = Handovers(self._forward)
        self._appends = IndexAppends()
        self._deaths_in_a_row = 0  # worker deaths since a worker last answered
        # no workers (none asked for, or they died too often): every batch is built here
        self.inline_only = workers == 0
        self._out: list[Command] = []
        # counters
        self.inline_batches = 0  # batches built on the dispatching thread
        self.worker_batches = 0  # batches sent to a worker (not counting those sent again)
        self.handovers_forwarded = 0  # units handed over by one worker, forwarded to their owner
        self.workers_restarted = 0

    # -- what is outstanding ---------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Batches cut and not committed."""
        return len(self._tasks)

    @property
    def worker_appends(self) -> int:
        """Index appends done by workers (their answers taken)."""
        return self._appends.count

    def workers(self) -> list[int]:
        """The numbers of the workers in use."""
        return list(self._workers)

    def sent_to(self, worker: int) -> list[int]:
        """The batches worker `worker` was sent and has not answered."""
        return sorted(self._workers[worker].tasks)

    def handed_to(self, worker: int) -> list[int]:
        """The batches whose units handed over to worker `worker` it has not written."""
        return sorted(self._workers[worker].handovers)

    @property
    def has_done(self) -> bool:
        """Complete answers are waiting to be taken (`take_done`)."""
        return bool(self._done)

    @property
    def awaiting_workers(self) -> bool:
        """Whether a worker owes an answer: a batch, units handed over, or the append asked."""
        if any(w.tasks or w.handovers for w in self._workers.values()):
            return True
        return self._appends.waited_on() in self._workers

    # -- cutting ---------------------------------------------------------------------------------

    def skip_to(self, offset: int) -> None:
        """The log below `offset` is gone (retention): cut from there."""
        self.cut_offset = max(self.cut_offset, offset)

    def trickled(self, end: int) -> None:
        """Records up to `end` were dispatched without a batch (nothing outstanding)."""
        assert not self._tasks, "a trickle with batches outstanding"
        self.cut_offset = end

    def next_cut(self, limit: int) -> int | None:
        """The size of the next batch to cut at `cut_offset` (records below `limit` are readable),
        or None while enough batches are outstanding or nothing is left."""
        inline = self.inline_only
        # on this thread alone, one whole batch at a time: each is committed, and its listeners
        # told, as soon as it is built
        max_outstanding = 1 if inline else OUTSTANDING_PER_WORKER * self.worker_count
        max_unbuilt = UNBUILT_PER_WORKER * max(self.worker_count, 1)
        if len(self._tasks) >= max_outstanding or self.cut_offset >= limit or self._unbuilt() >= max_unbuilt:
            return None
        if inline:
            return self.batch_bytes
        backlog = limit - self.cut_offset
        return min(
            self.batch_bytes,
            max(self.inline_bytes, MIN_BATCH_BYTES, backlog // (BATCHES_PER_WORKER * self.worker_count)),
        )

    def cut(self, task: BatchTask, limit: int, resume: int | None = None) -> list[Command]:
        """Batch `task` (numbered `next_id`, starting at `cut_offset`) was cut; the next starts
        at `resume` (past the blank closing its segment, for an empty batch there) or at its end."""
        if task.batch_id != self.next_id or task.begin != self.cut_offset:
            raise ValueError(
                f"batch {task.batch_id} at {task.begin} is not the next ({self.next_id} at {self.cut_offset})"
            )
        backlog = limit - self.cut_offset
        self.next_id += 1
        self.cut_offset = task.end if resume is None else resume
        self._tasks[task.batch_id] = task
        if task.end == task.begin:
            self._done[task.batch_id] = empty_result(task, self.cut_offset)
        elif self.inline_only or (backlog <= self.inline_bytes and len(self._tasks) == 1):
            self._build_here(task)
        else:
            worker = min(self._workers, key=lambda number: len(self._workers[number].tasks))
            self._workers[worker].tasks[task.batch_id] = task
            self.worker_batches += 1
            self._out.append(Send(worker, task))
        return self._flush()

    def _unbuilt(self) -> int:
        return sum(len(w.tasks) for w in self._workers.values())

    def _build_here(self, task: BatchTask) -> None:
        self.inline_batches += 1
        self._out.append(BuildHere(task))

    # -- answers ---------------------------------------------------------------------------------

    def built_here(self, result: BatchResult) -> None:
        """A `BuildHere` batch's answer (taken with the next `take_done`)."""
        self._done[result.batch_id] = result

    def take_done(self) -> list[Command]:
        """Take the complete answers waiting (built here, or empty), in batch order."""
        done, self._done = self._done, {}
        for batch_id in sorted(done):
            self._complete(done[batch_id])
        return self._flush()

    def answered(self, worker: int, result: BatchResult) -> list[Command]:
        """Worker `worker` answered a batch (one since dropped is ignored)."""
        self._deaths_in_a_row = 0
        if self._workers[worker].tasks.pop(result.batch_id, None) is not None:
            self._appends.held(result, worker)
            if self._handovers.hand_over(result):
                self._complete(result)
        return self._flush()

    def units_written(self, worker: int, batch_id: int, error: str | None = None) -> list[Command]:
        """Worker `worker` wrote the units batch `batch_id` handed it (or could not: `error`)."""
        self._deaths_in_a_row = 0
        payload = self._workers[worker].handovers.pop(batch_id, None)
        if payload is not None:
            if error is not None and error.startswith(NO_SPACE):
                self._wait_for_space(self._head_begin(), error)
                return self._flush()
            if error is not None:
                self._out.append(WriteHere(batch_id, payload, worker, error))
            built = self._handovers.written(batch_id, worker)
            if built is not None:
                self._complete(built)
        return self._flush()

    def index_appended(self, answer: IndexAppended) -> list[Command]:
        """A worker answered the append under way (an answer for a batch since dropped or built
        again is ignored)."""
        self._deaths_in_a_row = 0
        appends = self._appends
        if answer.batch_id == appends.appending and answer.batch_id in self._tasks:
            task = self._tasks[answer.batch_id]
            outcome = appends.answered(answer)
            # the disk had no room for the entries, or for the batch itself (the worker answered
            # it built nothing as it was asked to append): wait for space, and build it again
            built = self._answers.get(answer.batch_id)
            no_space = [e for e in (answer.error, built and built.error) if e and e.startswith(NO_SPACE)]
            if outcome == FAILED and no_space:
                self._out.append(UndoIndex(task))
                self._wait_for_space(task.begin, no_space[0])
                return self._flush()
            if outcome != FAILED:
                self._out.append(
                    AppendProgress(answer.last_timestamp, answer.next_timestamp if answer.remaining else None)
                )
            if outcome == ASKED_AGAIN:
                asked = appends.asked
                assert asked is not None
                self._out.append(AskAppend(asked, answer.batch_id))
            elif outcome == APPENDED:
                self._advance()
            else:
                # build and append it here (the worker's answer, should it come, is ignored: it
                # no longer holds entries)
                self._out.append(UndoIndex(task, answer.error))
                self._build_here(task)
        return self._flush()

    def _complete(self, result: BatchResult) -> None:
        """Keep a complete answer (they come in any order); then process every batch now at the
        head, in order."""
        if result.batch_id not in self._tasks:
            return  # from a generation that was dropped
        if self._appends.lost(result):
            return  # its worker died after answering: the batch is being built again
        self._answers[result.batch_id] = result
        self._advance()

    def _advance(self) -> None:
        appends = self._appends
        while appends.appending is None and self.head_id in self._answers:
            head = self._answers[self.head_id]
            if appends.owed(head):
                # its worker appends its index entries first; the head waits for the answer
                self._out.append(AskAppend(appends.start(head.batch_id), head.batch_id))
                break
            if head.error is not None and head.error.startswith(NO_SPACE):
                self._wait_for_space(self._tasks[head.batch_id].begin, head.error)
                return
            if self._commit(self._answers.pop(self.head_id)):
                return
        if appends.appending is None and self.index and self.head_id in self._tasks:
            # the head is not built yet: its worker is asked now, and appends as soon as it has
            # built it, instead of after its answer has come here and the request gone back
            builder = next((n for n, w in self._workers.items() if self.head_id in w.tasks), None)
            if builder is not None:
                self._out.append(AskAppend(appends.start(self.head_id, builder), self.head_id))

    def _commit(self, head: BatchResult) -> bool:
        """Commit the head; True if dispatch stalls after it (its walk ended short)."""
        task = self._tasks.pop(head.batch_id)
        self._handovers.processed(head.batch_id)
        self._appends.processed(head.batch_id)
        self.head_id += 1
        self._out.append(Commit(task, head))
        if head.error is not None or head.end != task.end:
            # damage, or the walk did not land on the batch's end (the rest of the log is not
            # readable yet, or the cut took bytes inside a record for a header): every later
            # batch is dropped (written, never committed) and cut again from where it stopped
            self._drop_after(head.end)
            return True
        return False

    def _head_begin(self) -> int:
        """Where the oldest outstanding batch begins (the dispatched offset)."""
        return self._tasks[min(self._tasks)].begin if self._tasks else self.cut_offset

    def _wait_for_space(self, begin: int, error: str) -> None:
        """The disk had no room for the batch from `begin` (the head): drop it and every later
        one, and stall there (`Stall.no_space`); the next cut starts at `begin`.  Units written
        meanwhile are written again, at the same slots."""
        self._drop_after(begin, error)

    def no_space_here(self, error: str) -> list[Command]:
        """Units handed over could not be written on the dispatching thread for want of disk
        space (the rest of the commands given with that `WriteHere` are void)."""
        self._wait_for_space(self._head_begin(), error)
        return self._flush()

    def commit_failed(self, task: BatchTask, no_space: str | None) -> list[Command]:
        """The `Commit` of the batch `task` failed before its queues were committed (appending
        its index entries: `no_space`, or another error): drop it and every later one, to be
        cut again from its beginning (the rest of the commands given with it are void)."""
        self._drop_after(task.begin, no_space)
        return self._flush()

    def _drop_after(self, end: int, no_space: str | None = None) -> None:
        self._tasks.clear()
        self._answers.clear()
        self._done.clear()
        self._appends.clear()
        self._handovers.clear()
        for worker in self._workers.values():  # their answers, when they come, are ignored
            worker.tasks.clear()
            worker.handovers.clear()
        self.head_id = self.next_id
        self.cut_offset = end
        self._out.append(Stall(end, no_space))

    # -- units handed over between workers -------------------------------------------------------

    def _forward(self, owner: int, batch_id: int, payload: bytes) -> bool:
        """Units handed over to worker `owner`: True if sent (its answer is awaited), False if
        written here (that worker was let go)."""
        worker = self._workers.get(owner)
        if worker is None:
            self._out.append(WriteHere(batch_id, payload))
            return False
        worker.handovers[batch_id] = payload
        self.handovers_forwarded += 1
        self._out.append(Forward(owner, batch_id, payload))
        return True

    # -- deaths ----------------------------------------------------------------------------------

    def worker_died(self, number: int) -> list[Command]:
        """Worker `number` died (its answers not read are lost).  Its unanswered batches, and
        those whose index entries it held, are built again: by a replacement of the same number,
        or here once workers died MAX_WORKER_DEATHS_IN_A_ROW times in a row."""
        dead = self._workers[number]
        self._deaths_in_a_row += 1
        appending = self._appends.appending
        lost = self._appends.died(number)
        voided = False
        if appending is not None and (appending in lost or appending in dead.tasks):
            # it may have written part of the entries
            self._appends.appending = None
            self._out.append(UndoIndex(self._tasks[appending]))
        elif appending is not None and self._appends.asked == number:
            # asked for a batch it answered holding no entries: it wrote none, and the request
            # died with it
            self._appends.appending = None
            voided = True
        for batch_id in lost:
            self._answers.pop(batch_id, None)
            self._handovers.rebuilding(batch_id)
            dead.tasks[batch_id] = self._tasks[batch_id]
        if self._deaths_in_a_row >= MAX_WORKER_DEATHS_IN_A_ROW:
            # workers that cannot finish a batch (a broken install, no memory): start no more,
            # and build here, slower but without losing or reordering anything
            self._out.append(Retire(number, self._deaths_in_a_row, not self.inline_only))
            self.inline_only = True
            del self._workers[number]
            for batch_id, payload in sorted(dead.handovers.items()):
                self._out.append(WriteHere(batch_id, payload))
                built = self._handovers.written(batch_id, number)
                if built is not None:
                    self._done[batch_id] = built
            for _, task in sorted(dead.tasks.items()):
                self._build_here(task)
            dead.tasks.clear()
            dead.handovers.clear()
            if voided:
                self._advance()
            return self._flush()
        self._out.append(Respawn(number, len(dead.tasks)))
        self.workers_restarted += 1
        # the units handed over to it and not yet written first: the head may wait for them
        for batch_id, payload in sorted(dead.handovers.items()):
            self._out.append(Forward(number, batch_id, payload))
        for _, task in sorted(dead.tasks.items()):
            self._out.append(Send(number, task))
        if voided:
            self._advance()
        return self._flush()

    def _flush(self) -> list[Command]:
        out, self._out = self._out, []
        return out
