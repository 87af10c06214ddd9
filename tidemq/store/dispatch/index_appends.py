"""The key index's appends in the workers, one at a time in log order (see coordinator).

A worker keeps the index entries of the batches it builds (`BatchResult.index_held`).  When a batch
becomes the head (every earlier batch processed), the worker holding its entries is asked to append
them to the newest index file (`IndexAppend`), and nothing else is appended until it answers: so
the index files are those the single dispatch thread writes, while the coordinator itself does no
per-entry work.  A worker answers append requests before its next build, and appends a batch it was
asked for as it finishes building it: the coordinator asks the head's builder before the head is
built, so that the chain of appends keeps up with the builds.  When the newest file fills, the
worker answers with what remains, the driver creates the next file (it alone creates index files)
and the worker is asked again.

Failures: a worker that could not append (an I/O error there) answers with the error; one that
died while appending answers nothing.  Either way the index is cut back to the batch's first record
(`undo`: `KeyIndex.truncate`, which also clears entries written past the header's count), and the
batch is built again: on the dispatch thread, or by the dead worker's replacement.

`IndexAppends` is the coordinator's bookkeeping (workers by number, no I/O); `append_request` and
`undo` are the driver's side, on the key index.
"""

from __future__ import annotations

from ..format import record
from ..log.commit_log import CommitLog
from .messages import BatchResult, IndexAppend, IndexAppended

# answered(): the batch's entries are all in; the worker is to be asked again (a file filled); the
# worker could not append them (the index is to be cut back and the batch built again)
APPENDED, ASKED_AGAIN, FAILED = "appended", "asked again", "failed"


class IndexAppends:
    """Which worker (by number) holds which batch's index entries, and the one append under way."""

    def __init__(self) -> None:
        self.holders: dict[int, int] = {}  # batch id -> the worker holding its index entries
        self.appending: int | None = None  # the head batch whose append is under way
        self.asked: int | None = None  # the worker asked to append it
        self.done: set[int] = set()  # batches whose entries a worker has appended, not processed yet
        self.count = 0  # appends done by workers (IndexAppended answers)

    def waited_on(self) -> int | None:
        """The worker whose append is under way, if one is."""
        return self.asked if self.appending is not None else None

    def held(self, result: BatchResult, worker: int) -> None:
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

    def start(self, batch_id: int, holder: int | None = None) -> int:
        """The append of the batch's entries starts: the worker to ask, the one holding them
        (`holder`: the one building it, before it answered)."""
        self.appending = batch_id
        self.asked = holder if holder is not None else self.holders[batch_id]
        return self.asked

    def answered(self, answer: IndexAppended) -> str:
        """Take the answer to the append under way: APPENDED, ASKED_AGAIN (the same worker) or
        FAILED."""
        if answer.error is not None:
            self.holders.pop(answer.batch_id, None)
            self.appending = None
            return FAILED
        self.count += 1
        if answer.remaining:
            self.asked = self.holders[answer.batch_id]
            return ASKED_AGAIN
        self.holders.pop(answer.batch_id, None)
        self.appending = None
        self.done.add(answer.batch_id)
        return APPENDED

    def died(self, dead: int) -> list[int]:
        """Worker `dead` died: the batches whose entries died with it, to be built again."""
        lost = sorted(b for b, holder in self.holders.items() if holder == dead)
        for batch_id in lost:
            del self.holders[batch_id]
        return lost

    def processed(self, batch_id: int) -> None:
        """The batch was processed at the head."""
        self.done.discard(batch_id)

    def clear(self) -> None:
        """Later batches were dropped: the workers let go of the entries they hold when asked
        for a later batch."""
        self.holders.clear()
        self.done.clear()


def append_request(key_index, batch_id: int) -> IndexAppend:
    """The request to append batch `batch_id`'s held entries to the newest index file (`path`
    None: there is none or it is full), past the entries the index has."""
    files = key_index.files
    geometry = (files[-1].hash_slots, files[-1].max_entries) if files else (0, 0)
    path = None if not files or files[-1].is_full else str(files[-1].path)
    return IndexAppend(batch_id, path, key_index.indexed_until, *geometry)


def undo(key_index, commit_log: CommitLog, begin: int) -> None:
    """Cut the key index back to the entries of records below `begin`, restoring the bytes the
    files had before."""

    def store_time_of(phy: int) -> int | None:
        rec = commit_log.read_record(phy, check_crc=False, read_body=False, read_properties=False)
        return rec.store_timestamp if type(rec) is record.Record else None

    key_index.truncate(begin, store_time_of)
