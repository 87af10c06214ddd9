"""KvQueue: one queue of the key-value tables (`kv.KvLightQueues`) seen as a QueueStore, the
contract every queue store keeps (`queues/contract.py`): slots written in any order, visible
below the commit frontier, truncated past a cut of the log, moved past deleted records.

The tables hold the queue's bounds (its row) and its units; the view holds only the slots
committed above a gap (`_pending`), which a reopen forgets, as it forgets units written and not
committed (they lie above the max offset, which reads never pass, and are written again before
the frontier can reach them).  Dispatch of multi-dispatched records writes the tables directly
(`KvLightQueues.write`, units in offset order); this view is for one queue at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..queues.consume_queue import Unit, offset_by_time
from .kv import KvLightQueues

LIGHT_QUEUE_ID = 0


class KvQueue:
    """The light queue `name` of `kv`; `owns_tables`: closing the view closes the tables."""

    def __init__(self, kv: KvLightQueues, name: str, owns_tables: bool = False) -> None:
        self.kv = kv
        self.topic = name
        self.queue_id = LIGHT_QUEUE_ID
        self._owns = owns_tables
        self._pending: set[int] = set()

    @classmethod
    def open(cls, directory: Path | str, name: str) -> KvQueue:
        return cls(KvLightQueues(directory), name, owns_tables=True)

    # -- bounds ----------------------------------------------------------------------------------

    def _bounds(self) -> tuple[int, int] | None:
        state = self.kv.state(self.topic)
        return (state.min_offset, state.max_offset) if state is not None else None

    @property
    def is_empty(self) -> bool:
        return self._bounds() is None

    @property
    def min_offset(self) -> int:
        bounds = self._bounds()
        return bounds[0] if bounds is not None else 0

    @property
    def commit_frontier(self) -> int:
        bounds = self._bounds()
        return bounds[1] if bounds is not None else 0

    @property
    def max_offset(self) -> int:
        return self.commit_frontier

    @property
    def max_physical_offset(self) -> int:
        bounds = self._bounds()
        if bounds is None or bounds[1] <= bounds[0]:
            return 0
        last = self.kv.unit(self.topic, bounds[1] - 1)
        return last[0] + last[1] if last is not None else 0

    # -- writing --------------------------------------------------------------------------------

    def initialize_at(self, first_offset: int) -> None:
        if not self.kv.create(self.topic, first_offset):
            raise ValueError(f"light queue {self.topic} already exists")
        self._pending.clear()

    def write(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        bounds = self._bounds()
        if bounds is None:
            self.initialize_at(0)
            bounds = (0, 0)
        if queue_offset < bounds[1]:
            return False
        self.kv.put_unit(self.topic, queue_offset, commit_log_offset, size, tags_code)
        return True

    def commit(self, queue_offset: int) -> bool:
        frontier = self.commit_frontier
        if queue_offset != frontier:
            if queue_offset > frontier:
                self._pending.add(queue_offset)
            return False
        frontier += 1
        while frontier in self._pending:
            self._pending.remove(frontier)
            frontier += 1
        self.kv.set_bounds(self.topic, max_offset=frontier)
        return True

    def put(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        if not self.write(queue_offset, commit_log_offset, size, tags_code):
            return False
        return self.commit(queue_offset)

    # -- reading --------------------------------------------------------------------------------

    def read(self, queue_offset: int, max_count: int) -> list[Unit]:
        return self.kv.read_from(self.topic, queue_offset, max_count, -1)[2]

    def offset_for_timestamp(
        self, timestamp: int, store_time_of: Callable[[int], int | None], upper: bool = False
    ) -> int:
        """As `ConsumeQueue.offset_for_timestamp`, the store times read with `store_time_of`."""
        bounds = self._bounds()
        if bounds is None or bounds[1] <= bounds[0]:
            return bounds[0] if bounds is not None else 0
        low, high = bounds

        def time_at(slot: int) -> int:
            unit = self.kv.unit(self.topic, slot)
            found = store_time_of(unit[0]) if unit is not None else None
            return -1 if found is None else found

        return offset_by_time(low, high, time_at, timestamp, upper)

    # -- maintenance ----------------------------------------------------------------------------

    def truncate(self, commit_log_end: int) -> int:
        """Drop the units whose record starts at or past `commit_log_end`; returns how many
        slots.  Units' records are in offset order: the first such slot is found by a binary
        search."""
        bounds = self._bounds()
        self._pending.clear()
        if bounds is None:
            return 0
        low, high = bounds
        left, right = low, high
        while left < right:
            middle = (left + right) // 2
            unit = self.kv.unit(self.topic, middle)
            if unit is not None and unit[0] >= commit_log_end:
                right = middle
            else:
                left = middle + 1
        self.kv.drop_units_from(self.topic, left)
        self.kv.set_bounds(self.topic, max_offset=left)
        return high - left

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        first = self.kv.readable_min(self.topic, min_commit_log_offset)
        if first > self.min_offset:
            self.kv.set_bounds(self.topic, min_offset=first)

    def flush(self) -> None:
        self.kv.flush()

    def close(self) -> None:
        if self._owns:
            self.kv.close()
