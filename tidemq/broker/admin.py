"""Administration of topics and groups: create, list, and report a group's progress.

Synchronous functions over a `Broker`, so that they serve both the running broker (through the
admin service) and a stopped broker's store (the CLI opens it directly)."""

from __future__ import annotations

from dataclasses import asdict

from . import admin_fields as fields
from . import lite, validation
from .broker import Broker
from .codes import BrokerError, Code
from .metadata import GroupConfig, TopicConfig, dead_letter_topic
from .priority import DEFAULT_LEVELS


def create_topic(
    broker: Broker,
    name: str,
    queue_nums: int | None = None,
    message_type: str = "NORMAL",
    priorities: int | None = None,
) -> dict:
    """Create a topic, or change one (queues can be added, not removed).  A PRIORITY topic has
    one queue per priority level: `priorities` levels (default 10), or `queue_nums` of them."""
    validation.check_topic_name(fields.text("topic name", name), broker.config)
    message_type = fields.message_type(message_type)
    if queue_nums is not None:
        queue_nums = fields.queue_nums(queue_nums)
    if priorities is not None:
        priorities = fields.queue_nums(priorities)
    queue_nums = _queue_count(queue_nums, message_type, priorities)
    if not 1 <= queue_nums <= 1024:
        raise BrokerError(Code.BAD_REQUEST, f"queue count {queue_nums} outside [1, 1024]")
    existing = broker.metadata.topics.get(name)
    if existing is not None and queue_nums < existing.queue_nums:
        raise BrokerError(
            Code.BAD_REQUEST, f"topic {name!r} has {existing.queue_nums} queues; they can be added, not removed"
        )
    return _topic_fields(broker.metadata.put_topic(TopicConfig(name, queue_nums=queue_nums, message_type=message_type)))


def _queue_count(queue_nums: int | None, message_type: str, priorities: int | None) -> int:
    if message_type != "PRIORITY":
        if priorities is not None:
            raise BrokerError(Code.BAD_REQUEST, f"priority levels are for PRIORITY topics, not {message_type} ones")
        return 8 if queue_nums is None else queue_nums
    if priorities is not None and queue_nums is not None and priorities != queue_nums:
        raise BrokerError(
            Code.BAD_REQUEST,
            f"a priority topic has one queue per level: {priorities} levels cannot have {queue_nums} queues",
        )
    if priorities is not None and not 1 <= priorities <= 1024:
        raise BrokerError(Code.BAD_REQUEST, f"priority levels {priorities} outside [1, 1024]")
    return next(n for n in (priorities, queue_nums, DEFAULT_LEVELS) if n is not None)


def _topic_fields(topic: TopicConfig) -> dict:
    fields = asdict(topic)
    if topic.priority_levels:
        fields["priorities"] = topic.priority_levels
    return fields


def list_topics(broker: Broker) -> list[dict]:
    store = broker.store
    out = []
    for name, topic in sorted(broker.metadata.topics.items()):
        queues = [
            {"queue_id": q, "min_offset": store.min_offset(name, q), "max_offset": store.max_offset(name, q)}
            for q in range(topic.queue_nums)
        ]
        out.append({**_topic_fields(topic), "queues": queues, "waiting_receives": broker.long_polling.waiting(name)})
    return out


def create_group(
    broker: Broker,
    name: str,
    max_attempts: int | None = None,
    retry_backoff_ms: list[int] | None = None,
    fifo: bool | None = None,
    lite_bind_topic: str | None = None,
) -> dict:
    """A new group; refused if it exists (`update_group` changes one).  `lite_bind_topic`: a
    lite group of that LITE topic."""
    validation.check_group_name(fields.text("group name", name), broker.config)
    if name in broker.metadata.groups:
        raise BrokerError(Code.BAD_REQUEST, f"consumer group {name!r} exists; update it instead (tidemq group update)")
    group = GroupConfig(name)
    if lite_bind_topic:
        topic = broker.metadata.topics.get(fields.text("lite bind topic", lite_bind_topic))
        if topic is None or topic.message_type != "LITE":
            raise BrokerError(
                Code.ILLEGAL_TOPIC,
                f"lite bind topic {lite_bind_topic!r} is not a LITE topic (tidemq topic create NAME --type LITE)",
            )
        group.lite_bind_topic = lite_bind_topic
    return _put_group(broker, group, max_attempts, retry_backoff_ms, fifo)


def update_group(
    broker: Broker,
    name: str,
    max_attempts: int | None = None,
    retry_backoff_ms: list[int] | None = None,
    fifo: bool | None = None,
) -> dict:
    """Change an existing group's retry policy (the fields given)."""
    validation.check_group_name(fields.text("group name", name), broker.config)
    group = broker.metadata.groups.get(name)
    if group is None:
        raise BrokerError(Code.CONSUMER_GROUP_NOT_FOUND, f"consumer group {name!r} does not exist")
    return _put_group(
        broker,
        GroupConfig(name, group.retry_max_times, list(group.retry_backoff_ms), group.fifo, group.lite_bind_topic),
        max_attempts,
        retry_backoff_ms,
        fifo,
    )


def _put_group(broker: Broker, group: GroupConfig, max_attempts, retry_backoff_ms, fifo) -> dict:
    if max_attempts is not None:
        group.retry_max_times = fields.max_attempts(max_attempts) - 1
    if retry_backoff_ms is not None:
        group.retry_backoff_ms = fields.retry_backoff_ms(retry_backoff_ms, broker.config.max_invisible_time_ms)
    if fifo is not None:
        group.fifo = bool(fifo)
    broker.metadata.put_group(group)
    return {**asdict(group), "max_attempts": group.max_delivery_attempts}


def list_groups(broker: Broker) -> list[dict]:
    """Per group and subscribed topic, per queue: the consumed offset (everything below it is
    acked), the queue's max offset, the backlog between them, and how many are in flight; per
    group, how many messages its dead-letter queue holds."""
    store = broker.store
    out = []
    for name, group in sorted(broker.metadata.groups.items()):
        topics = []
        light_queues = 0  # light queues the group has read, listed by `tidemq lite list`
        for (g, topic_name), sub in sorted(broker.subscriptions.items()):
            if g != name:
                continue
            if lite.parse_lite_queue(topic_name) is not None:
                light_queues += store.max_offset(topic_name, 0) > 0
                continue
            topic = broker.metadata.topics.get(topic_name)
            queue_ids = sorted(set(range(topic.queue_nums if topic else 0)) | set(sub.queues))
            queues = []
            for qid in queue_ids:
                low, high = store.min_offset(topic_name, qid), store.max_offset(topic_name, qid)
                q = sub.queues.get(qid)
                consumed = max(q.consumed_offset, low) if q is not None else low
                queues.append(
                    {
                        "queue_id": qid,
                        "consumed_offset": consumed,
                        "max_offset": high,
                        "backlog": max(0, high - consumed),
                        "in_flight": len(q.in_flight) if q else 0,
                    }
                )
            topics.append({"topic": topic_name, "backlog": sum(q["backlog"] for q in queues), "queues": queues})
        dlq = dead_letter_topic(name)
        dead = broker.metadata.topics.get(dlq)
        dead_letters = (
            sum(store.max_offset(dlq, q) - store.min_offset(dlq, q) for q in range(dead.queue_nums)) if dead else 0
        )
        out.append(
            {
                **asdict(group),
                "max_attempts": group.max_delivery_attempts,
                "dead_letters": dead_letters,
                "light_queues": light_queues,
                "topics": topics,
            }
        )
    return out


def list_lite(broker: Broker, bind_topic: str, prefix: str = "", group: str | None = None, limit: int = 10_000) -> dict:
    """The lite topics of `bind_topic` (those starting with `prefix`, at most `limit`): per lite
    topic its light queue's max offset, per lite group of the topic the backlog and in-flight
    count, and how many clients subscribe it."""
    validation.check_topic_name(fields.text("bind topic", bind_topic), broker.config)
    fields.text("prefix", prefix)
    limit = fields.integer("limit", limit, 1, 1_000_000)
    groups = sorted(
        g.name
        for g in broker.metadata.groups.values()
        if g.lite_bind_topic == bind_topic and (group is None or g.name == group)
    )
    subscribers = broker.lite.table.subscribers(group, bind_topic)
    store = broker.store
    out: list[dict] = []
    for lite_topic, queue in broker.lite.queues(bind_topic, prefix):
        if len(out) >= limit:
            break
        low, high = store.min_offset(queue, 0), store.max_offset(queue, 0)
        per_group = []
        for g in groups:
            sub = broker.subscriptions.get((g, queue))
            q = sub.queues.get(0) if sub is not None else None
            consumed = max(q.consumed_offset, low) if q is not None else low
            per_group.append(
                {
                    "group": g,
                    "consumed_offset": consumed,
                    "backlog": max(0, high - consumed),
                    "in_flight": len(q.in_flight) if q is not None else 0,
                }
            )
        out.append(
            {
                "lite_topic": lite_topic,
                "queue": queue,
                "min_offset": low,
                "max_offset": high,
                "subscribers": subscribers.get(lite_topic, 0),
                "groups": per_group,
            }
        )
    return {"bind_topic": bind_topic, "lite_topics": out, "groups": groups}


def stats(broker: Broker) -> dict:
    """Counters since start, and what is in flight now."""
    in_flight = sum(sub.in_flight_count() for sub in broker.subscriptions.values())
    return {
        **broker.stats,
        "in_flight": in_flight,
        "clients": len(broker.sessions.clients),
        "open_transactions": len(broker.transactions.pending),
        "damaged_records_skipped": len(broker.store.damaged_records),
    }
