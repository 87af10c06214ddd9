"""Lite topics (RocketMQ 5.5's RIP-83) over light message queues.

A LITE message goes to its bind topic B with a lite topic L: it is stored once, in B, and the
store multi-dispatches it into the light queue `%LMQ%$B$L` (one queue, id 0), as RocketMQ's
LiteUtil names it.  A lite consumer group is bound to one topic (`GroupConfig.lite_bind_topic`);
each of its clients subscribes a set of lite topics (SyncLiteSubscription), and a receive on B
pops only the light queues of that client's set.  The group's pop progress on a light queue is
a `Subscription` like any topic's, keyed (group, light queue name): the journal, retries, dead
letters and consumed offsets work unchanged.

Subscription sets belong to client ids (`lite_subscriptions`, logged so that a restarted broker
serves a returning client the set it had; the clients also re-send their whole set every 30 s).
A set is removed (COMPLETE_REMOVE) when its client terminates, or stays away for
`client_expire_ms` (counted from the broker's start for a set read from the log).

An arrival in a lite topic's light queue wakes, per group, one waiting receive of a client that
subscribes that lite topic (as RocketMQ's LiteEventDispatcher hands an event to one client of
each group): the subscribers come from the table's index, so the work is in proportion to the
lite topic's subscribers, not to the receives waiting on the bind topic.

The groups' consumed offsets of key-value light queues go to the light-queue tables (beside the
queue, so they expire with it), each written when it changed; those of other queues, file light
queues included, go to `consumerOffset.json` (see `docs/light-queues.md`).

Light queues whose names do not follow the lite pattern (`%LMQ%name`, RIP-28's) are served to
ordinary consumers as a topic of one readable queue: pop, ack and retries as for any queue."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import lite_expiry, validation
from .codes import BrokerError, Code
from .filters import Filter
from .lite_subscriptions import ClientLite, LiteSubscriptions
from .metadata import GroupConfig, TopicConfig
from .types import LITE, NORMAL, Received, ReceiveRequest

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)

LMQ_PREFIX = "%LMQ%"
LITE_SEPARATOR = "$"
LITE_PREFIX = LMQ_PREFIX + LITE_SEPARATOR
PROPERTY_LITE_TOPIC = "__LITE_TOPIC"
PROPERTY_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
PROPERTY_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
LITE_CONSUMER_TYPES = frozenset({"LITE_PUSH_CONSUMER", "LITE_SIMPLE_CONSUMER"})
PARTIAL_ADD, PARTIAL_REMOVE, COMPLETE_ADD, COMPLETE_REMOVE = (
    "PARTIAL_ADD",
    "PARTIAL_REMOVE",
    "COMPLETE_ADD",
    "COMPLETE_REMOVE",
)
# a COMPLETE_ADD may carry this many topics above the quota (RocketMQ's proxy tolerance); the set
# kept is still held to the quota
_REQUEST_SLACK = 300
_OPENED_LIMIT = 100_000  # light queues opened since the last count before the counts are redone
_COMMIT_LIMIT = 2_000  # changed consumed offsets the tables hear of per maintenance round (one transaction)


def lmq_name(bind_topic: str, lite_topic: str) -> str:
    return f"{LITE_PREFIX}{bind_topic}{LITE_SEPARATOR}{lite_topic}"


def is_lmq(name: str) -> bool:
    return name.startswith(LMQ_PREFIX)


def parse_lite_queue(name: str) -> tuple[str, str] | None:
    """(bind topic, lite topic) of a lite topic's light queue, None for any other name."""
    if not name.startswith(LITE_PREFIX):
        return None
    parts = name[len(LITE_PREFIX) :].split(LITE_SEPARATOR)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def queue_of(topic: str, lite_topic: str | None) -> str:
    """The queue an ack, a change of invisible time or a dead-letter request names: the lite
    topic's light queue when it carries one, else the topic itself."""
    return lmq_name(topic, lite_topic) if lite_topic else topic


def check_lmq_name(name: str, config) -> None:
    """ILLEGAL_TOPIC unless `name` is a light queue name a client may consume: `%LMQ%` and a
    name, or a lite topic's queue."""
    lite = parse_lite_queue(name)
    if lite is not None:
        validation.check_topic_name(lite[0], config)
        validation.check_lite_topic(lite[1], config.max_lite_topic_size)
        return
    rest = name[len(LMQ_PREFIX) :]
    if not rest or len(name) > config.max_topic_length or not validation.valid_name(rest):
        raise BrokerError(Code.ILLEGAL_TOPIC, f"light queue name {name!r} is not %LMQ% and a topic name")


def light_queue_config(name: str) -> TopicConfig:
    """The topic config a light queue is served under: one queue, readable only."""
    return TopicConfig(name, queue_nums=1, message_type=LITE if name.startswith(LITE_PREFIX) else NORMAL, perm=4)


def delivered_topic(received: Received, topic: str) -> str:
    """The topic a delivered message names (ack and nack name it back): a lite message its bind
    topic, a message popped from a RIP-28 light queue that queue, else `topic`."""
    queue = received.queue_topic
    if queue and not queue.startswith(LITE_PREFIX):
        return queue
    return topic


def python_partial_add(names: list[str]) -> list[str]:
    """The Python SDK 5.1.2 passes the lite topic of a PARTIAL_ADD to `extend()`, so "lt-1"
    arrives as ["l", "t", "-", "1"]; it adds one topic per call, so a PARTIAL_ADD of single
    characters from it is that topic spelled out."""
    if len(names) > 1 and all(len(n) == 1 for n in names):
        return ["".join(names)]
    return names


@dataclass(frozen=True, slots=True)
class OffsetOption:
    """Where a new lite subscription starts: policy LAST (where the group is, the start of the
    queue if it never consumed it), MIN or MAX; or an `offset`, the last `tail_n` messages, or
    the first message stored at or after `timestamp` (ms)."""

    policy: str = "LAST"
    offset: int | None = None
    tail_n: int | None = None
    timestamp: int | None = None


class Lite:
    """The broker's lite-topic side: subscriptions, receives on a bind topic, sends' dispatch
    properties.  Runs on the broker's event loop."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        now = broker.clock()
        self.table = LiteSubscriptions(broker.store.directory / "config", now)
        for client_id in self.table.clients:
            self.table.watch(client_id, now + broker.sessions.expire_ms)
        self._rotation: dict[str, int] = {}  # per client id: the first lite topic of its next pop
        # the quota check at send: lite topics per bind topic, counted once, then kept up to date
        # with the light queues sends opened since (a new queue's first message may be in dispatch)
        self._counts: dict[str, int] = {}
        self._opened: set[str] = set()
        self.partial_adds = TokenBucket(self.config.max_sync_lite_subscription_rate, now)
        # (group, light queue) pairs whose progress changed since the store's tables last heard
        # of it; all pairs at start, as the tables may lag the journal after a crash
        self._changed: dict[tuple[str, str], None] = dict.fromkeys(k for k in broker.subscriptions if is_lmq(k[1]))
        self._compact = False  # the journal refused a line of expiry: rewrite it from the table
        self._rip28_groups = {g for g, t in broker.subscriptions if is_lmq(t) and parse_lite_queue(t) is None}

    def progress_changed(self, group: str, topic: str) -> None:
        """The pop journal's listener: the progress of `group` on `topic` changed."""
        if topic.startswith(LMQ_PREFIX):
            self._changed[(group, topic)] = None
            if not topic.startswith(LITE_PREFIX):
                self._rip28_groups.add(group)

    # -- groups -------------------------------------------------------------------------------

    def bind(self, group: GroupConfig, topic_name: str) -> None:
        """Make `group` a lite group of `topic_name` on first use; ILLEGAL_CONSUMER_GROUP if it is
        a group already consuming elsewhere, ILLEGAL_TOPIC if bound to another topic or if the
        topic is not LITE (an auto-created topic that never held a message becomes LITE)."""
        broker = self.broker
        topic = broker.topic(topic_name)
        if topic.message_type != LITE:
            if topic.message_type == NORMAL and self._empty(topic):
                log.info("topic %s made LITE: lite consumers of group %s use it", topic.name, group.name)
                topic = broker.metadata.put_topic(dataclasses.replace(topic, message_type=LITE))
            else:
                raise BrokerError(Code.ILLEGAL_TOPIC, f"topic {topic_name!r} is {topic.message_type}, not a LITE topic")
        bound = group.lite_bind_topic or ""
        if bound == topic_name:
            return
        if bound:
            raise BrokerError(
                Code.ILLEGAL_TOPIC,
                f"consumer group {group.name!r} is a lite group of topic {bound!r}, not of {topic_name!r}",
            )
        if any(g == group.name and not is_lmq(t) for g, t in broker.subscriptions):
            raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, f"consumer group {group.name!r} is not a lite group")
        log.info("consumer group %s made a lite group of topic %s", group.name, topic_name)
        group.lite_bind_topic = topic_name
        broker.metadata.put_group(group)

    def _empty(self, topic: TopicConfig) -> bool:
        store = self.broker.store
        return all(store.max_offset(topic.name, q) == 0 for q in range(topic.queue_nums))

    def check_receive(self, group: GroupConfig, topic: TopicConfig) -> None:
        bound = group.lite_bind_topic or ""
        if not bound:
            raise BrokerError(
                Code.ILLEGAL_CONSUMER_GROUP,
                f"topic {topic.name!r} is a LITE topic: consumer group {group.name!r} is not a lite group of it",
            )
        if bound != topic.name:
            raise BrokerError(
                Code.ILLEGAL_TOPIC,
                f"consumer group {group.name!r} is a lite group of topic {bound!r}, not of {topic.name!r}",
            )

    # -- subscriptions ------------------------------------------------------------------------

    def sync(
        self,
        client_id: str,
        group_name: str,
        bind_topic: str,
        action: str,
        names: list[str],
        version: int | None = None,
        offset: OffsetOption | None = None,
    ) -> None:
        """SyncLiteSubscription: change the client's set; nothing changes on a refusal.  The work
        is bounded: at most quota + 300 names a request, PARTIAL_ADD requests at
        `max_sync_lite_subscription_rate` a second (TOO_MANY_REQUESTS past it), and at most
        `max_lite_subscription_count` (client, lite topic) pairs in the broker."""
        broker = self.broker
        validation.check_group_name(group_name, self.config)
        validation.check_topic_name(bind_topic, self.config)
        quota = self.config.lite_subscription_quota
        if len(names) > quota + _REQUEST_SLACK:
            raise BrokerError(
                Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED,
                f"{len(names)} lite topics in one request, more than the quota {quota} + {_REQUEST_SLACK}",
            )
        now = broker.clock()
        if action == PARTIAL_ADD and not self.partial_adds.take(now):
            raise BrokerError(
                Code.TOO_MANY_REQUESTS,
                f"too many lite subscription requests (more than {self.partial_adds.rate:g} a second), "
                f"topic {bind_topic}, group {group_name}, client {client_id}",
            )
        for name in names:
            validation.check_lite_topic(name, self.config.max_lite_topic_size)
        group = broker.group(group_name)
        self.bind(group, bind_topic)
        client = self.table.clients.get(client_id)
        if client is not None and version is not None and 0 <= version < client.version:
            return  # an older sync overtaken by a newer one
        if client is None or client.group != group_name or client.bind_topic != bind_topic:
            client = ClientLite(group_name, bind_topic)
        before = client.topics
        if action == PARTIAL_ADD:
            after = before | set(names)
        elif action == PARTIAL_REMOVE:
            after = before - set(names)
        elif action == COMPLETE_ADD:
            after = set(names)
        elif action == COMPLETE_REMOVE:
            after = set()
        else:
            raise BrokerError(Code.BAD_REQUEST, f"unknown lite subscription action {action!r}")
        if len(after) > quota and len(after) > len(before):
            raise BrokerError(
                Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED,
                f"client {client_id} would subscribe {len(after)} lite topics, more than the quota {quota}",
            )
        old = self.table.clients.get(client_id)
        held = self.table.active - (len(old.topics) if old is not None else 0)
        if len(after) > len(before) and held + len(after) > self.config.max_lite_subscription_count:
            raise BrokerError(
                Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED,
                f"the broker holds {self.table.active} lite subscriptions, "
                f"its quota is {self.config.max_lite_subscription_count}",
            )
        added = after - before
        for name in sorted(added):
            self._start(group_name, lmq_name(bind_topic, name), offset)
        if version is not None:
            client.version = version
        client.seen = now
        self.table.update(client_id, client, after)
        self.table.watch(client_id, now + broker.sessions.expire_ms)
        if added:
            broker.long_polling.notify_client(client_id)  # its waiting receive pops the new ones

    def _start(self, group: str, queue: str, offset: OffsetOption | None) -> None:
        """Place the group's read cursor on a newly subscribed light queue as `offset` asks: a
        group that never read it starts at its first message; a cursor only moves forward."""
        if offset is None or (
            offset.policy == "LAST" and offset.offset is None and offset.tail_n is None and offset.timestamp is None
        ):
            return
        store = self.broker.store
        low, high = store.min_offset(queue, 0), store.max_offset(queue, 0)
        if offset.offset is not None:
            start = offset.offset
        elif offset.tail_n is not None:
            start = high - offset.tail_n
        elif offset.timestamp is not None:
            start = store.offset_for_timestamp(queue, 0, offset.timestamp) if high > low else high
        elif offset.policy == "MAX":
            start = high
        else:
            start = low
        start = min(max(start, low), high)
        sub = self.broker.subscriptions.get((group, queue))
        if sub is not None and 0 in sub.queues and sub.queues[0].cursor >= start:
            return
        self.broker.move_cursor(group, queue, 0, start)

    def topics_of(self, client_id: str) -> list[str]:
        client = self.table.clients.get(client_id)
        return sorted(client.topics) if client is not None else []

    def client_gone(self, client_id: str) -> None:
        """COMPLETE_REMOVE: the client terminated or expired."""
        if self.table.remove(client_id):
            self._rotation.pop(client_id, None)

    def expire(self, now: int) -> None:
        """Remove the sets of clients not alive for `client_expire_ms`.  Looks only at the
        clients whose deadline passed (a sync moves it on); one found alive is looked at again
        `client_expire_ms` after it was last seen."""
        sessions = self.broker.sessions
        for client_id in self.table.due(now):
            last = max(self.table.clients[client_id].seen, _last_seen(sessions, client_id))
            if sessions.alive(client_id, now) or now - last < sessions.expire_ms:
                self.table.watch(client_id, max(now, last) + sessions.expire_ms)
                continue
            log.info("lite subscriptions of client %s removed: it is gone", client_id)
            self.client_gone(client_id)

    def maintain(self, now: int) -> None:
        """The broker's maintenance round: expire gone clients, tell the store of changed
        progress, make the subscription log durable."""
        self.expire(now)
        self.commit_offsets(now)
        self.expire_queues()
        self.table.sync()
        if self._compact:  # a line the journal refused: the snapshot is the table
            self.broker.journal.compact(self.broker.subscriptions.values())
            self._compact = False

    def commit_offsets(self, now: int, limit: int = _COMMIT_LIMIT) -> None:
        """Tell the store up to `limit` changed consumed offsets of key-value light queues (the
        rest at the next round): its expiry takes a queue only when every group that consumed
        it is at its end (and the queue was idle since the last commit).  A pair whose offset the
        tables already hold is not written again (a write counts as activity)."""
        light = self.broker.store.light_queues
        if light is None:
            self._changed.clear()
            return
        changed, subscriptions = self._changed, self.broker.subscriptions
        offsets = []
        for _ in range(min(limit, len(changed))):
            key, _ = changed.popitem()
            sub = subscriptions.get(key)
            q = sub.queues.get(0) if sub is not None else None
            if q is not None:
                offsets.append((key[0], key[1], q.consumed_offset))
        if offsets:
            light.commit_consumer_offsets(offsets, now)

    def file_offsets(self, keys) -> list[tuple[str, str]]:
        """Of the (group, topic) pairs `keys`, those whose offsets `consumerOffset.json` keeps:
        every pair but those of key-value light queues (the tables keep them)."""
        light = self.broker.store.light_queues
        if light is None or light.kv is None:
            return list(keys)
        return [k for k in keys if not is_lmq(k[1]) or light.in_files(k[1])]

    def expire_queues(self) -> None:
        """Light-queue expiry (`lite_expiry`): the groups' progress on a queue is durably
        forgotten before the store deletes it (a queue of that name starts again at offset 0);
        every client's subscription of a deleted queue's lite topic goes, each client being told."""
        names = lite_expiry.expire_queues(self)
        if names:
            self._counts.clear()
        for name in names:
            lite = parse_lite_queue(name)
            if lite is not None:
                self.drop(*lite)

    def progress_keys(self, names: list[str]) -> list[tuple[str, str]]:
        """The (group, queue) pairs with progress on the light queues `names`, looking only at
        the groups that can have read them (the lite groups of a lite queue's bind topic, the
        groups that read RIP-28 queues): work in proportion to the queues and those groups."""
        broker = self.broker
        lite_groups: dict[str, list[str]] = {}
        for g in broker.metadata.groups.values():
            if g.lite_bind_topic:
                lite_groups.setdefault(g.lite_bind_topic, []).append(g.name)
        keys = []
        for name in names:
            lite = parse_lite_queue(name)
            groups = lite_groups.get(lite[0], ()) if lite is not None else self._rip28_groups
            keys += [(g, name) for g in groups if (g, name) in broker.subscriptions]
        return keys

    def forget_changed(self, key: tuple[str, str]) -> None:
        self._changed.pop(key, None)

    def compact_journal(self) -> None:
        """Rewrite the journal from the table at the end of the round."""
        self._compact = True

    def drop(self, bind_topic: str, lite_topic: str) -> list[str]:
        """The server drops every client's subscription of a lite topic (its queue is gone): each
        client is told over its telemetry stream (NotifyUnsubscribeLiteCommand).  Returns the
        client ids told."""
        told = sorted(self.table.by_queue.get(lmq_name(bind_topic, lite_topic), ()))
        for client_id in told:
            self.table.discard(client_id, lite_topic)
            outbox = self.broker.transactions.outboxes.get(client_id)
            if outbox is not None:
                try:
                    outbox.put_nowait(UnsubscribeLite(lite_topic))
                except asyncio.QueueFull:
                    log.warning(
                        "client %s not told of its dropped lite topic %s: its outbox is full", client_id, lite_topic
                    )
        return told

    def close(self) -> None:
        self.table.close()

    # -- waking receivers ---------------------------------------------------------------------

    def wake(self, topics) -> None:
        """News of `topics` (arrivals, due redeliveries): a lite topic's light queue wakes, per
        group, one waiting receive of its subscribers; a LITE bind topic's own queues wake
        nobody (its consumers read its light queues); any other topic its waiting receives."""
        plain = []
        known = self.broker.metadata.topics
        for topic in topics:
            if topic.startswith(LITE_PREFIX):
                self._wake_subscribers(topic)
            elif (config := known.get(topic)) is None or config.message_type != LITE:
                plain.append(topic)
        if plain:
            self.broker.long_polling.notify(plain)

    def _wake_subscribers(self, queue: str) -> None:
        subscribers = self.table.by_queue.get(queue)
        if not subscribers:
            return
        long_polling, clients = self.broker.long_polling, self.table.clients
        woken: set[str] = set()
        for client_id in subscribers:
            group = clients[client_id].group
            if group not in woken and long_polling.is_waiting(client_id):
                long_polling.notify_client(client_id)
                woken.add(group)

    # -- sending ------------------------------------------------------------------------------

    def dispatch_properties(self, bind_topic: str, lite_topic: str | None, properties: dict[str, str]) -> None:
        """A LITE message's properties: its lite topic and the light queue the store dispatches it
        into.  LITE_TOPIC_QUOTA_EXCEEDED when it would open a lite topic past the bind topic's
        quota."""
        if not lite_topic:
            raise BrokerError(Code.ILLEGAL_LITE_TOPIC, "a LITE message needs a lite topic")
        queue = lmq_name(bind_topic, lite_topic)
        if self.broker.store.max_offset(queue, 0) == 0 and queue not in self._opened:
            count = self._counts.get(bind_topic)
            if count is None:
                count = self._counts[bind_topic] = self.count(bind_topic)
            if count >= self.config.lite_topic_quota:
                raise BrokerError(
                    Code.LITE_TOPIC_QUOTA_EXCEEDED,
                    f"topic {bind_topic!r} has {self.config.lite_topic_quota} lite topics, its quota",
                )
            self._counts[bind_topic] = count + 1
            if len(self._opened) >= _OPENED_LIMIT:  # counted again at the next new lite topic
                self._opened.clear()
                self._counts.clear()
            self._opened.add(queue)
        properties[PROPERTY_LITE_TOPIC] = lite_topic
        properties[PROPERTY_MULTI_DISPATCH] = queue

    def count(self, bind_topic: str) -> int:
        """How many lite topics `bind_topic` has (light queues that hold or held a message)."""
        return sum(1 for _ in self.queues(bind_topic))

    def queues(self, bind_topic: str, prefix: str = ""):
        """(lite topic, light queue name) of `bind_topic`'s lite topics starting with `prefix`."""
        start = lmq_name(bind_topic, prefix)
        for name in light_queue_names(self.broker.store, start):
            lite = parse_lite_queue(name)
            if lite is not None and lite[0] == bind_topic:
                yield lite[1], name

    # -- receiving ----------------------------------------------------------------------------

    def pop(self, req: ReceiveRequest, bind: TopicConfig, group: GroupConfig, tag_filter: Filter) -> list[Received]:
        """A receive's pop on a bind topic: the client's lite topics in turn (starting one further
        each pop), those with new entries or due retries only, up to the batch size."""
        broker = self.broker
        queues = self._queues_of(req.client_id, bind, group)
        if not queues:
            return []
        start = self._rotation.get(req.client_id, 0) % len(queues)
        self._rotation[req.client_id] = start + 1
        queues = queues[start:] + queues[:start]
        batch = min(req.batch_size, self.config.max_batch_size)
        now = broker.clock()
        out: list[Received] = []
        for queue, high in zip(queues, max_offsets(broker.store, queues)):
            if len(out) >= batch:
                break
            sub = broker.subscriptions.get((group.name, queue))
            if sub is not None:
                due, progress = sub.next_due(), sub.queues.get(0)
                if (due is None or due > now) and (high == 0 if progress is None else progress.cursor >= high):
                    continue  # nothing new, nothing due
            elif high == 0:
                continue
            sub = sub or broker._subscription(group.name, queue)
            try:
                out.extend(
                    broker.pop(
                        sub,
                        light_queue_config(queue),
                        group,
                        tag_filter,
                        dataclasses.replace(req, batch_size=batch - len(out)),
                    )
                )
            except BrokerError:
                if out:  # the journal refused this queue's pop: hand over what the others gave
                    break
                raise
        return out

    def next_due(self, client_id: str, bind: TopicConfig, group: GroupConfig) -> int | None:
        """The earliest retry deadline among the client's lite topics."""
        subscriptions = self.broker.subscriptions
        dues = [
            sub.next_due()
            for sub in (subscriptions.get((group.name, q)) for q in self._queues_of(client_id, bind, group))
            if sub is not None
        ]
        return min((due for due in dues if due is not None), default=None)

    def _queues_of(self, client_id: str, bind: TopicConfig, group: GroupConfig) -> list[str]:
        """The light queues of the client's lite topics, if it subscribed as a client of `group` on
        `bind`."""
        client = self.table.clients.get(client_id)
        if client is None or client.group != group.name or client.bind_topic != bind.name:
            return []
        return [lmq_name(bind.name, name) for name in sorted(client.topics)]


@dataclass(frozen=True, slots=True)
class UnsubscribeLite:
    """A telemetry command: the server dropped the client's subscription of `lite_topic`."""

    lite_topic: str


class TokenBucket:
    """`rate` tokens a second, at most a second's worth held (Guava's RateLimiter as RocketMQ's
    proxy uses it), on the broker's clock."""

    def __init__(self, rate: float, now: int) -> None:
        self.rate = rate
        self._tokens = max(rate, 1.0)
        self._at = now

    def take(self, now: int) -> bool:
        self._tokens = min(max(self.rate, 1.0), self._tokens + (now - self._at) * self.rate / 1000)
        self._at = max(self._at, now)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def _last_seen(sessions, client_id: str) -> int:
    session = sessions.clients.get(client_id)
    return session.last_seen if session is not None else 0


def max_offsets(store, names: list[str]) -> list[int]:
    """Each light queue's max offset, the key-value ones read in one snapshot."""
    light = store.light_queues
    if light is None or light.kv is None or light.use_files or light.file_queues:
        return [store.max_offset(name, 0) for name in names]
    return light.kv.max_offsets(names)


def light_queue_names(store, prefix: str):
    """The names of the store's light queues that start with `prefix`, in order."""
    light = store.light_queues
    return light.names(prefix) if light is not None else iter(())
