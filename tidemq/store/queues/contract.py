"""QueueStore: the contract of the index of one queue, whatever stores it.

A queue is a sequence of slots (queue offsets).  Each slot holds one unit: where its message
is in the commit log (offset and size) and its tags code.  Queue offsets are assigned when a
message is appended, so dispatch writes each unit **at its slot**, and may write slots out of
order (parallel dispatch).  Readers see only the slots below the **commit frontier**: the first
slot not yet committed, so they never see a gap or a reordering.

- `initialize_at(first)` starts an empty queue at slot `first` (a queue whose first message
  is not at offset 0); the slots below it are never read.
- `write` stores a unit at its slot and `commit` marks the slot complete; `put` does both.
  Each answers whether the frontier moved; a slot below the frontier is left as it is.
- `read(offset, max_count)` returns the units from `offset` (raised to `min_offset`) up to the
  frontier, at most `max_count` slots' worth, without padding slots.
- `min_offset` is the first readable slot; `max_offset` is the frontier (exclusive).
- `offset_for_timestamp` finds a slot by its message's store time (spec §2).
- `truncate(end)` forgets the units whose record starts at or past commit-log offset `end`
  (recovery cut the log there); `correct_min_offset(start)` moves the minimum past units whose
  records are gone (retention deleted the log below `start`).
- `max_physical_offset` is the end of the furthest record indexed: recovery re-dispatches from
  the smallest such end over the queues.
- A store that is closed and opened again (the same directory) holds every committed unit and
  no uncommitted one.

One writer at a time (the dispatching thread); readers may be on any thread.  The file
ConsumeQueue (`consume_queue.ConsumeQueue`) is one implementation; tests run one contract suite
over every implementation (`tests/store/test_queue_store_contract.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .consume_queue import Unit


@runtime_checkable
class QueueStore(Protocol):
    topic: str
    queue_id: int
    min_offset: int
    max_physical_offset: int

    @property
    def is_empty(self) -> bool:
        """Nothing was ever stored (or the queue was destroyed)."""
        ...

    @property
    def commit_frontier(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def initialize_at(self, first_offset: int) -> None: ...

    def write(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool: ...

    def commit(self, queue_offset: int) -> bool: ...

    def put(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool: ...

    def read(self, queue_offset: int, max_count: int) -> list[Unit]: ...

    def offset_for_timestamp(
        self, timestamp: int, store_time_of: Callable[[int], int | None], upper: bool = False
    ) -> int: ...

    def truncate(self, commit_log_end: int) -> int: ...

    def correct_min_offset(self, min_commit_log_offset: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
