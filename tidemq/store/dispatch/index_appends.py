"""The key index's appends in the workers, one at a time in log order (see parallel_dispatch).

A worker keeps the index entries of the batches it builds (`BatchResult.index_held`).  When a batch
becomes the head (every earlier batch processed), the worker holding its entries is asked to append
them to the newest index file (`IndexAppend`), and nothing else is appended until it answers: so
the index files are those the single dispatch thread writes, while the coordinator itself does no
per-entry work.  A worker answers append requests before its next build, and appends a batch it was
asked for as it finishes building it: the coordinator asks the head's builder before the head is
built, so that the chain of appends keeps up with the builds.  When the newest file fills, the
worker answers with what remains, the coordinator creates the next file (it alone creates index
files) and asks again.

Failures: a worker that could not append (an I/O error there) answers with the error; one that
died while appending answers nothing.  Either way the index is cut back to the batch's first record
(`KeyIndex.truncate`, which also clears entries written past the header's count), and the batch is
built again: on the dispatch thread, or by the dead worker's replacement.
"""

from __future__ import annotations

from collections.abc import Callable

from ..format import record
from ..log.commit_log import CommitLog
from .messages import BatchResult, BatchTask, IndexAppend, IndexAppended
from .workers import WorkerProcess

# answered(): the batch's entries are all in; the worker was asked again (a file filled); the
# worker could not append them (the index is cut back: build the batch again)
APPENDED, ASKED_AGAIN, FAILED = "appended", "asked again", "failed"


class IndexAppends:
    """Which worker holds which batch's index entries, and the one append under way.  `send`
    sends a request to a worker (it must not raise for a dead one: its death is noticed and
    handled elsewhere)."""

    def __init__(self, key_index, commit_log: CommitLog, send: Callable[[WorkerProcess, IndexAppend], None]) -> None:
        self.key_index = key_index
        self._commit_log = commit_log
        self._send = send
        self.holders: dict[int, WorkerProcess] = {}  # batch id -> the worker holding its index entries
        self.appending: int | None = None  # the head batch whose append is under way
        self.asked: WorkerProcess | None = None  # the worker asked to append it
        self.done: set[int] = set()  # batches whose entries a worker has appended, not processed yet
        self.count = 0  # appends done by workers (IndexAppended answers)

    def waited_on(self) -> WorkerProcess | None:
        """The worker whose append is under way, if one is."""
        return self.asked if self.appending is not None else None

    def held(self, result: BatchResult, worker: WorkerProcess) -> None:
        """`worker` answered for a batch: it holds the batch's entries if it says so."""
        if result.index_held:
            self.holders[result.batch_id] = worker

    def owed(self, result: BatchResult) -> bool:
        """Whether a worker is still to append the batch's entries."""
        return result.index_held != 0 and result.batch_id not in self.done

    def lost(self, result: BatchResult) -> bool:
        """Whether `result` held index entries its worker no longer holds (it died after
        answering, or failed to append them): the batch is being built again."""
        return self.owed(result) and result.batch_id not in self.holders

    def start(self, batch_id: int, holder: WorkerProcess | None = None) -> None:
        """Ask the worker holding the batch's entries (`holder`: the one building it) to append
        them; nothing else is appended until it answers."""
        self.appending = batch_id
        self._request(batch_id, holder)

    def _request(self, batch_id: int, holder: WorkerProcess | None = None) -> None:
        holder = self.asked = holder or self.holders[batch_id]
        files = self.key_index.files
        geometry = (files[-1].hash_slots, files[-1].max_entries) if files else (0, 0)
        self._send(holder, IndexAppend(batch_id, self.current_path(), self.key_index.indexed_until, *geometry))

    def current_path(self) -> str | None:
        """The newest index file, or None if there is none or it is full."""
        files = self.key_index.files
        return None if not files or files[-1].is_full else str(files[-1].path)

    def answered(self, answer: IndexAppended, begin: int) -> str:
        """Take the answer to the append under way, of the batch starting at commit-log offset
        `begin`: APPENDED, ASKED_AGAIN or FAILED."""
        if answer.error is not None:
            self.undo(begin)
            self.holders.pop(answer.batch_id, None)
            self.appending = None
            return FAILED
        self.count += 1
        index = self.key_index
        if answer.last_timestamp:
            index.last_store_timestamp = answer.last_timestamp
        if answer.remaining:
            # the newest file is full (or there is none): start the next one, named after the
            # first entry it gets, and ask again
            index.start_file(answer.next_timestamp)
            self._request(answer.batch_id)
            return ASKED_AGAIN
        self.holders.pop(answer.batch_id, None)
        self.appending = None
        self.done.add(answer.batch_id)
        return APPENDED

    def died(self, dead: WorkerProcess, tasks: dict[int, BatchTask]) -> list[int]:
        """`dead` died: the batches whose entries died with it, to be built again (with its
        unanswered ones, `dead.tasks`).  If it was appending one of either (asked after building
        it or before), the index is cut back to that batch's first record (`tasks`: every
        outstanding batch), since it may have written part of the entries."""
        lost = sorted(b for b, holder in self.holders.items() if holder is dead)
        for batch_id in lost:
            del self.holders[batch_id]
        if self.appending is not None and (self.appending in lost or self.appending in dead.tasks):
            self.undo(tasks[self.appending].begin)
            self.appending = None
        return lost

    def undo(self, begin: int) -> None:
        """Cut the key index back to the entries of records below `begin`, restoring the bytes
        the files had before."""

        def store_time_of(phy: int) -> int | None:
            rec = self._commit_log.read_record(phy, check_crc=False, read_body=False, read_properties=False)
            return rec.store_timestamp if type(rec) is record.Record else None

        self.key_index.truncate(begin, store_time_of)

    def processed(self, batch_id: int) -> None:
        """The batch was processed at the head."""
        self.done.discard(batch_id)

    def clear(self) -> None:
        """Later batches were dropped: the workers let go of the entries they hold when asked
        for a later batch."""
        self.holders.clear()
        self.done.clear()
