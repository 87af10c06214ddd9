"""Consumed offsets kept where RocketMQ keeps them (`config/consumerOffset.json`, offsetTable
`topic@group` -> {queue id: next offset to consume}), so a group continues where it left off
after its store moves between tidemq and RocketMQ.

The pop journal stays the record of tidemq's own progress (it also knows what is in flight); the
file is written from it periodically and at shutdown.  On start, an offset in the file beyond a
queue's consumed offset in the journal means another broker consumed the store meanwhile: the
queue moves up to it, and deliveries still in flight below it are dropped (they were consumed
there).  A queue the journal does not know starts at the file's offset.  RocketMQ's pop
consumers commit an offset at pop time, tidemq's consumed offset is the lowest unacked one: a
message in flight when the store moves is delivered again, never lost.
"""

from __future__ import annotations

from collections.abc import Iterable

from .config_files import ConsumerOffsets
from .pop_state import Subscription

__all__ = ["ConsumerOffsets", "adopt_offsets", "consumed_offsets"]


def adopt_offsets(
    subscriptions: dict[tuple[str, str], Subscription], offsets: dict[tuple[str, str], dict[int, int]]
) -> None:
    """Move the subscriptions ((group, topic) -> Subscription) up to the file's offsets."""
    for (group, topic), queues in offsets.items():
        sub = subscriptions.get((group, topic))
        if sub is None:
            sub = subscriptions[(group, topic)] = Subscription(group, topic)
        for qid, offset in queues.items():
            q = sub.queues.get(qid)
            if q is None:
                sub.queue(qid, offset)
                continue
            if offset <= q.consumed_offset:
                continue
            for in_flight in [o for o in q.in_flight if o < offset]:
                sub.finish(qid, in_flight)
            if offset > q.cursor:
                q.cursor = offset


def consumed_offsets(subscriptions: Iterable[Subscription]) -> dict[tuple[str, str], dict[int, int]]:
    """(group, topic) -> {queue id: consumed offset} of every subscription."""
    return {
        (sub.group, sub.topic): {qid: q.consumed_offset for qid, q in sub.queues.items()}
        for sub in subscriptions
        if sub.queues
    }
