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

from typing import TYPE_CHECKING, cast

import numpy as np

from ..queues.consume_queue import ConsumeQueue
from ..queues.queue_set import ConsumeQueueStore
from .messages import QueueRuns
from .requests import QueueKey

if TYPE_CHECKING:
    from .._dispatch import RowIndex

_RowIndex: type[RowIndex] | None
try:
    from .._dispatch import RowIndex as _RowIndex
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

    def advance(
        self,
        numbers: np.ndarray,
        topic_ids: np.ndarray,
        queue_ids: np.ndarray,
        firsts: np.ndarray,
        counts: np.ndarray,
        frontiers: np.ndarray,
        files_end: np.ndarray,
        pending: np.ndarray,
        skip: np.ndarray | None,
        rows: np.ndarray,
    ) -> int:
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
        self._row_keys: list[QueueKey | None] = []  # by row

    def queue_at(self, key: QueueKey, first: int) -> ConsumeQueue:
        """The queue of `key`; one seen for the first time is started at slot `first` (its files
        made by workers, or here)."""
        queues = self.queues
        cq = queues.queues.get(key)
        if cq is None or cq.is_empty:
            if cq is None:
                cq = queues.queues[key] = ConsumeQueue(
                    queues.root_name, key[0], key[1], queues.units_per_file, load=False, table=queues.frontiers
                )
            cq.adopt_files(first)
        return cq

    def commit(self, runs: QueueRuns, changes: dict[QueueKey, int], listeners: bool) -> None:
        """Commit the head batch's runs of slots.  A queue whose run starts at its frontier (the
        rule: every earlier batch is committed), with nothing pending and its files mapped, is
        advanced by `RowIndex.advance` with the others like it, in one pass; new queues starting
        a file are started together (`_adopt`); the others (runs that are not contiguous,
        new queues starting mid-file) one by one.  Every queue moved is in `changes` (key -> new
        frontier), those advanced together only when `listeners` (someone will be told)."""
        table = self.queues.frontiers
        names = runs.topic_names
        n = len(runs)
        number_column = np.array(self._numbers(names), dtype=np.int64)
        skip = None
        if runs.extras:
            skip = np.zeros(n, dtype=np.bool_)
            skip[list(runs.extras)] = True
        rows = np.empty(n, dtype=np.int64)
        left = self._rows.advance(
            number_column,
            runs.topic_ids,
            runs.queue_ids,
            runs.firsts,
            runs.counts,
            table.frontiers,
            table.files_end,
            table.pending,
            skip,
            rows,
        )
        if listeners and left < n:
            fast = rows >= 0
            row_keys = self._row_keys
            changes.update(
                zip([row_keys[r] for r in rows[fast].tolist()], (runs.firsts[fast] + runs.counts[fast]).tolist())
            )
        if not left:
            return
        slow_at = np.flatnonzero(rows < 0)
        upf = self.queues.units_per_file
        # new queues starting a file, each run in that file (a batch may start thousands):
        # adopted together
        new = (rows[slow_at] == -1) & (runs.firsts[slow_at] % upf == 0) & (runs.counts[slow_at] <= upf)
        if skip is not None:
            new &= ~skip[slow_at]
        if new.any():
            known = self._adopt(names, number_column, runs, slow_at[new], changes)
            slow_at = np.union1d(slow_at[~new], known) if len(known) else slow_at[~new]
        # as lists, not one NumPy scalar at a time
        topic_ids = runs.topic_ids[slow_at]
        queue_ids = runs.queue_ids[slow_at]
        codes = queue_codes_of(number_column, topic_ids, queue_ids)
        firsts = runs.firsts[slow_at]
        slow = zip(
            slow_at.tolist(),
            topic_ids.tolist(),
            queue_ids.tolist(),
            codes.tolist(),
            (-2 - rows[slow_at]).tolist(),
            firsts.tolist(),
            (firsts + runs.counts[slow_at]).tolist(),
        )
        extras = runs.extras
        for i, topic_id, queue_id, code, row, first, end in slow:
            key = (names[topic_id], queue_id)
            cq = self.queue_at(key, first)
            extra = extras.get(i)
            if cq.commit_range(first, end) | (extra is not None and self._commit_extra(cq, extra)):
                changes[key] = cq.commit_frontier
            if row != cq.row and cq.table is table:
                self._register(code, cq.row, key)

    def _adopt(
        self, names: list[str], numbers: np.ndarray, runs: QueueRuns, at: np.ndarray, changes: dict[QueueKey, int]
    ) -> np.ndarray:
        """Start the queues of runs `at` (each unknown to the row index, its run in one file
        starting at its first slot, without extras) together (`ConsumeQueue.adopted_many`), but
        for those the store already has (loaded from disk, not committed here yet): the runs of
        these are returned, to be committed one by one."""
        queues = self.queues.queues
        topic_ids, queue_ids = runs.topic_ids[at], runs.queue_ids[at]
        keys = list(zip(map(names.__getitem__, topic_ids.tolist()), queue_ids.tolist()))
        known = np.zeros(0, dtype=at.dtype)
        if not queues.keys().isdisjoint(keys):
            had = np.fromiter(map(queues.__contains__, keys), dtype=bool, count=len(keys))
            known, at, topic_ids, queue_ids = at[had], at[~had], topic_ids[~had], queue_ids[~had]
            keys = [key for key, old in zip(keys, had.tolist()) if not old]
            if not keys:
                return known
        firsts = runs.firsts[at]
        ends = (firsts + runs.counts[at]).tolist()
        adopted = ConsumeQueue.adopted_many(
            self.queues.root_name, self.queues.units_per_file, self.queues.frontiers, keys, firsts.tolist(), ends
        )
        queues.update(zip(keys, adopted))
        changes.update(zip(keys, ends))
        rows = range(adopted[0].row, adopted[0].row + len(keys))  # taken together
        set_row = self._rows.set
        for code, row in zip(queue_codes_of(numbers, topic_ids, queue_ids).tolist(), rows):
            set_row(code, row)
        self._row_keys_to(rows.stop)[rows.start : rows.stop] = keys
        return known

    def _register(self, code: int, row: int, key: QueueKey) -> None:
        """The queue `key` (topic number << 32 | queue id: `code`) has frontier-table row `row`."""
        self._rows.set(code, row)
        self._row_keys_to(row + 1)[row] = key

    def _row_keys_to(self, stop: int) -> list[QueueKey | None]:
        """The keys by row, the list grown to `stop` rows at least (rows the committer has not
        registered hold None)."""
        row_keys = self._row_keys
        if len(row_keys) < stop:
            row_keys.extend([None] * (stop - len(row_keys)))
        return row_keys

    def _numbers(self, names: list[str]) -> list[int]:
        """The number of each topic of `names`, new ones numbered now, in order: one dict lookup
        each, as a light queue is a topic of its own (a batch may name 10,000)."""
        known = self._topic_numbers
        numbers = list(map(known.get, names))
        if None in numbers:
            for i, number in enumerate(numbers):
                if number is None:
                    numbers[i] = known.setdefault(names[i], len(known))
        return cast("list[int]", numbers)  # each None numbered above

    @staticmethod
    def _commit_extra(cq: ConsumeQueue, extra: list[int]) -> bool:
        moved = False
        for slot in extra:
            moved = cq.commit_range(slot, slot + 1) or moved
        return moved
