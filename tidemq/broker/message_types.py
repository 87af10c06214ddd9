"""Which message types a topic takes: the check RocketMQ's proxy makes on every send
(DefaultTopicMessageTypeValidator), kept in one place for every kind of send.

The type checked is the one the message's content gives, as RocketMQ derives it from the stored
properties (TopicMessageType.parseFromMessageProperty): a transaction message is TRANSACTION, one
with a delivery time DELAY, one with a message group FIFO, anything else NORMAL.  PRIORITY and
LITE messages are what the client says they are.  A topic takes its own type only, a MIXED topic
NORMAL, FIFO, DELAY and TRANSACTION; anything else is MESSAGE_PROPERTY_CONFLICT_WITH_TYPE."""

from __future__ import annotations

from .codes import BrokerError, Code
from .types import DELAY, FIFO, LITE, MIXED, NORMAL, PRIORITY, TRANSACTION, Publish

MIXED_TYPES = frozenset({NORMAL, FIFO, DELAY, TRANSACTION})


def message_type_of(msg: Publish) -> str:
    if msg.message_type in (PRIORITY, LITE):
        return msg.message_type
    if msg.message_type == TRANSACTION:
        return TRANSACTION
    if msg.delivery_timestamp is not None or msg.delay_level > 0:
        return DELAY
    if msg.message_group is not None:
        return FIFO
    return NORMAL


def check_topic_takes(topic_name: str, topic_type: str, message_type: str) -> None:
    """BrokerError MESSAGE_PROPERTY_CONFLICT_WITH_TYPE unless a `topic_type` topic takes
    `message_type` messages."""
    if message_type == topic_type or (topic_type == MIXED and message_type in MIXED_TYPES):
        return
    raise BrokerError(
        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        f"topic {topic_name!r} takes {topic_type} messages, not {message_type}",
    )
