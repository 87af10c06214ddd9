"""Protobuf <-> broker values for apache.rocketmq.v2: pure functions, no I/O."""

from __future__ import annotations

from functools import lru_cache
from hashlib import md5

from ...broker import (
    PRODUCER,
    PUSH_CONSUMER,
    SIMPLE_CONSUMER,
    BrokerError,
    Code,
    Publish,
    ServerSettings,
    TopicConfig,
    bodies,
)
from ...broker import priority as priorities
from ...broker.fifo import PROPERTY_SHARDING_KEY
from ...broker.lite import (
    COMPLETE_ADD,
    COMPLETE_REMOVE,
    PARTIAL_ADD,
    PARTIAL_REMOVE,
    PROPERTY_LITE_TOPIC,
    OffsetOption,
    UnsubscribeLite,
)
from ...broker.metadata import DLQ_PREFIX, RETRY_PREFIX
from ...broker.transactions import PROPERTY_TRANSACTION_PREPARED, TransactionCheck
from ...broker.validation import RESERVED_PROPERTIES
from ...store import record
from .stubs import pb, svc

MESSAGE_TYPE_NAMES = {
    pb.NORMAL: "NORMAL",
    pb.FIFO: "FIFO",
    pb.DELAY: "DELAY",
    pb.TRANSACTION: "TRANSACTION",
    pb.PRIORITY: "PRIORITY",
    pb.LITE: "LITE",
}
ACCEPT_MESSAGE_TYPES = {
    "NORMAL": [pb.NORMAL],
    "FIFO": [pb.FIFO],
    "DELAY": [pb.DELAY],
    "TRANSACTION": [pb.TRANSACTION],
    "PRIORITY": [pb.PRIORITY],
    "LITE": [pb.LITE],
    "MIXED": [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION],
}
CLIENT_TYPE_NAMES = {
    pb.PRODUCER: PRODUCER,
    pb.PUSH_CONSUMER: PUSH_CONSUMER,
    pb.SIMPLE_CONSUMER: SIMPLE_CONSUMER,
    pb.PULL_CONSUMER: "PULL_CONSUMER",
    pb.LITE_PUSH_CONSUMER: "LITE_PUSH_CONSUMER",
    pb.LITE_SIMPLE_CONSUMER: "LITE_SIMPLE_CONSUMER",
}
RESOLUTION_NAMES = {pb.COMMIT: "COMMIT", pb.ROLLBACK: "ROLLBACK"}
FILTER_TYPE_NAMES = {pb.TAG: "TAG", pb.SQL: "SQL", pb.FILTER_TYPE_UNSPECIFIED: "TAG"}


def status(code: Code | int, message: str = "") -> pb.Status:
    return pb.Status(code=int(code), message=message or Code(code).name)


OK = status(Code.OK, "OK")


_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX)
NAMESPACE_SEPARATOR = "%"


def resource_name(resource: pb.Resource) -> str:
    """The broker's name of a resource: `namespace%name` when a namespace is given (retry and
    dead-letter names keep their prefix first: `%DLQ%namespace%group`), as RocketMQ's
    NamespaceUtil wraps them."""
    namespace, plain = resource.resource_namespace, resource.name
    if not namespace or not plain:
        return plain
    for prefix in _PREFIXES:
        if plain.startswith(prefix):
            return f"{prefix}{namespace}{NAMESPACE_SEPARATOR}{plain[len(prefix) :]}"
    return f"{namespace}{NAMESPACE_SEPARATOR}{plain}"


def plain_name(wrapped: str, namespace: str) -> str:
    """Inverse of `resource_name`: what a client of `namespace` calls the resource."""
    if not namespace:
        return wrapped
    marker = f"{namespace}{NAMESPACE_SEPARATOR}"
    for prefix in _PREFIXES:
        if wrapped.startswith(prefix + marker):
            return prefix + wrapped[len(prefix) + len(marker) :]
    return wrapped[len(marker) :] if wrapped.startswith(marker) else wrapped


def endpoints(address: str) -> pb.Endpoints:
    """`host:port` -> Endpoints (IPv4, IPv6 or domain name)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if ":" in host:
        scheme = pb.IPv6
    elif host.replace(".", "").isdigit():
        scheme = pb.IPv4
    else:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=int(port))])


def message_queues(
    topic: TopicConfig, resource: pb.Resource, broker_name: str, where: pb.Endpoints, queue_ids=None
) -> list[pb.MessageQueue]:
    """The topic's queues as a client names them (`resource`: the topic of its request)."""
    permission = {6: pb.READ_WRITE, 4: pb.READ, 2: pb.WRITE}.get(topic.perm, pb.NONE)
    accept = ACCEPT_MESSAGE_TYPES.get(topic.message_type, [pb.NORMAL])
    broker = pb.Broker(name=broker_name, id=0, endpoints=where)
    ids = range(topic.queue_nums) if queue_ids is None else queue_ids
    return [
        pb.MessageQueue(topic=resource, id=qid, permission=permission, broker=broker, accept_message_types=accept)
        for qid in ids
    ]


def publish_from(message: pb.Message) -> Publish:
    sp = message.system_properties
    message_type = MESSAGE_TYPE_NAMES.get(sp.message_type)
    has = sp.HasField
    if message_type is None:
        if sp.message_group:
            message_type = "FIFO"
        elif has("delivery_timestamp"):
            message_type = "DELAY"
        else:
            message_type = "NORMAL"
    priority = sp.priority if has("priority") else None
    if message_type in ("NORMAL", "PRIORITY"):  # typed by the priority's presence, as RocketMQ's proxy does
        message_type = "NORMAL" if priority is None else "PRIORITY"
    else:
        priority = None  # RocketMQ's broker drops the priority of other message types
    encoding = sp.body_encoding
    if encoding not in _BODY_ENCODINGS:
        raise BrokerError(Code.BAD_REQUEST, f"unknown body encoding {encoding}")
    return Publish(
        topic=resource_name(message.topic),
        body=message.body,
        message_id=sp.message_id,
        message_type=message_type,
        tag=sp.tag if has("tag") else None,
        keys=list(sp.keys) if sp.keys else [],
        properties=dict(message.user_properties) if message.user_properties else {},
        born_timestamp=_ms(sp.born_timestamp) if has("born_timestamp") else None,
        born_host=sp.born_host,
        compressed=encoding == pb.GZIP,
        message_group=sp.message_group if has("message_group") else None,
        delivery_timestamp=delivery_ms(sp.delivery_timestamp) if has("delivery_timestamp") else None,
        priority=priority,
        lite_topic=sp.lite_topic if has("lite_topic") else None,
        transaction_recovery_seconds=(
            sp.orphaned_transaction_recovery_duration.seconds if has("orphaned_transaction_recovery_duration") else None
        ),
    )


_BODY_ENCODINGS = frozenset({pb.IDENTITY, pb.GZIP, pb.ENCODING_UNSPECIFIED})


_SECONDS_AS_MS = 10**11  # a Timestamp.seconds above this is a time in ms (year 5138 in seconds)


def delivery_ms(timestamp) -> int:
    """A delivery time in ms.  The Python SDK 5.1.2 puts Message.delivery_timestamp, which its
    documentation gives in ms, into Timestamp.seconds unchanged: such seconds are read as ms,
    so that both a value in seconds and one in ms mean what their sender meant."""
    if timestamp.seconds > _SECONDS_AS_MS:
        return timestamp.seconds
    return _ms(timestamp)


def _ms(timestamp) -> int:
    """Milliseconds of a Timestamp (ToMilliseconds without its Python overhead)."""
    return timestamp.seconds * 1000 + timestamp.nanos // 1_000_000


def fill_delivered_message(
    m: pb.Message,
    rec: record.Record,
    namespace: str,
    handle: str,
    attempt: int,
    invisible_ms: int,
    topic_name: str = "",
) -> None:
    """Write a delivered record into the empty message `m` (in place: the caller passes the
    message field of the stream response, so nothing is copied).  `topic_name`: the topic it is
    delivered from when that is not the record's own (a light queue)."""
    body = rec.body_bytes
    gzipped = False
    if rec.sysflag & record.FLAG_COMPRESSED:
        body, gzipped = bodies.delivered_body(body, rec.sysflag)
    properties = rec.properties
    m.body = body
    topic = m.topic
    name = topic_name or rec.topic
    topic.name = plain_name(name, namespace) if namespace else name
    if namespace:
        topic.resource_namespace = namespace
    if not _DELIVERY_PROPERTIES.issuperset(properties):
        user_properties = m.user_properties
        for name, value in properties.items():
            if name not in RESERVED_PROPERTIES:
                user_properties[name] = value
    sp = m.system_properties
    tag = properties.get(record.PROPERTY_TAGS)
    if tag:
        sp.tag = tag
    keys = properties.get(record.PROPERTY_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(record.KEY_SEPARATOR) if k)
    sp.message_id = properties.get(record.PROPERTY_UNIQ_KEY) or rec.msg_id
    digest = sp.body_digest
    digest.type = pb.MD5
    digest.checksum = md5(body).hexdigest().upper()
    sp.body_encoding = pb.GZIP if gzipped else pb.IDENTITY
    message_group = properties.get(PROPERTY_SHARDING_KEY)
    if message_group:
        sp.message_group = message_group
    lite_topic = properties.get(PROPERTY_LITE_TOPIC)
    if lite_topic:
        sp.lite_topic = lite_topic
    sp.message_type = delivered_message_type(properties)
    priority = priorities.parse(properties.get(priorities.PROPERTY_PRIORITY))
    if priority is not None:
        sp.priority = priority
    deliver_at = properties.get(_TIMER_DELIVER_MS)
    if deliver_at is not None and deliver_at.isdigit():
        _set_ms(sp.delivery_timestamp, int(deliver_at))
    _set_ms(sp.born_timestamp, rec.born_timestamp)
    sp.born_host = rec.born_host[0]
    _set_ms(sp.store_timestamp, rec.store_timestamp)
    sp.store_host = _host_port(rec.store_host)
    sp.receipt_handle = handle
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    _set_ms(sp.invisible_duration, max(0, invisible_ms))
    sp.delivery_attempt = attempt


_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
_DELAY_LEVEL = "DELAY"


def delivered_message_type(properties: dict[str, str]) -> int:
    """The type a delivered message reports, from its properties, as RocketMQ's proxy tells it."""
    if properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return pb.TRANSACTION
    if _TIMER_DELIVER_MS in properties or _DELAY_LEVEL in properties:
        return pb.DELAY
    if PROPERTY_SHARDING_KEY in properties:
        return pb.FIFO
    if priorities.PROPERTY_PRIORITY in properties:
        return pb.PRIORITY
    if PROPERTY_LITE_TOPIC in properties:
        return pb.LITE
    return pb.NORMAL


# Reserved properties most records carry: a record with no others has no user property to copy.
_DELIVERY_PROPERTIES = (
    frozenset({record.PROPERTY_TAGS, record.PROPERTY_KEYS, record.PROPERTY_UNIQ_KEY, priorities.PROPERTY_PRIORITY})
    & RESERVED_PROPERTIES
)


@lru_cache(maxsize=64)
def _host_port(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def _set_ms(timestamp_or_duration, ms: int) -> None:
    """Timestamp/Duration from milliseconds (FromMilliseconds without its Python overhead)."""
    seconds, millis = divmod(ms, 1000)
    timestamp_or_duration.seconds = seconds
    timestamp_or_duration.nanos = millis * 1_000_000


LITE_ACTIONS = {
    pb.PARTIAL_ADD: PARTIAL_ADD,
    pb.PARTIAL_REMOVE: PARTIAL_REMOVE,
    pb.COMPLETE_ADD: COMPLETE_ADD,
    pb.COMPLETE_REMOVE: COMPLETE_REMOVE,
}
_OFFSET_POLICIES = {0: "LAST", 1: "MIN", 2: "MAX"}


def offset_option(request) -> OffsetOption | None:
    """The OffsetOption of a SyncLiteSubscriptionRequest, None when it has none."""
    if not request.HasField("offset_option"):
        return None
    option = request.offset_option
    which = option.WhichOneof("offset_type")
    policy = _OFFSET_POLICIES.get(option.policy) if which == "policy" else "LAST"
    if policy is None:
        raise BrokerError(Code.BAD_REQUEST, f"unknown offset policy {option.policy}")
    if which in ("offset", "tail_n", "timestamp") and getattr(option, which) < 0:
        raise BrokerError(Code.ILLEGAL_OFFSET, f"offset option {which} {getattr(option, which)} is negative")
    return OffsetOption(
        policy=policy, **({which: getattr(option, which)} if which in ("offset", "tail_n", "timestamp") else {})
    )


def unsubscribe_lite(command: UnsubscribeLite) -> svc.TelemetryCommand:
    out = svc.TelemetryCommand()
    out.notify_unsubscribe_lite_command.lite_topic = command.lite_topic
    return out


def recover_orphaned_transaction(check: TransactionCheck, namespace: str) -> svc.TelemetryCommand:
    """The command that asks a producer (of `namespace`) to resolve an open transaction."""
    command = svc.TelemetryCommand()
    recover = command.recover_orphaned_transaction_command
    recover.transaction_id = check.transaction_id
    fill_delivered_message(recover.message, check.record, namespace, "", 0, 0)
    return command


def server_settings(client: pb.Settings, server: ServerSettings) -> pb.Settings:
    """The client's settings merged with the server's values, as the Java proxy answers."""
    settings = pb.Settings()
    settings.CopyFrom(client)
    settings.metric.Clear()
    settings.metric.on = False
    if client.client_type == pb.PRODUCER:
        settings.publishing.max_body_size = server.max_body_size
        settings.publishing.validate_message_type = server.validate_message_type
        settings.backoff_policy.Clear()
        settings.backoff_policy.max_attempts = server.send_attempts
        exponential = settings.backoff_policy.exponential_backoff
        exponential.initial.FromMilliseconds(10)
        exponential.max.FromMilliseconds(1000)
        exponential.multiplier = 2.0
    elif client.HasField("subscription"):
        settings.backoff_policy.Clear()
        settings.backoff_policy.max_attempts = server.max_delivery_attempts
        customized = settings.backoff_policy.customized_backoff
        for ms in server.retry_backoff_ms:
            customized.next.add().FromMilliseconds(ms)
        sub = settings.subscription
        sub.fifo = server.fifo
        if client.client_type in (pb.PUSH_CONSUMER, pb.LITE_PUSH_CONSUMER):
            sub.receive_batch_size = 32
            sub.long_polling_timeout.FromMilliseconds(server.long_polling_timeout_ms)
        sub.lite_subscription_quota = server.lite_subscription_quota
        sub.max_lite_topic_size = server.max_lite_topic_size
    return settings
