"""The in-flight table of pop consumption: every transition of a delivery's life lives here.

Per (group, topic) a `Subscription` holds, per queue, the read `cursor` (next offset never
delivered) and the `in_flight` deliveries below it.  Everything below the cursor that is not in
flight is done: acked, filtered out, or moved to the dead-letter queue.  So a queue's consumed
offset is the lowest in-flight offset, or the cursor when nothing is in flight.

A delivery:  popped (attempt 1, invisible until T) --ack--> gone
                 | deadline passes                   --change_invisible--> new deadline, new handle
                 v
             due --redeliver--> attempt + 1 ...   or, past max attempts --> dead-lettered (gone)

A FIFO group's subscription (`fifo` set, see fifo.py) also keeps entries read but held behind an
earlier message of their message group: attempt 0, a deadline that never comes due; finishing the
earlier one releases the next (deadline 0: due at once), which is then delivered as attempt 1.

Receipt handles are `"{queue_id}.{queue_offset}.{generation}"`; a handle is valid while its
delivery is in flight with that generation and its deadline has not passed.  Internal renewals
(auto-renew for push consumers) keep the generation, so the original handle stays valid.

Owned by the broker's event loop; no locks.  Every mutation is also returned as a journal entry
by the caller (`Broker`) so that `replay` rebuilds the same table after a restart."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fifo import FifoState


@dataclass(slots=True)
class Delivery:
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    attempt: int  # 1 for the first delivery
    invisible_until: int  # ms
    generation: int
    renew_owner: str = ""  # client id of a push consumer that asked for auto-renew, "" otherwise
    first_popped: int = 0  # ms, bounds auto-renewal

    @property
    def handle(self) -> str:
        return f"{self.queue_id}.{self.queue_offset}.{self.generation}"


@dataclass(slots=True)
class QueueProgress:
    cursor: int
    in_flight: dict[int, Delivery] = field(default_factory=dict)

    @property
    def consumed_offset(self) -> int:
        return min(self.in_flight) if self.in_flight else self.cursor


def parse_handle(handle: str) -> tuple[int, int, int] | None:
    parts = handle.split(".")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        return None


_COMPACT_MIN = 4096  # due-heap entries below which stale ones are never dropped


class Subscription:
    """Pop progress of one consumer group on one topic."""

    __slots__ = ("group", "topic", "queues", "_due", "_compact_at", "fifo", "dead_after", "_last")

    def __init__(self, group: str, topic: str) -> None:
        self.group = group
        self.topic = topic
        self.queues: dict[int, QueueProgress] = {}
        self._due: list[tuple[int, int, int, int]] = []  # (invisible_until, qid, offset, generation), lazily stale
        self._compact_at = _COMPACT_MIN  # heap length at which stale entries are next counted
        self.fifo: FifoState | None = None  # while the group is FIFO: its message-group chains
        # deliveries on their last allowed attempt (attempt >= dead_after), as _due: what the
        # broker's revive moves to the dead-letter queue once due, whether or not anyone polls
        self.dead_after: int | None = None  # the group's max delivery attempts; None: not yet told
        self._last: list[tuple[int, int, int, int]] = []

    def queue(self, qid: int, start: int) -> QueueProgress:
        q = self.queues.get(qid)
        if q is None:
            q = self.queues[qid] = QueueProgress(start)
        return q

    # -- transitions ----------------------------------------------------------------------------

    def deliver(self, d: Delivery) -> None:
        """Record a delivery (first or again) of the entry at `d.queue_offset`."""
        q = self.queue(d.queue_id, d.queue_offset)
        q.in_flight[d.queue_offset] = d
        if d.queue_offset >= q.cursor:
            q.cursor = d.queue_offset + 1
        heapq.heappush(self._due, (d.invisible_until, d.queue_id, d.queue_offset, d.generation))
        if self.dead_after is not None and d.attempt >= self.dead_after:
            heapq.heappush(self._last, (d.invisible_until, d.queue_id, d.queue_offset, d.generation))
        self._compact_due()

    def _compact_due(self) -> None:
        """Drop stale heap entries once they outnumber the live ones four to one (renewals leave
        many; the last-attempt heap never holds more entries than the due heap).  Counting the
        live ones walks every queue, so it is done each time the heap has doubled since the last
        count, not on every push."""
        if len(self._due) < self._compact_at:
            return
        if len(self._due) > 4 * self.in_flight_count():
            self._due = [
                (d.invisible_until, d.queue_id, d.queue_offset, d.generation)
                for q in self.queues.values()
                for d in q.in_flight.values()
            ]
            heapq.heapify(self._due)
            if self.dead_after is not None:
                max_attempts, self.dead_after = self.dead_after, None
                self.set_dead_after(max_attempts)
        self._compact_at = max(_COMPACT_MIN, 2 * len(self._due))

    def advance(self, qid: int, cursor: int) -> None:
        """Entries below `cursor` that were not delivered are done (filtered out or skipped)."""
        q = self.queue(qid, cursor)
        if cursor > q.cursor:
            q.cursor = cursor

    def finish(self, qid: int, offset: int) -> Delivery | None:
        """Ack, dead-letter, or drop: the entry is done for good (a FIFO group's next message of
        the same message group is released)."""
        q = self.queues.get(qid)
        d = q.in_flight.pop(offset, None) if q is not None else None
        if d is not None and self.fifo is not None:
            self.fifo.finished(qid, offset)
        return d

    def set_invisible(self, qid: int, offset: int, until: int, generation: int, renew_owner: str) -> Delivery | None:
        q = self.queues.get(qid)
        d = q.in_flight.get(offset) if q is not None else None
        if d is None:
            return None
        d.invisible_until = until
        d.generation = generation
        d.renew_owner = renew_owner
        heapq.heappush(self._due, (until, qid, offset, generation))
        if self.dead_after is not None and d.attempt >= self.dead_after:
            heapq.heappush(self._last, (until, qid, offset, generation))
        self._compact_due()
        return d

    def set_dead_after(self, max_attempts: int) -> None:
        """The group's max delivery attempts (again when it changed): which deliveries are on
        their last attempt."""
        if max_attempts == self.dead_after:
            return
        self.dead_after = max_attempts
        self._last = [
            (d.invisible_until, d.queue_id, d.queue_offset, d.generation)
            for q in self.queues.values()
            for d in q.in_flight.values()
            if d.attempt >= max_attempts
        ]
        heapq.heapify(self._last)

    def pop_due_last(self, now: int) -> list[Delivery]:
        """The deliveries on their last attempt whose deadline has passed (due for the dead-letter
        queue), removed from that heap; they stay in flight."""
        out = []
        last = self._last
        while last and last[0][0] <= now:
            d = self.current(heapq.heappop(last))
            if d is not None:
                out.append(d)
        return out

    def current(self, entry: tuple[int, int, int, int]) -> Delivery | None:
        """The delivery a heap entry (invisible_until, qid, offset, generation) stands for, if the
        entry is not stale."""
        until, qid, offset, generation = entry
        q = self.queues.get(qid)
        d = q.in_flight.get(offset) if q is not None else None
        if d is not None and d.generation == generation and d.invisible_until == until:
            return d
        return None

    # -- queries --------------------------------------------------------------------------------

    def lookup(self, handle: str, now: int) -> Delivery | None:
        """The delivery a receipt handle names, if it is still valid."""
        parsed = parse_handle(handle)
        if parsed is None:
            return None
        qid, offset, generation = parsed
        q = self.queues.get(qid)
        d = q.in_flight.get(offset) if q is not None else None
        if d is None or d.generation != generation or d.invisible_until <= now or d.attempt == 0:
            return None  # attempt 0: a FIFO entry held or released, never handed out
        return d

    def pop_due(self, now: int) -> Delivery | None:
        """The next delivery whose deadline has passed, removed from the due heap."""
        due = self._due
        while due and due[0][0] <= now:
            d = self.current(heapq.heappop(due))
            if d is not None:
                return d
        return None

    def next_due(self) -> int | None:
        """Earliest deadline among in-flight deliveries (may be a stale entry: only a hint)."""
        due = self._due
        while due:
            if self.current(due[0]) is not None:
                return due[0][0]
            heapq.heappop(due)
        return None

    def in_flight_count(self) -> int:
        return sum(len(q.in_flight) for q in self.queues.values())
