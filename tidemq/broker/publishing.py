"""The sending side of the broker: validate a published message against its topic, pick the
queue, store it, and wait until the flush policy makes it durable.

Runs on the broker's event loop.  `store.put` appends inline (a memory copy under the append
lock); under sync flush the durability wait is a future from `DurableFutures`, which the store's
flush thread settles with one call into the loop per fsync, so no thread is parked per message."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ..store import (
    FLUSH_SYNC,
    FlushTimeoutError,
    InvalidMessageError,
    Message,
    MessageStore,
    PutResult,
    StoreClosedError,
    StoreError,
    StoreIOError,
    record,
)
from . import fifo, message_types, priority, timers, validation
from .codes import BrokerError, Code, disk_refused
from .config import BrokerConfig
from .durability import DurableFutures
from .metadata import TopicConfig
from .types import DELAY, FIFO, LITE, NORMAL, PRIORITY, TRANSACTION, Publish, SendResult
from .withdrawn import Withdrawn

if TYPE_CHECKING:
    from .lite import Lite
    from .transactions import Transactions

SUPPORTED_TYPES = frozenset({NORMAL, FIFO, TRANSACTION, PRIORITY, DELAY, LITE})

log = logging.getLogger(__name__)

PeerHost = str | Callable[[], str]  # an address, or a function giving it when needed


class Publisher:
    def __init__(
        self, store: MessageStore, config: BrokerConfig, topic: Callable[[str], TopicConfig], stats: dict
    ) -> None:
        self.store = store
        self.config = config
        self.clock = config.clock
        self.topic = topic  # the broker's topic lookup (creates on first use when allowed)
        self.stats = stats
        self.transactions: Transactions  # makes TRANSACTION sends half messages; set by the broker
        self.lite: Lite  # a LITE message's dispatch into its lite topic's light queue; set by the broker
        self._put_inline = store.config.flush != FLUSH_SYNC
        self._durable: DurableFutures | None = None  # made on the event loop, at the first sync-flush send
        self.withdrawn = Withdrawn(store.directory / "pop")  # appended, then reported failed: never delivered
        self._round_robin: dict[str, int] = {}  # next write queue per topic
        self._hosts: dict[str, str] = {}  # born host -> the host recorded (cache of the IP check)
        self._valid_topics: set[str] = set()  # names and tags that passed validation (hot path: every send)
        self._valid_tags: set[str | None] = {None}

    def check(self, msg: Publish) -> TopicConfig:
        cfg = self.config
        if msg.topic not in self._valid_topics:
            validation.check_publish_topic(msg.topic, cfg)
            _remember(self._valid_topics, msg.topic)
        if msg.tag not in self._valid_tags:
            validation.check_tag(msg.tag)
            _remember(self._valid_tags, msg.tag)
        if msg.keys:
            validation.check_keys(msg.keys)
        if msg.message_group is not None:
            validation.check_message_group(msg.message_group, cfg)
        if msg.lite_topic is not None:
            validation.check_lite_topic(msg.lite_topic, cfg.max_lite_topic_size)
        # without properties or keys only a tag of more than a quarter of the limit in characters
        # (4 UTF-8 bytes at most each) can exceed it
        if msg.properties or msg.keys or (msg.tag and len(msg.tag) * 4 > cfg.max_user_property_bytes):
            validation.check_properties(msg.properties, msg.tag, msg.keys, cfg)
        validation.check_body(msg.body, cfg)
        if msg.compressed:
            validation.check_gzip_body(msg.body, cfg)
        if not msg.message_id or not msg.message_id.strip():
            raise BrokerError(Code.ILLEGAL_MESSAGE_ID, "message id is blank")
        if (
            msg.delivery_timestamp is not None
            and msg.delivery_timestamp - self.clock() > cfg.timer_max_delay_sec * 1000
        ):
            raise BrokerError(
                Code.ILLEGAL_DELIVERY_TIME,
                f"delivery time is more than {cfg.timer_max_delay_sec} s ahead (timerMaxDelaySec)",
            )
        topic = self.topic(msg.topic)
        message_type = message_types.message_type_of(msg)
        message_types.check_topic_takes(topic.name, topic.message_type, message_type)
        if message_type == PRIORITY and (msg.priority is None or msg.priority < 0):
            raise BrokerError(Code.BAD_REQUEST, f"a priority message needs a priority of 0 or more, not {msg.priority}")
        if message_type not in SUPPORTED_TYPES:
            raise BrokerError(Code.NOT_IMPLEMENTED, f"{message_type} messages are not supported yet")
        return topic

    async def send_batch(
        self, messages: list[Publish], peer_host: PeerHost = "127.0.0.1"
    ) -> list[SendResult | BrokerError]:
        """Store the acceptable messages of a batch together, in order, on one queue per topic
        (round-robin between batches; a priority message on the queue of its level); per message
        its result or why it was refused.
        `peer_host`: the sender's address, recorded as the born host of a message that names no
        valid one, or a function giving it (asked only then: the SDK names its own)."""
        results: list[SendResult | BrokerError | None] = [None] * len(messages)
        accepted: list[tuple[int, Message]] = []
        queue_of: dict[str, int] = {}
        for i, msg in enumerate(messages):
            try:
                topic = self.check(msg)
            except BrokerError as exc:
                results[i] = exc
                continue
            properties = dict(msg.properties)
            properties[record.PROPERTY_UNIQ_KEY] = msg.message_id
            if msg.message_type == LITE:
                try:
                    self.lite.dispatch_properties(topic.name, msg.lite_topic, properties)
                except BrokerError as exc:
                    results[i] = exc
                    continue
            if msg.message_group:  # its queue by hash, as RocketMQ's proxy picks it
                qid = fifo.queue_for_group(msg.message_group, topic.queue_nums)
                properties[fifo.PROPERTY_SHARDING_KEY] = msg.message_group
            elif msg.message_type == PRIORITY:  # its level's queue, whatever the topic's type (as RocketMQ)
                assert msg.priority is not None  # check() refuses a priority message without one
                qid = priority.queue_of(msg.priority, topic.queue_nums)
                properties[priority.PROPERTY_PRIORITY] = str(msg.priority)
            else:
                qid = queue_of.get(topic.name, -1)
                if qid < 0:
                    qid = queue_of[topic.name] = self._next_write_queue(topic)
            message = Message(
                topic=msg.topic,
                body=msg.body,
                queue_id=qid,
                tags=msg.tag,
                keys=msg.keys or None,
                properties=properties,
                sysflag=record.FLAG_COMPRESSED if msg.compressed else 0,
                born_timestamp=msg.born_timestamp,
                born_host=(self._born_host(msg.born_host, peer_host), 0),
            )
            if msg.message_type == TRANSACTION:
                try:
                    message = self.transactions.half_message(message, msg)
                except BrokerError as exc:
                    results[i] = exc
                    continue
            elif msg.delivery_timestamp is not None or msg.delay_level > 0:
                message = self._delayed(msg, message)
            accepted.append((i, message))
        if accepted:
            outcomes = await self._store([m for _, m in accepted])
            for (i, message), put in zip(accepted, outcomes):
                if isinstance(put, BrokerError):
                    results[i] = put
                else:
                    results[i] = SendResult(
                        messages[i].message_id,
                        message.queue_id,
                        put.queue_offset,
                        put.commit_log_offset,
                        recall_handle=self._recall_handle(message),
                    )
                    self.stats["sent"] += 1
        return cast("list[SendResult | BrokerError]", results)  # each message has its result now

    async def _store(self, messages: list[Message]) -> list:
        """Per message, its store result or why it was not stored.  The store takes a batch
        whole or not at all when a message is invalid: then each is stored on its own, so one
        bad message does not fail the others.  After a failure part way, the first ones stand."""
        try:
            return await self._append_and_wait(messages)
        except StoreError as exc:
            error = _refusal(exc)
            if error.code == Code.BAD_REQUEST and len(messages) > 1:
                # each appends before any waits (tasks start in order), so they share fsyncs
                outcomes = await asyncio.gather(*(self._store([m]) for m in messages))
                return [put for outcome in outcomes for put in outcome]
            stored = getattr(exc, "results", [])  # a batch the disk refused part way
            return stored + [error] * (len(messages) - len(stored))

    def _delayed(self, msg: Publish, message: Message) -> Message:
        """A delay message as it is stored: in the timer topic while its time is ahead (in the
        topic itself once it is not), or in its delay level's schedule queue."""
        if msg.delay_level > 0:
            return timers.delay_level_message(message, msg.delay_level)
        deliver_at = msg.delivery_timestamp
        assert deliver_at is not None  # a delay message has a delay level or a delivery time
        message.properties[timers.PROPERTY_TIMER_DELIVER_MS] = str(deliver_at)
        if deliver_at > self.clock():
            return timers.timer_message(message, deliver_at)
        return message

    def _recall_handle(self, message: Message) -> str:
        if message.topic != timers.TIMER_TOPIC:
            return ""
        properties = message.properties
        return timers.recall_handle(
            properties[timers.PROPERTY_REAL_TOPIC],
            self.config.broker_name,
            int(properties[timers.PROPERTY_TIMER_OUT_MS]),
            properties[record.PROPERTY_UNIQ_KEY],
        )

    def _next_write_queue(self, topic: TopicConfig) -> int:
        qid = self._round_robin.get(topic.name, -1) + 1
        if qid >= topic.queue_nums:
            qid = 0
        self._round_robin[topic.name] = qid
        return qid

    def _born_host(self, host: str, peer_host: PeerHost) -> str:
        known = self._hosts.get(host)
        if known is None:
            known = _host_or(host, "")
            if len(self._hosts) < 10_000:
                self._hosts[host] = known
        if known:
            return known
        return peer_host() if callable(peer_host) else peer_host

    async def put(self, messages: list[Message]) -> list[PutResult]:
        """Append, then wait (without a thread) until the flush policy is satisfied; raises
        BrokerError."""
        try:
            return await self._append_and_wait(messages)
        except StoreError as exc:
            raise _refusal(exc) from None

    async def _append_and_wait(self, messages: list[Message]) -> list[PutResult]:
        results, end = self.store.put_unflushed(messages)
        if self._put_inline:  # async flush: written is stored
            return results
        durable, loop = self._durable, asyncio.get_running_loop()
        if durable is None or durable.loop is not loop:
            durable = self._durable = DurableFutures(self.store, loop)
        try:
            await durable.after(end)
        except BaseException:  # the sender hears of a failure (or nothing): the records must not be seen
            self.withdrawn.add([r.commit_log_offset for r in results])
            raise
        return results


def _refusal(exc: StoreError) -> BrokerError:
    """What the client is told when the store did not store (or could not confirm) a send."""
    if isinstance(exc, InvalidMessageError):
        return BrokerError(Code.BAD_REQUEST, f"message refused by the store: {exc}")
    if isinstance(exc, FlushTimeoutError):
        return BrokerError(Code.MASTER_PERSISTENCE_TIMEOUT, f"written but not yet durable: {exc}")
    if isinstance(exc, StoreClosedError):
        return BrokerError(Code.INTERNAL_SERVER_ERROR, "the broker is shutting down")
    log.error("store refused a message: %s", exc)
    if isinstance(exc, StoreIOError):
        return disk_refused(exc, "the message")
    return BrokerError(Code.INTERNAL_SERVER_ERROR, f"store error: {exc}")


def _remember(valid: set, value, limit: int = 10_000) -> None:
    if len(valid) < limit:
        valid.add(value)


def _host_or(host: str, fallback: str) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return fallback
