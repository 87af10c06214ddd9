"""Expiry of idle, fully consumed light queues with the consumers' progress on them.

The store deletes a queue; the broker's pop journal holds each group's progress on it (a cursor,
deliveries).  A queue of the same name made again later starts at offset 0, so a position that
outlives its queue would make its group read past the new queue's first messages.  Hence the
order, one run on the event loop, of each chunk of queues the store finds expired:

1. `forgotten`: an `["x", group, queue]` journal line a (group, queue) pair, the pair taken out of
   the broker's table, the journal fsynced;
2. `deleted`: the store deletes, in one LMDB transaction under its append lock, those queues
   still expired (a message or an offset assigned since keeps a queue alive);
3. a queue kept alive gets its progress back (a `p` journal line of its cursor and deliveries);
   the deleted ones' subscribers are told.

A crash before 1 is done changes nothing; one between 1 and 3 leaves a queue with no progress
on it (its messages are delivered again from its first: redelivery, never loss) or no queue and
no progress (a new queue is read from offset 0).  No crash leaves progress without its queue."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, cast

from .pop_journal import delivery_fields
from .pop_state import Subscription

if TYPE_CHECKING:
    from .lite import Lite

log = logging.getLogger(__name__)

STEPS = ("forgotten", "deleted")  # the crash points `BrokerConfig.expiry_faults` hears of


class ExpiryFaults(Protocol):
    def reached(self, step: str) -> None: ...


def expire_queues(lite: Lite) -> list[str]:
    """Run the store's expiry (at most once a minute) in the order above; returns the names of
    the light queues deleted."""
    broker = lite.broker
    faults = cast("ExpiryFaults | None", broker.config.expiry_faults)
    taken: dict[tuple[str, str], Subscription] = {}

    def forget(names: list[str]) -> bool:
        keys = lite.progress_keys(names)
        try:
            for key in keys:
                broker.journal.append(["x", key[0], key[1]])
                taken[key] = broker.subscriptions.pop(key)
                lite.forget_changed(key)
            broker.journal.sync()
        except OSError as exc:
            log.warning("light queues not expired: their consumers' progress could not be forgotten: %s", exc)
            return False
        if faults is not None:
            faults.reached("forgotten")
        return True

    deleted = broker.store.expire_light_queues(forget)
    if faults is not None and deleted:
        faults.reached("deleted")
    gone = set(deleted)
    for key, sub in taken.items():
        if key[1] not in gone:
            _give_back(lite, key, sub)
    keys = [key for key in taken if key[1] in gone]
    if keys:
        broker.consumer_offsets.forget(keys)
    return deleted


def _give_back(lite: Lite, key: tuple[str, str], sub: Subscription) -> None:
    """The queue came alive after its progress was forgotten: the progress is its again."""
    broker = lite.broker
    if key in broker.subscriptions:  # read again meanwhile: that progress stands
        return
    broker.subscriptions[key] = sub
    cursors = [[qid, q.cursor] for qid, q in sorted(sub.queues.items())]
    deliveries = [delivery_fields(d) for q in sub.queues.values() for d in q.in_flight.values()]
    try:
        broker.journal.append(["p", key[0], key[1], cursors, deliveries])
    except OSError as exc:  # the journal's snapshot, rewritten from the table, gives it back
        log.warning("pop journal: progress on a light queue kept alive to be restored by a rewrite: %s", exc)
        lite.compact_journal()
