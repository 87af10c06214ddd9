"""FIFO: message groups, their queues, and in-order delivery to FIFO consumer groups.

Sending: a message's `message_group` (stored as `__SHARDINGKEY`) picks its queue by hash, the
way RocketMQ's gRPC proxy does (Guava's consistent hash of Java's `String.hashCode`), so that a
store moved between tidemq and RocketMQ keeps each message group on one queue.

Consuming (a group made FIFO, RocketMQ's `consumeMessageOrderly`): within a queue, the messages
of one message group form a chain, oldest first.  Only a chain's head is ever delivered; the
messages behind it are read (so the read cursor moves past them and other message groups are not
blocked behind them) but *held*: they sit in the in-flight table with attempt 0 and the deadline
`HELD`, which never comes due and no receipt handle names.  When the head is done (acked, dead-
lettered, filtered out, gone), the next message of its chain is *released*: its deadline becomes
0, so the next pop delivers it as attempt 1.  A head that is not acked in time comes due and is
delivered again, still ahead of its chain, so retries and dead letters keep the order.
Messages without a message group form one chain per queue (RocketMQ's queue order).

`FifoState` is derived data: the journal records held entries as ordinary deliveries, and the
chains are rebuilt from the in-flight table (reading each entry's record for its message group)
at the first FIFO pop after a start.  Owned by the broker's event loop, like the table itself."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..store import MessageStore, record

if TYPE_CHECKING:
    from .pop_state import Subscription

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
HELD = 1 << 62  # invisible_until of a held entry: never due
RELEASED = 0  # invisible_until of a released entry: due at once
MAX_PENDING_PER_QUEUE = 4096  # held and in-flight entries a queue may have before its scan stops

_MASK64 = (1 << 64) - 1


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode`: 31-polynomial over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def consistent_hash(key: int, buckets: int) -> int:
    """Guava's `Hashing.consistentHash(long, int)`: a bucket in [0, buckets) for `key`, moving
    only 1/n of the keys when a bucket is added (a linear congruential generator drives the jumps)."""
    if buckets <= 0:
        raise ValueError(f"buckets must be positive, not {buckets}")
    state = key & _MASK64
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & _MASK64
        # (int)(state >>> 33) + 1, divided by 2^31
        draw = ((state >> 33) + 1) / 2147483648.0
        jump = int((candidate + 1) / draw)
        if 0 <= jump < buckets:
            candidate = jump
        else:
            return candidate


def queue_for_group(message_group: str, queue_nums: int) -> int:
    return consistent_hash(java_string_hash(message_group), queue_nums)


def message_group_of(rec: record.Record) -> str:
    return rec.properties.get(PROPERTY_SHARDING_KEY, "")


class FifoState:
    """The chains of one FIFO subscription (one consumer group on one topic)."""

    __slots__ = ("sub", "wake", "chains", "chain_of", "pending")

    def __init__(self, sub: Subscription, wake: Callable[[], None]) -> None:
        self.sub = sub
        self.wake = wake  # tells the topic's waiting receivers that a message was released
        self.chains: dict[tuple[int, str], deque[int]] = {}  # (qid, message group) -> offsets not done
        self.chain_of: dict[tuple[int, int], tuple[int, str]] = {}  # (qid, offset) -> its chain
        self.pending: dict[int, int] = {}  # qid -> entries in its chains

    @classmethod
    def rebuild(cls, sub: Subscription, store: MessageStore, wake: Callable[[], None]) -> FifoState:
        """Chains from the in-flight table.  A held head (its predecessor finished before a
        restart) is released; an entry whose record is gone forms its own chain, so that it comes
        due and is dropped."""
        state = cls(sub, wake)
        for qid, q in sorted(sub.queues.items()):
            for offset in sorted(q.in_flight):
                d = q.in_flight[offset]
                rec = store.read_record(d.commit_log_offset, with_body=False)
                group = message_group_of(rec) if rec is not None else f"\0gone {offset}"
                state._append(qid, offset, group)
        for (qid, _), chain in state.chains.items():
            head = sub.queues[qid].in_flight[chain[0]]
            if head.attempt == 0:
                sub.set_invisible(qid, head.queue_offset, RELEASED, head.generation, "")
        sub.fifo = state
        return state

    def _append(self, qid: int, offset: int, group: str) -> bool:
        """Add an entry at its chain's tail; True when it is the head (nothing before it)."""
        key = (qid, group)
        chain = self.chains.get(key)
        if chain is None:
            chain = self.chains[key] = deque()
        chain.append(offset)
        self.chain_of[(qid, offset)] = key
        self.pending[qid] = self.pending.get(qid, 0) + 1
        return len(chain) == 1

    def admit(self, qid: int, offset: int, rec: record.Record) -> bool:
        """A newly read entry joins its chain: True to deliver it now (it is the head), False to
        hold it behind an earlier message of its group."""
        return self._append(qid, offset, message_group_of(rec))

    def has_room(self, qid: int) -> bool:
        return self.pending.get(qid, 0) < MAX_PENDING_PER_QUEUE

    def finished(self, qid: int, offset: int) -> None:
        """The entry is done: release the next message of its chain."""
        key = self.chain_of.pop((qid, offset), None)
        if key is None:
            return
        chain = self.chains[key]
        if chain[0] == offset:
            chain.popleft()
        else:
            chain.remove(offset)
        self.pending[qid] -= 1
        if not chain:
            del self.chains[key]
            return
        q = self.sub.queues.get(qid)
        d = q.in_flight.get(chain[0]) if q is not None else None
        if d is not None and d.invisible_until == HELD:
            self.sub.set_invisible(qid, d.queue_offset, RELEASED, d.generation, "")
            self.wake()

    def release_all(self) -> int:
        """The group is no longer FIFO: every held entry becomes due now.  Returns how many."""
        released = 0
        for qid, q in self.sub.queues.items():
            for d in q.in_flight.values():
                if d.invisible_until == HELD:
                    self.sub.set_invisible(qid, d.queue_offset, RELEASED, d.generation, "")
                    released += 1
        self.sub.fifo = None
        if released:
            self.wake()
        return released


def has_held(sub: Subscription) -> bool:
    return any(d.invisible_until == HELD for q in sub.queues.values() for d in q.in_flight.values())
