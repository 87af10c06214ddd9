"""Committing a parallel-dispatch batch's queue entries (see parallel_dispatch).  Batches are
committed strictly in log order, when each reaches the head, so each queue's run of slots in the
batch starts at that queue's commit frontier (`ConsumeQueue.commit_range`); readers and
long-polling listeners, told only of frontier moves, never see a gap or a reordering.  A queue
seen for the first time is started at its first slot (`ConsumeQueue.adopted_many`, the batch's
new queues together, or `adopt_files`).

Ownership: `QueueCommitter` belongs to the dispatching thread, the one writer of the store's
`ConsumeQueue` objects and of their rows in the frontier table.
"""

from __future__ import annotations

import numpy as np

from .consume_queue import ConsumeQueue
from .dispatch import ConsumeQueueStore, QueueKey
from .dispatch_messages import QueueRuns

SMALL_COMMIT = 16  # up to this many queues in a batch, their runs are committed one at a time, without NumPy

try:
    from ._dispatch import RowIndex as _RowIndex
except ImportError:  # the extension is optional: without it, PythonRowIndex
    _RowIndex = None


def queue_codes_of(numbers: np.ndarray, topic_ids: np.ndarray, queue_ids: np.ndarray) -> np.ndarray:
    """The codes of queues (topic number << 32 | queue id as unsigned) given by their topic ids
    (`numbers`: the committer's number of each topic id) and queue ids."""
    return (numbers[topic_ids] << 32) | (queue_ids.astype(np.int64) & 0xFFFFFFFF)


class PythonRowIndex:
    """`_dispatch.RowIndex` (its docs are in the module source) in Python, where the extension is
    not built: frontier-table rows by queue code (topic number << 32 | queue id as unsigned), and
    `advance`, the fast path of a batch's commit."""

    def __init__(self) -> None:
        self._rows: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def set(self, code: int, row: int) -> None:
        if row < 0:
            raise ValueError(f"a frontier-table row is not negative, not {row}")
        self._rows[code] = row

    def get(self, code: int) -> int:
        return self._rows.get(code, -1)

    def advance(self, numbers: np.ndarray, topic_ids: np.ndarray, queue_ids: np.ndarray, firsts: np.ndarray, counts: np.ndarray,
                frontiers: np.ndarray, files_end: np.ndarray, pending: np.ndarray, skip: np.ndarray | None, rows: np.ndarray) -> int:
        n = len(firsts)
        bad = np.flatnonzero((topic_ids < 0) | (topic_ids >= len(numbers)))
        if len(bad):
            raise ValueError(f"run {bad[0]} names topic id {topic_ids[bad[0]]} of {len(numbers)}")
        codes = queue_codes_of(numbers, topic_ids, queue_ids)
        found = np.fromiter((self._rows.get(code, -1) for code in codes.tolist()), np.int64, n)
        if n and found.max() >= len(frontiers):
            i = int(np.argmax(found))
            raise ValueError(f"run {i}'s queue has row {found[i]}, past the table's {len(frontiers)}")
        known = np.maximum(found, 0)
        ends = firsts + counts
        fast = found >= 0
        if fast.any():
            fast &= (frontiers[known] == firsts) & ~pending[known] & (ends <= files_end[known])
        if skip is not None:
            fast &= ~skip
        frontiers[found[fast]] = ends[fast]
        rows[:] = np.where(fast, found, -2 - found)
        return n - int(np.count_nonzero(fast))


class QueueCommitter:
    """Advances the store's queues over the runs of slots of the batch at the head (`commit`),
    and starts the queues seen for the first time (`queue_at`)."""

    def __init__(self, queues: ConsumeQueueStore) -> None:
        self.queues = queues
        self._topic_numbers: dict[str, int] = {}
        # the queues' rows in the frontier table by code (topic number << 32 | queue id), and back
        self._rows = _RowIndex() if _RowIndex is not None else PythonRowIndex()
        self._row_keys: dict[int, QueueKey] = {}

    def queue_at(self, key: QueueKey, first: int) -> ConsumeQueue:
        """The queue of `key`; one seen for the first time is started at slot `first` (its files
        made by workers, or here)."""
        queues = self.queues
        cq = queues.queues.get(key)
        if cq is None or cq.is_empty:
            if cq is None:
                cq = queues.queues[key] = ConsumeQueue(queues.root, key[0], key[1], queues.units_per_file, load=False,
                                                       table=queues.frontiers)
            cq.adopt_files(first)
        return cq

    def commit(self, runs: QueueRuns, changes: dict[QueueKey, int], listeners: bool) -> None:
        """Commit the head batch's runs of slots.  A queue whose run starts at its frontier (the
        rule: every earlier batch is committed), with nothing pending and its files mapped, is
        advanced by `RowIndex.advance` with the others like it, in one pass (in a batch naming
        SMALL_COMMIT queues at most, one scalar assignment each); the others (new queues, runs
        that are not contiguous) one by one.  Every queue moved is in `changes` (key -> new
        frontier), those advanced together only when `listeners` (someone will be told)."""
        table = self.queues.frontiers
        names = runs.topic_names
        if len(runs) <= SMALL_COMMIT:
            # a few queues: each known queue whose run starts at its frontier advanced with a few
            # scalar reads and one write of its row (NumPy's setup would cost more than the work)
            numbers = self._numbers(names)
            row_of, extras = self._rows.get, runs.extras
            frontiers, files_end, pending = table.frontiers, table.files_end, table.pending
            row_keys = self._row_keys if listeners else None
            slow = []
            for i, (t, q, first, count) in enumerate(zip(runs.topic_ids.tolist(), runs.queue_ids.tolist(), runs.firsts.tolist(),
                                                         runs.counts.tolist())):
                code = (numbers[t] << 32) | (q & 0xFFFFFFFF)
                row = row_of(code)
                end = first + count
                if row >= 0 and frontiers[row] == first and end <= files_end[row] and not pending[row] and i not in extras:
                    frontiers[row] = end
                    if row_keys is not None:
                        changes[row_keys[row]] = end
                else:
                    slow.append((i, t, q, code, row, first, end))
            if not slow:
                return
        else:
            n = len(runs)
            numbers = np.array(self._numbers(names), dtype=np.int64)
            skip = None
            if runs.extras:
                skip = np.zeros(n, dtype=np.bool_)
                skip[list(runs.extras)] = True
            rows = np.empty(n, dtype=np.int64)
            left = self._rows.advance(numbers, runs.topic_ids, runs.queue_ids, runs.firsts, runs.counts, table.frontiers,
                                      table.files_end, table.pending, skip, rows)
            if listeners and left < n:
                fast = rows >= 0
                row_keys = self._row_keys
                changes.update(zip([row_keys[r] for r in rows[fast].tolist()], (runs.firsts[fast] + runs.counts[fast]).tolist()))
            if not left:
                return
            # as lists, not one NumPy scalar at a time: a batch may start thousands of new queues
            slow_at = np.flatnonzero(rows < 0)
            topic_ids = runs.topic_ids[slow_at]
            queue_ids = runs.queue_ids[slow_at]
            codes = queue_codes_of(numbers, topic_ids, queue_ids)
            firsts = runs.firsts[slow_at]
            slow = zip(slow_at.tolist(), topic_ids.tolist(), queue_ids.tolist(), codes.tolist(), (-2 - rows[slow_at]).tolist(),
                       firsts.tolist(), (firsts + runs.counts[slow_at]).tolist())
        queues = self.queues.queues
        upf = self.queues.units_per_file
        extras = runs.extras
        fresh: list[tuple[QueueKey, int, int, int]] = []  # new queues to adopt together: key, code, first, end
        for i, topic_id, queue_id, code, row, first, end in slow:
            key = (names[topic_id], queue_id)
            if row < 0 and not first % upf and end - first <= upf and key not in queues and i not in extras:
                # a new queue starting a file, its run in that file (10,000 in one batch of
                # bench/dispatch.py): adopted with the others below
                fresh.append((key, code, first, end))
                continue
            cq = self.queue_at(key, first)
            extra = extras.get(i)
            if cq.commit_range(first, end) | (extra is not None and self._commit_extra(cq, extra)):
                changes[key] = cq.commit_frontier
            if row != cq.row and cq.table is table:
                self._register(code, cq.row, key)
        if fresh:
            keys, codes, firsts, ends = zip(*fresh)
            adopted = ConsumeQueue.adopted_many(self.queues.root, upf, table, keys, firsts, ends)
            for key, code, end, cq in zip(keys, codes, ends, adopted):
                queues[key] = cq
                changes[key] = end
                self._register(code, cq.row, key)

    def _register(self, code: int, row: int, key: QueueKey) -> None:
        """The queue `key` (topic number << 32 | queue id: `code`) has frontier-table row `row`."""
        self._rows.set(code, row)
        self._row_keys[row] = key

    def _numbers(self, names: list[str]) -> list[int]:
        """The number of each topic of `names`, new ones numbered now: one dict lookup each, as a
        light queue is a topic of its own (a batch may name 10,000)."""
        numbers = list(map(self._topic_numbers.get, names))
        if None in numbers:
            numbers = [self._topic_number(t) if number is None else number for t, number in zip(names, numbers)]
        return numbers

    def _topic_number(self, topic: str) -> int:
        number = self._topic_numbers.get(topic)
        if number is None:
            number = self._topic_numbers[topic] = len(self._topic_numbers)
        return number

    @staticmethod
    def _commit_extra(cq: ConsumeQueue, extra: list[int]) -> bool:
        moved = False
        for slot in extra:
            moved = cq.commit_range(slot, slot + 1) or moved
        return moved
