"""Protobuf <-> broker values for apache.rocketmq.v2: pure functions, no I/O."""

from __future__ import annotations

import hashlib

from rocketmq.grpc_protocol import definition_pb2 as pb

from ...broker import PRODUCER, PUSH_CONSUMER, SIMPLE_CONSUMER, BrokerError, Code, Publish, ServerSettings, TopicConfig
from ...broker.validation import RESERVED_PROPERTIES
from ...store import record

MESSAGE_TYPE_NAMES = {
    pb.NORMAL: "NORMAL", pb.FIFO: "FIFO", pb.DELAY: "DELAY", pb.TRANSACTION: "TRANSACTION",
    pb.PRIORITY: "PRIORITY", pb.LITE: "LITE",
}
ACCEPT_MESSAGE_TYPES = {
    "NORMAL": [pb.NORMAL], "FIFO": [pb.FIFO], "DELAY": [pb.DELAY], "TRANSACTION": [pb.TRANSACTION],
    "PRIORITY": [pb.PRIORITY], "LITE": [pb.LITE], "MIXED": [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION],
}
CLIENT_TYPE_NAMES = {
    pb.PRODUCER: PRODUCER, pb.PUSH_CONSUMER: PUSH_CONSUMER, pb.SIMPLE_CONSUMER: SIMPLE_CONSUMER,
    pb.PULL_CONSUMER: "PULL_CONSUMER", pb.LITE_PUSH_CONSUMER: "LITE_PUSH_CONSUMER",
    pb.LITE_SIMPLE_CONSUMER: "LITE_SIMPLE_CONSUMER",
}
FILTER_TYPE_NAMES = {pb.TAG: "TAG", pb.SQL: "SQL", pb.FILTER_TYPE_UNSPECIFIED: "TAG"}


def status(code: Code | int, message: str = "") -> pb.Status:
    return pb.Status(code=int(code), message=message or Code(code).name)


OK = status(Code.OK, "OK")


_PREFIXES = ("%RETRY%", "%DLQ%")
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
            return f"{prefix}{namespace}{NAMESPACE_SEPARATOR}{plain[len(prefix):]}"
    return f"{namespace}{NAMESPACE_SEPARATOR}{plain}"


def plain_name(wrapped: str, namespace: str) -> str:
    """Inverse of `resource_name`: what a client of `namespace` calls the resource."""
    if not namespace:
        return wrapped
    marker = f"{namespace}{NAMESPACE_SEPARATOR}"
    for prefix in _PREFIXES:
        if wrapped.startswith(prefix + marker):
            return prefix + wrapped[len(prefix) + len(marker):]
    return wrapped[len(marker):] if wrapped.startswith(marker) else wrapped


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


def message_queues(topic: TopicConfig, resource: pb.Resource, broker_name: str, where: pb.Endpoints,
                   queue_ids=None) -> list[pb.MessageQueue]:
    """The topic's queues as a client names them (`resource`: the topic of its request)."""
    permission = {6: pb.READ_WRITE, 4: pb.READ, 2: pb.WRITE}.get(topic.perm, pb.NONE)
    accept = ACCEPT_MESSAGE_TYPES.get(topic.message_type, [pb.NORMAL])
    broker = pb.Broker(name=broker_name, id=0, endpoints=where)
    ids = range(topic.queue_nums) if queue_ids is None else queue_ids
    return [pb.MessageQueue(topic=resource, id=qid, permission=permission, broker=broker,
                            accept_message_types=accept) for qid in ids]


def publish_from(message: pb.Message) -> Publish:
    sp = message.system_properties
    if message.system_properties.message_type in MESSAGE_TYPE_NAMES:
        message_type = MESSAGE_TYPE_NAMES[sp.message_type]
    elif sp.message_group:
        message_type = "FIFO"
    elif sp.HasField("delivery_timestamp"):
        message_type = "DELAY"
    else:
        message_type = "NORMAL"
    if sp.body_encoding not in (pb.IDENTITY, pb.GZIP, pb.ENCODING_UNSPECIFIED):
        raise BrokerError(Code.BAD_REQUEST, f"unknown body encoding {sp.body_encoding}")
    return Publish(
        topic=resource_name(message.topic),
        body=message.body,
        message_id=sp.message_id,
        message_type=message_type,
        tag=sp.tag if sp.HasField("tag") else None,
        keys=list(sp.keys),
        properties=dict(message.user_properties),
        born_timestamp=sp.born_timestamp.ToMilliseconds() if sp.HasField("born_timestamp") else None,
        born_host=sp.born_host,
        compressed=sp.body_encoding == pb.GZIP,
        message_group=sp.message_group if sp.HasField("message_group") else None,
        delivery_timestamp=sp.delivery_timestamp.ToMilliseconds() if sp.HasField("delivery_timestamp") else None,
        priority=sp.priority if sp.HasField("priority") else None,
        lite_topic=sp.lite_topic if sp.HasField("lite_topic") else None,
    )


def delivered_message(rec: record.Record, namespace: str, handle: str, attempt: int, invisible_ms: int) -> pb.Message:
    body = rec.body if isinstance(rec.body, bytes) else bytes(rec.body)
    properties = rec.properties
    m = pb.Message(body=body)
    m.topic.name = plain_name(rec.topic, namespace)
    m.topic.resource_namespace = namespace
    for name, value in properties.items():
        if name not in RESERVED_PROPERTIES:
            m.user_properties[name] = value
    sp = m.system_properties
    tag = properties.get(record.PROPERTY_TAGS)
    if tag:
        sp.tag = tag
    keys = properties.get(record.PROPERTY_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(record.KEY_SEPARATOR) if k)
    sp.message_id = properties.get(record.PROPERTY_UNIQ_KEY) or rec.msg_id
    sp.body_digest.type = pb.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = pb.GZIP if rec.sysflag & record.FLAG_COMPRESSED else pb.IDENTITY
    sp.message_type = pb.NORMAL
    _set_ms(sp.born_timestamp, rec.born_timestamp)
    sp.born_host = rec.born_host[0]
    _set_ms(sp.store_timestamp, rec.store_timestamp)
    sp.store_host = f"{rec.store_host[0]}:{rec.store_host[1]}"
    sp.receipt_handle = handle
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    _set_ms(sp.invisible_duration, max(0, invisible_ms))
    sp.delivery_attempt = attempt
    return m


def _set_ms(timestamp_or_duration, ms: int) -> None:
    """Timestamp/Duration from milliseconds (FromMilliseconds without its Python overhead)."""
    seconds, millis = divmod(ms, 1000)
    timestamp_or_duration.seconds = seconds
    timestamp_or_duration.nanos = millis * 1_000_000


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
        sub.lite_subscription_quota = 1200
        sub.max_lite_topic_size = 64
    return settings
