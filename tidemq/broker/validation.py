"""Checks on names and messages, each failing with the status code RocketMQ's gRPC proxy uses."""

from __future__ import annotations

import re
import zlib

from ..store.recovery.quarantine import DAMAGED_PROPERTY
from .codes import BrokerError, Code
from .config import BrokerConfig

_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")

# Topics and groups owned by the system (RocketMQ's TopicValidator / MixAll).
SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "rmq_sys_wheel_timer",
        "rmq_sys_REVIVE_LOG_DefaultCluster",
    }
)
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "%RETRY%", "%DLQ%", "%LMQ%", "%SYS%")
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
SYSTEM_GROUPS = frozenset(
    {
        "DEFAULT_CONSUMER",
        "DEFAULT_PRODUCER",
        "TOOLS_CONSUMER",
        "FILTERSRV_CONSUMER",
        "__MONITOR_CONSUMER",
        "CLIENT_INNER_PRODUCER",
        "SELF_TEST_P_GROUP",
        "SELF_TEST_C_GROUP",
        "CID_ONS-HTTP-PROXY",
        "CID_ONSAPI_PERMISSION",
        "CID_ONSAPI_OWNER",
        "CID_ONSAPI_PULL",
        "CID_RMQ_SYS_PREFIX",
    }
)

# Property names the system owns: a user property may not use them (the values of RocketMQ
# MessageConst's STRING_HASH_SET, and tidemq's own).
RESERVED_PROPERTIES = frozenset(
    {
        "KEYS",
        "TAGS",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "MSG_REGION",
        "TRACE_ON",
        "UNIQ_KEY",
        "UNIQ_CLIENT_MESSAGE_ID_KEYIDX",  # read as UNIQ_KEY in stores written under that name
        DAMAGED_PROPERTY,
        "__CRC32#",
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID",
        "TIMER_DELAY_LEVEL",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "POP_CK",
        "POP_CK_OFFSET",
        "1ST_POP_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "DUP_INFO",
        "EXTEND_UNIQ_INFO",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "CLUSTER",
        "MSG_TYPE",
        "INNER_MULTI_QUEUE_OFFSET",
        "INNER_MULTI_DISPATCH",
        "__SHARDINGKEY",
        "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "TIMER_OUT_MS",
        "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TIMER_DEL_UNIQKEY",
        "BORN_TIMESTAMP",
        "__BORNHOST",
        "TRACE_CONTEXT",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "TRANSACTION_CHECK_TIMES",
        "__STARTDELIVERTIME",
        "__RECONSUMETIMES",
        "_SYS_MSG_PRIORITY_",
        "__LITE_TOPIC",
        "INNER_NUM",
    }
)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def valid_name(name: str) -> bool:
    """Whether `name` has only the characters a topic or group name may have."""
    return _NAME.match(name) is not None


def has_control_character(text: str) -> bool:
    return _CONTROL.search(text) is not None


def check_topic_name(topic: str, config: BrokerConfig) -> None:
    if not topic or not topic.strip():
        raise BrokerError(Code.ILLEGAL_TOPIC, "topic name is blank")
    if len(topic) > config.max_topic_length:
        raise BrokerError(
            Code.ILLEGAL_TOPIC, f"topic name is {len(topic)} characters, at most {config.max_topic_length}"
        )
    if not _NAME.match(topic):
        raise BrokerError(Code.ILLEGAL_TOPIC, f"topic name {topic!r} has characters outside [%|a-zA-Z0-9_-]")


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES)


def check_publish_topic(topic: str, config: BrokerConfig) -> None:
    check_topic_name(topic, config)
    if is_system_topic(topic):
        raise BrokerError(Code.ILLEGAL_TOPIC, f"topic {topic!r} is a system topic")


def check_group_name(group: str, config: BrokerConfig) -> None:
    if not group or not group.strip():
        raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, "consumer group name is blank")
    if len(group) > config.max_group_length:
        raise BrokerError(
            Code.ILLEGAL_CONSUMER_GROUP,
            f"consumer group name is {len(group)} characters, at most {config.max_group_length}",
        )
    if not _NAME.match(group):
        raise BrokerError(
            Code.ILLEGAL_CONSUMER_GROUP, f"consumer group name {group!r} has characters outside [%|a-zA-Z0-9_-]"
        )
    if group in SYSTEM_GROUPS or group.startswith(SYSTEM_GROUP_PREFIX):
        raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, f"consumer group {group!r} is a system group")


def check_tag(tag: str | None) -> None:
    if tag is None:
        return
    if not tag.strip():
        raise BrokerError(Code.ILLEGAL_MESSAGE_TAG, "tag is blank")
    if "|" in tag:
        raise BrokerError(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} contains '|'")
    if has_control_character(tag):
        raise BrokerError(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} contains a control character")


def check_keys(keys: list[str]) -> None:
    for key in keys:
        if not key.strip():
            raise BrokerError(Code.ILLEGAL_MESSAGE_KEY, "a message key is blank")
        if has_control_character(key):
            raise BrokerError(Code.ILLEGAL_MESSAGE_KEY, f"message key {key!r} contains a control character")


def check_properties(properties: dict[str, str], tag: str | None, keys: list[str], config: BrokerConfig) -> None:
    if len(properties) > config.max_user_property_count:
        raise BrokerError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"{len(properties)} user properties, at most {config.max_user_property_count}",
        )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in properties.items())
    size += len((tag or "").encode()) + sum(len(k.encode()) for k in keys)
    if size > config.max_user_property_bytes:
        raise BrokerError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"user properties, tag and keys take {size} bytes, at most {config.max_user_property_bytes}",
        )
    for name, value in properties.items():
        if name in RESERVED_PROPERTIES:
            raise BrokerError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {name!r} is reserved by the system")
        if not name or has_control_character(name) or has_control_character(value):
            raise BrokerError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {name!r} is blank or contains a control character"
            )


def check_message_group(message_group: str | None, config: BrokerConfig) -> None:
    if message_group is None:
        return
    if not message_group.strip():
        raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP, "message group is blank")
    if len(message_group.encode()) >= config.max_message_group_bytes:
        raise BrokerError(
            Code.ILLEGAL_MESSAGE_GROUP,
            f"message group is {len(message_group.encode())} bytes, under {config.max_message_group_bytes} allowed",
        )
    if has_control_character(message_group):
        raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP, "message group contains a control character")


_LITE_TOPIC = re.compile(r"^[a-zA-Z0-9_-]+$")


def check_lite_topic(lite_topic: str | None, max_length: int = 64) -> None:
    if lite_topic is None:
        return
    if not lite_topic.strip() or len(lite_topic) > max_length or not _LITE_TOPIC.match(lite_topic):
        raise BrokerError(
            Code.ILLEGAL_LITE_TOPIC,
            f"lite topic {lite_topic!r} is blank, longer than {max_length} or has characters outside [a-zA-Z0-9_-]",
        )


def check_body(body: bytes, config: BrokerConfig) -> None:
    if not body:
        raise BrokerError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > config.max_message_size:
        raise BrokerError(
            Code.MESSAGE_BODY_TOO_LARGE, f"message body is {len(body)} bytes, at most {config.max_message_size}"
        )


def check_gzip_body(body: bytes, config: BrokerConfig) -> None:
    """A body the client flagged gzip-encoded must be one gzip stream whose data (checked with its
    CRC) fits the maximum message size once inflated: it is stored compressed, and consumers
    inflate it."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        inflated = len(inflater.decompress(body, config.max_message_size + 1))
        if inflater.unconsumed_tail or inflated > config.max_message_size:
            raise BrokerError(
                Code.MESSAGE_BODY_TOO_LARGE,
                f"the gzip-encoded body inflates to more than {config.max_message_size} bytes",
            )
        inflater.flush()
    except zlib.error as exc:
        raise BrokerError(Code.MESSAGE_CORRUPTED, f"the body is flagged gzip-encoded but is not gzip: {exc}") from None
    if not inflater.eof or inflater.unused_data:
        raise BrokerError(Code.MESSAGE_CORRUPTED, "the body is flagged gzip-encoded but is not one whole gzip stream")


def check_invisible_time(invisible_ms: int, config: BrokerConfig) -> None:
    if not config.min_invisible_time_ms <= invisible_ms <= config.max_invisible_time_ms:
        raise BrokerError(
            Code.ILLEGAL_INVISIBLE_TIME,
            f"invisible time {invisible_ms} ms outside [{config.min_invisible_time_ms}, {config.max_invisible_time_ms}] ms",
        )
