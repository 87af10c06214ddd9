"""Priority topics (RIP-80): one consume queue per priority level, popped highest level first.

A PRIORITY topic of N levels has N queues, as in RocketMQ 5.5.0, where the level count is the
topic's queue count.  A message of priority p (0 is the lowest; a higher value is more urgent) is
stored in queue min(p, N - 1), so a value above the maximum counts as the maximum, with p itself
in the record property `_SYS_MSG_PRIORITY_`, which every delivery reports back.

Pop order (`PriorityPop.fill`), one pop at a time for all consumers of a group: levels from
N - 1 down to 0; a lower level is read only when every higher one has nothing visible left for the
pop (empty, or in flight).  Within a level, its due redeliveries and its fresh entries come in the
order the retry policy says.  A redelivery keeps its level, so it always comes before every
message of a lower level (RocketMQ's shared retry topic drops the level: apache/rocketmq#10350).

Retry policy, `retry_first_percent` (the broker option RocketMQ calls
popFromRetryProbabilityForPriority): the share of pops, in percent, that serve a level's due
redeliveries before its fresh entries.  0, the default, ranks a redelivery just below the fresh
messages of its own level (RocketMQ's default ranks retries below fresh messages); 100 ranks it
just above them.

Due redeliveries: a subscription keeps one due heap for all its queues.  `fill` moves the due ones
into heaps per level, held here, so that a level's redeliveries are taken in deadline order without
sorting the others again.  A held entry is checked when it is taken: its delivery must still be in
flight with the generation and deadline it had (an auto-renewal, a change of invisible time or a
move to the dead-letter queue makes it stale).  `hand_back` returns the held entries to the
subscription's heap when its topic is no longer a priority topic.

Owned by the broker's event loop; no locks."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .pop_state import Delivery, Subscription

PROPERTY_PRIORITY = "_SYS_MSG_PRIORITY_"  # RocketMQ's MessageConst.PROPERTY_PRIORITY
DEFAULT_LEVELS = 10  # priorities 0-9
_INT32_MAX = 2**31 - 1

DueEntry = tuple[
    int, int, int, int
]  # (invisible_until, queue_id, queue_offset, generation), as the subscription's heap


def queue_of(priority: int, levels: int) -> int:
    """The queue (level) of a message of `priority` on a topic of `levels` levels."""
    return min(priority, levels - 1)


def parse(value: str | None) -> int | None:
    """A stored `_SYS_MSG_PRIORITY_` value as a priority, or None when it is absent or not a
    non-negative 32-bit decimal (RocketMQ then reads no priority: getPriority() is -1)."""
    if not value or not value.isascii() or not value.isdigit():
        return None
    priority = int(value)
    return priority if priority <= _INT32_MAX else None


class PriorityPop:
    """The pop order of priority topics, with the due redeliveries it holds per subscription."""

    def __init__(self, retry_first_percent: int = 0) -> None:
        if not 0 <= retry_first_percent <= 100:
            raise ValueError(f"retry-first percentage {retry_first_percent} outside [0, 100]")
        self.retry_first_percent = retry_first_percent
        self._pops = 0
        self._held: dict[tuple[str, str], dict[int, list[DueEntry]]] = {}  # per subscription, per level

    def fill(
        self,
        sub: Subscription,
        levels: int,
        batch: int,
        out: list,
        now: int,
        redeliver: Callable[[Delivery], None],
        pop_fresh: Callable[[int], bool],
    ) -> None:
        """Add to `out`, up to `batch`, what the subscription delivers next: levels from the
        highest down.  `redeliver(d)` delivers a due delivery again (or drops or dead-letters
        it); `pop_fresh(level)` delivers that queue's new entries and returns True when it left
        entries unexamined (scan limit), which stops the descent: a lower level never goes
        ahead of what a higher one may still hold."""
        held = self._collect(sub, now, levels)
        self._pops += 1
        retry_first = self._pops % 100 < self.retry_first_percent
        for level in range(levels - 1, -1, -1):
            if len(out) >= batch:
                break
            due = held.get(level) if held else None
            if retry_first and due:
                self._serve(sub, due, batch, out, redeliver)
            if len(out) < batch and pop_fresh(level):
                break
            if not retry_first and due:
                self._serve(sub, due, batch, out, redeliver)
        if held is not None and not any(held.values()):
            del self._held[(sub.group, sub.topic)]

    def _collect(self, sub: Subscription, now: int, levels: int) -> dict[int, list[DueEntry]] | None:
        """Move the subscription's due deliveries into the held heaps of their levels (a queue
        beyond the top level counts as the top level)."""
        key = (sub.group, sub.topic)
        held = self._held.get(key)
        top = levels - 1
        while True:
            d = sub.pop_due(now)
            if d is None:
                return held
            if held is None:
                held = self._held[key] = {}
            entry = (d.invisible_until, d.queue_id, d.queue_offset, d.generation)
            heapq.heappush(held.setdefault(min(d.queue_id, top), []), entry)

    def _serve(
        self, sub: Subscription, due: list[DueEntry], batch: int, out: list, redeliver: Callable[[Delivery], None]
    ) -> None:
        while due and len(out) < batch:
            d = sub.current(heapq.heappop(due))
            if d is not None:
                redeliver(d)

    def hand_back(self, sub: Subscription) -> None:
        """Return the due deliveries held for `sub` to its own heap (its topic is no longer a
        priority topic); a no-op when none are held."""
        held = self._held.pop((sub.group, sub.topic), None) if self._held else None
        for due in (held or {}).values():
            for entry in due:
                d = sub.current(entry)
                if d is not None:  # the same deadline and generation: only its heap entry is new
                    sub.set_invisible(d.queue_id, d.queue_offset, d.invisible_until, d.generation, d.renew_owner)

    def held_count(self) -> int:
        """How many due entries are held (stale ones included)."""
        return sum(len(due) for held in self._held.values() for due in held.values())
