"""tidemq.broker: messaging semantics over the store (topics, groups, send validation,
pop / ack / retry / dead letters, long polling).  asyncio; no protobuf, no protocol imports."""

from . import admin
from .broker import Broker
from .codes import BrokerError, Code
from .config import BrokerConfig
from .metadata import GroupConfig, TopicConfig, dead_letter_topic
from .sessions import PRODUCER, PUSH_CONSUMER, SIMPLE_CONSUMER, ServerSettings
from .types import Publish, Received, ReceiveRequest, SendResult

__all__ = [
    "admin",
    "Broker",
    "BrokerConfig",
    "BrokerError",
    "Code",
    "GroupConfig",
    "TopicConfig",
    "dead_letter_topic",
    "PRODUCER",
    "PUSH_CONSUMER",
    "SIMPLE_CONSUMER",
    "ServerSettings",
    "Publish",
    "Received",
    "ReceiveRequest",
    "SendResult",
]
