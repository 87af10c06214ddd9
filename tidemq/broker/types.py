"""Values the broker takes and gives: what a producer publishes, what a receive asks for, what a
consumer is handed.  Plain data, so that every protocol adapter can fill and read them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..store import record

NORMAL = "NORMAL"
FIFO = "FIFO"
DELAY = "DELAY"
TRANSACTION = "TRANSACTION"
PRIORITY = "PRIORITY"
LITE = "LITE"
MIXED = "MIXED"


@dataclass(slots=True)
class Publish:
    topic: str
    body: bytes
    message_id: str
    message_type: str = NORMAL
    tag: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int | None = None  # ms
    born_host: str = ""
    compressed: bool = False  # body is gzip
    message_group: str | None = None
    delivery_timestamp: int | None = None  # ms
    priority: int | None = None
    lite_topic: str | None = None
    transaction_recovery_seconds: int | None = None  # a TRANSACTION message's own immunity time
    delay_level: int = 0  # a 4.x delay level (the DELAY property), 0: none


@dataclass(slots=True, frozen=True)
class SendResult:
    message_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    transaction_id: str = ""  # a TRANSACTION message's (its message id)
    recall_handle: str = ""  # a delay message's, for RecallMessage


@dataclass(slots=True)
class ReceiveRequest:
    group: str
    topic: str
    client_id: str = ""
    filter_type: str = "TAG"
    filter_expression: str = "*"
    batch_size: int = 32
    invisible_ms: int = 30_000
    auto_renew: bool = False
    poll_ms: int = 0  # how long to hold the call when nothing is there


@dataclass(slots=True)
class Received:
    record: record.Record
    receipt_handle: str
    delivery_attempt: int
    invisible_until: int  # ms
    queue_topic: str = ""  # the light queue it was popped from, "" for the receive's own topic
