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


class QueueCommitter:
    """Advances the store's queues over the runs of slots of the batch at the head (`commit`),
    and starts the queues seen for the first time (`queue_at`)."""

    def __init__(self, queues: ConsumeQueueStore) -> None:
        self.queues = queues
        # the queues' rows in the frontier table, by (topic number << 32 | queue id), sorted
        self._topic_numbers: dict[str, int] = {}
        self._code_of: dict[int, int] = {}
        self._codes = np.zeros(0, np.int64)
        self._code_rows = np.zeros(0, np.int64)
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
        advanced in one NumPy assignment for all of them (in a batch naming SMALL_COMMIT queues
        at most, one scalar assignment each); the others (new queues, runs that are not
        contiguous) one by one.  Every queue moved is in `changes` (key -> new frontier), those
        advanced together only when `listeners` (someone will be told)."""
        table = self.queues.frontiers
        if len(runs) <= SMALL_COMMIT:
            # a few queues: each known queue whose run starts at its frontier advanced with a few
            # scalar reads and one write of its row (NumPy's setup would cost more than the work)
            numbers = [self._topic_number(t) for t in runs.topic_names]
            code_of, extras = self._code_of, runs.extras
            frontiers, files_end, pending = table.frontiers, table.files_end, table.pending
            row_keys = self._row_keys if listeners else None
            slow = []
            for i, (t, q, first, count) in enumerate(zip(runs.topic_ids.tolist(), runs.queue_ids.tolist(), runs.firsts.tolist(),
                                                         runs.counts.tolist())):
                code = (numbers[t] << 32) | (q & 0xFFFFFFFF)
                row = code_of.get(code, -1)
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
            numbers = np.array([self._topic_number(t) for t in runs.topic_names], dtype=np.int64)
            code_array = (numbers[runs.topic_ids] << 32) | (runs.queue_ids.astype(np.int64) & 0xFFFFFFFF)
            first_array = runs.firsts
            end_array = first_array + runs.counts
            rows = np.full(len(code_array), -1, dtype=np.int64)
            if len(self._codes):
                at = np.minimum(np.searchsorted(self._codes, code_array), len(self._codes) - 1)
                rows = np.where(self._codes[at] == code_array, self._code_rows[at], -1)
            known = np.maximum(rows, 0)
            fast = (rows >= 0) & (table.frontiers[known] == first_array) & ~table.pending[known] & (end_array <= table.files_end[known])
            if runs.extras:
                fast[list(runs.extras)] = False
            fast_rows = known[fast]
            table.frontiers[fast_rows] = end_array[fast]  # one row per queue in a batch
            if listeners:
                row_keys = self._row_keys
                changes.update(zip([row_keys[r] for r in fast_rows.tolist()], end_array[fast].tolist()))
            slow_at = np.flatnonzero(~fast)
            if not len(slow_at):
                return
            # as lists, not one NumPy scalar at a time: a batch may start thousands of new queues
            slow = zip(slow_at.tolist(), runs.topic_ids[slow_at].tolist(), runs.queue_ids[slow_at].tolist(),
                       code_array[slow_at].tolist(), rows[slow_at].tolist(), first_array[slow_at].tolist(), end_array[slow_at].tolist())
        registered = False
        names = runs.topic_names
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
                registered = True
        if fresh:
            keys, codes, firsts, ends = zip(*fresh)
            adopted = ConsumeQueue.adopted_many(self.queues.root, upf, table, keys, firsts, ends)
            for key, code, end, cq in zip(keys, codes, ends, adopted):
                queues[key] = cq
                changes[key] = end
                self._register(code, cq.row, key)
            registered = True
        if registered:
            self._codes = np.fromiter(self._code_of.keys(), dtype=np.int64, count=len(self._code_of))
            self._code_rows = np.fromiter(self._code_of.values(), dtype=np.int64, count=len(self._code_of))
            order = np.argsort(self._codes)
            self._codes, self._code_rows = self._codes[order], self._code_rows[order]

    def _register(self, code: int, row: int, key: QueueKey) -> None:
        """The queue `key` (topic number << 32 | queue id: `code`) has frontier-table row `row`;
        `_codes` is sorted again after the batch's registrations."""
        self._code_of[code] = row
        self._row_keys[row] = key

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
