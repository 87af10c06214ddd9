"""Transactional messages, stored the way RocketMQ stores them so that a store moves between
tidemq and RocketMQ with its open transactions.

A TRANSACTION send is stored as a *half* message in `RMQ_SYS_TRANS_HALF_TOPIC` queue 0, with
its real topic and queue in `REAL_TOPIC` / `REAL_QID`, `TRAN_MSG=true`, the producer group
(`PGROUP`, the topic for gRPC producers) and `__transactionId__`; no consumer sees it.  Every
half message that is done gets an *op* message in `RMQ_SYS_TRANS_OP_HALF_TOPIC` (same queue id,
tag `d`, body: the half's queue offset and a comma, ASCII).  So the open transactions are
exactly the half messages without an op message, which is what `rebuild` reads back at start.

A transaction's life (one place owns it: `Transactions`):

    prepared --EndTransaction COMMIT--> the real message (sysflag COMMIT, TRAN_MSG, REAL_* cleared)
       |                                 stored with the op message, in one append
       |     --EndTransaction ROLLBACK--> op message only
       | immunity passes (CHECK_IMMUNITY_TIME_IN_SECONDS, else transactionTimeOut), then every
       | transactionCheckInterval:
       v
    checked: a copy is appended to the half queue with TRANSACTION_CHECK_TIMES + 1 (the old
       copy gets its op message in the same append) and a live producer of the topic is sent a
       RecoverOrphanedTransactionCommand; its EndTransaction (source SERVER_CHECK) ends it as above.
       After transactionCheckMax checks, or once older than the store's retention, the half
       message is moved to TRANS_CHECK_MAX_TIME_TOPIC (and gets its op message): dropped.

The transaction id is the message id (UNIQ_KEY), as RocketMQ's broker answers.  Timing runs on
the broker's injected clock.  Owned by the broker's event loop."""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from ..store import Message, MessageStore, record
from .codes import BrokerError, Code
from .config import BrokerConfig
from .sessions import PRODUCER, Sessions
from .types import Publish, SendResult

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
REMOVE_TAG = "d"  # the op message's tag
OFFSET_SEPARATOR = ","

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"

COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
MAX_RECOVERY_SECONDS = 3600  # maxTransactionRecoverySecond of RocketMQ's proxy
_OUTBOX_SIZE = 1024  # checks queued per producer; past it a check waits for the next round


@dataclass(slots=True)
class Half:
    """An open transaction: its latest half message."""

    message_id: str
    topic: str  # the real topic
    half_offset: int  # queue offset in the half queue
    commit_log_offset: int
    born: int  # ms: immunity counts from here
    immunity_ms: int
    checks: int  # TRANSACTION_CHECK_TIMES of this copy
    next_check: int  # ms


@dataclass(slots=True, frozen=True)
class TransactionCheck:
    """A command for a producer: resolve this transaction (RecoverOrphanedTransactionCommand)."""

    record: record.Record  # the half message as the producer sent it (its real topic and queue)
    transaction_id: str


def to_half(message: Message, producer_group: str, born: int, immunity_seconds: int | None) -> Message:
    """The half message that stands for `message` (already given its real topic and queue)."""
    properties = dict(message.properties)
    properties[PROPERTY_TRANSACTION_PREPARED] = "true"
    properties[PROPERTY_PRODUCER_GROUP] = producer_group
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    unique_key = properties.get(record.PROPERTY_UNIQ_KEY)
    if unique_key:
        properties[PROPERTY_TRANSACTION_ID] = unique_key
    if immunity_seconds is not None:
        properties[PROPERTY_CHECK_IMMUNITY_SECONDS] = str(immunity_seconds)
    return Message(
        topic=HALF_TOPIC,
        body=message.body,
        queue_id=0,
        tags=message.tags,
        keys=message.keys,
        properties=properties,
        flag=message.flag,
        sysflag=message.sysflag & ~record.TRANSACTION_TYPE_MASK,
        born_timestamp=born,
        born_host=message.born_host,
        reconsume_times=message.reconsume_times,
    )


def committed(half: record.Record) -> Message:
    """The real message a committed half message becomes."""
    properties = dict(half.properties)
    topic = properties.pop(PROPERTY_REAL_TOPIC)
    queue_id = int(properties.pop(PROPERTY_REAL_QUEUE_ID))
    properties.pop(PROPERTY_TRANSACTION_PREPARED, None)
    return Message(
        topic=topic,
        body=half.body_bytes,
        queue_id=queue_id,
        properties=properties,
        flag=half.flag,
        sysflag=(half.sysflag & ~record.TRANSACTION_TYPE_MASK) | record.TRANSACTION_COMMIT,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.commit_log_offset,
    )


def _copy(half: record.Record, topic: str, properties: dict[str, str]) -> Message:
    return Message(
        topic=topic,
        body=half.body_bytes,
        queue_id=0,
        properties=properties,
        flag=half.flag,
        sysflag=half.sysflag,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
    )


def op_message(half_queue_id: int, half_offset: int, store_host: tuple[str, int], now: int) -> Message:
    return Message(
        topic=OP_TOPIC,
        body=f"{half_offset}{OFFSET_SEPARATOR}".encode("ascii"),
        queue_id=half_queue_id,
        tags=REMOVE_TAG,
        born_timestamp=now,
        born_host=store_host,
    )


def op_offsets(op: record.Record) -> list[int]:
    """The half-queue offsets an op message marks done (RocketMQ batches several in one)."""
    if op.tags != REMOVE_TAG or op.body is None:
        return []
    out = []
    for part in op.body_bytes.decode("ascii", "replace").split(OFFSET_SEPARATOR):
        if part.strip().lstrip("-").isdigit():
            out.append(int(part))
    return out


class Transactions:
    def __init__(
        self,
        store: MessageStore,
        config: BrokerConfig,
        sessions: Sessions,
        put: Callable[[list[Message]], Awaitable[list]],
    ) -> None:
        self.store = store
        self.config = config
        self.clock = config.clock
        self.sessions = sessions
        self.put = put  # stores messages together and waits for the flush policy; raises BrokerError
        self.pending: dict[str, Half] = {}  # message id -> its open transaction
        self._due: list[tuple[int, str, int]] = []  # (next_check, message id, half offset), lazily stale
        self.outboxes: dict[str, asyncio.Queue] = {}  # client id -> commands for its telemetry stream
        self.stats = dict.fromkeys(("prepared", "committed", "rolled_back", "checks", "discarded"), 0)

    # -- start ----------------------------------------------------------------------------------

    def rebuild(self) -> int:
        """Open transactions from the half and op queues: half messages without an op message
        (the latest copy of each).  Returns how many."""
        store = self.store
        done: set[int] = set()
        for op in _read_queue(store, OP_TOPIC, 0):
            done.update(op_offsets(op))
        for half in _read_queue(store, HALF_TOPIC, 0):
            message_id = half.properties.get(PROPERTY_TRANSACTION_ID) or half.unique_key
            if not message_id or PROPERTY_REAL_TOPIC not in half.properties:
                continue
            if half.queue_offset in done:
                self.pending.pop(message_id, None)
                continue
            self._open(self._half_of(half, message_id))
        if self.pending:
            log.info("transactions: %d open after start", len(self.pending))
        return len(self.pending)

    def _half_of(self, half: record.Record, message_id: str) -> Half:
        properties = half.properties
        immunity_ms = self.config.transaction_timeout_ms
        custom = properties.get(PROPERTY_CHECK_IMMUNITY_SECONDS, "")
        if custom.isdigit():
            immunity_ms = int(custom) * 1000
        checks = properties.get(PROPERTY_CHECK_TIMES, "0")
        born = half.born_timestamp
        return Half(
            message_id,
            properties[PROPERTY_REAL_TOPIC],
            half.queue_offset,
            half.commit_log_offset,
            born,
            immunity_ms,
            int(checks) if checks.isdigit() else 0,
            born + immunity_ms,
        )

    def _open(self, half: Half) -> None:
        self.pending[half.message_id] = half
        heapq.heappush(self._due, (half.next_check, half.message_id, half.half_offset))

    # -- send and end ---------------------------------------------------------------------------

    def half_message(self, message: Message, msg: Publish) -> Message:
        seconds = msg.transaction_recovery_seconds
        if seconds is not None and not 0 <= seconds <= MAX_RECOVERY_SECONDS:
            raise BrokerError(
                Code.BAD_REQUEST, f"transaction recovery time {seconds} s outside [0, {MAX_RECOVERY_SECONDS}] s"
            )
        return to_half(message, msg.topic, msg.born_timestamp or self.clock(), seconds)

    def prepared(self, msg: Publish, result: SendResult) -> SendResult:
        """A half message is stored: the transaction is open."""
        born = msg.born_timestamp or self.clock()
        seconds = msg.transaction_recovery_seconds
        immunity_ms = seconds * 1000 if seconds is not None else self.config.transaction_timeout_ms
        self._open(
            Half(
                msg.message_id,
                msg.topic,
                result.queue_offset,
                result.commit_log_offset,
                born,
                immunity_ms,
                0,
                born + immunity_ms,
            )
        )
        self.stats["prepared"] += 1
        return SendResult(
            result.message_id,
            result.queue_id,
            result.queue_offset,
            result.commit_log_offset,
            transaction_id=msg.message_id,
        )

    async def end(self, topic: str, message_id: str, transaction_id: str, resolution: str) -> None:
        """EndTransaction: commit or roll back; any other resolution leaves it open (checked
        again later).  An unknown transaction answers as RocketMQ's proxy does."""
        if not transaction_id or not transaction_id.strip():
            raise BrokerError(Code.INVALID_TRANSACTION_ID, "transaction id is blank")
        key = transaction_id if transaction_id in self.pending else message_id
        half = self.pending.get(key)
        if half is None or half.topic != topic:
            raise BrokerError(
                Code.INTERNAL_SERVER_ERROR, f"cannot find transaction data of {transaction_id!r} on topic {topic!r}"
            )
        if resolution not in (COMMIT, ROLLBACK):
            return
        messages = [self._op(half)]
        if resolution == COMMIT:
            rec = self.store.read_record(half.commit_log_offset)
            if rec is None:
                raise BrokerError(
                    Code.INTERNAL_SERVER_ERROR, f"half message of {half.message_id!r} is gone from the store"
                )
            messages.insert(0, committed(rec))
        del self.pending[key]  # claimed: a second EndTransaction meanwhile finds nothing
        try:
            await self.put(messages)
        except BrokerError:
            self.pending.setdefault(key, half)
            raise
        self.stats["committed" if resolution == COMMIT else "rolled_back"] += 1

    def _op(self, half: Half) -> Message:
        return op_message(0, half.half_offset, self.store.config.store_host, self.clock())

    # -- check back -----------------------------------------------------------------------------

    async def check(self, now: int) -> int:
        """Check every open transaction that is due; returns how many were checked or dropped."""
        done = 0
        due = self._due
        while due and due[0][0] <= now:
            _, message_id, half_offset = heapq.heappop(due)
            half = self.pending.get(message_id)
            if half is None or half.half_offset != half_offset or half.next_check > now:
                continue
            rec = self.store.read_record(half.commit_log_offset)
            if rec is None:
                log.warning("transaction %s: half message gone from the store; dropped", message_id)
                del self.pending[message_id]
                continue
            retention_ms = self.store.config.retention_hours * 3600 * 1000
            if half.checks >= self.config.transaction_check_max or now - half.born > retention_ms:
                await self._discard(half, rec)
            else:
                await self._check_one(half, rec, now)
            done += 1
        return done

    async def _discard(self, half: Half, rec: record.Record) -> None:
        log.warning(
            "transaction %s on %s checked %d times without an answer: moved to %s",
            half.message_id,
            half.topic,
            half.checks,
            CHECK_MAX_TOPIC,
        )
        del self.pending[half.message_id]
        try:
            await self.put([_copy(rec, CHECK_MAX_TOPIC, dict(rec.properties)), self._op(half)])
        except BrokerError as exc:
            log.error("transaction %s: could not drop (%s); checked again later", half.message_id, exc.message)
            self._open(replace(half, next_check=self.clock() + self.config.transaction_check_interval_ms))
            return
        self.stats["discarded"] += 1

    async def _check_one(self, half: Half, rec: record.Record, now: int) -> None:
        properties = dict(rec.properties)
        properties[PROPERTY_CHECK_TIMES] = str(half.checks + 1)
        try:
            (copy, _) = await self.put([_copy(rec, HALF_TOPIC, properties), self._op(half)])
        except BrokerError as exc:
            log.error("transaction %s: could not renew its half message (%s)", half.message_id, exc.message)
            self._open(replace(half, next_check=now + self.config.transaction_check_interval_ms))
            return
        if self.pending.get(half.message_id) is not half:  # ended while the copy was stored
            try:
                await self.put([op_message(0, copy.queue_offset, self.store.config.store_host, now)])
            except BrokerError as exc:
                log.error(
                    "transaction %s: no op message for its last copy (%s); open again after a restart",
                    half.message_id,
                    exc.message,
                )
            return
        self._open(
            replace(
                half,
                half_offset=copy.queue_offset,
                commit_log_offset=copy.commit_log_offset,
                checks=half.checks + 1,
                next_check=now + self.config.transaction_check_interval_ms,
            )
        )
        self.stats["checks"] += 1
        producers = [
            cid
            for cid, session in self.sessions.clients.items()
            if cid in self.outboxes
            and session.client_type == PRODUCER
            and half.topic in session.topics
            and self.sessions.alive(cid, now)
        ]
        if not producers:
            log.info("transaction %s: no producer of %s online to check it", half.message_id, half.topic)
            return
        shown = replace(
            rec, topic=half.topic, queue_id=int(rec.properties.get(PROPERTY_REAL_QUEUE_ID, 0)), properties=properties
        )
        try:
            self.outboxes[random.choice(producers)].put_nowait(TransactionCheck(shown, half.message_id))
        except asyncio.QueueFull:
            log.warning("transaction %s: the producer's check queue is full", half.message_id)

    # -- telemetry ------------------------------------------------------------------------------

    def attach(self, client_id: str) -> asyncio.Queue:
        """The queue of commands for a client's telemetry stream (the latest stream gets them)."""
        queue = self.outboxes[client_id] = asyncio.Queue(_OUTBOX_SIZE)
        return queue

    def detach(self, client_id: str, queue: asyncio.Queue) -> None:
        if self.outboxes.get(client_id) is queue:
            del self.outboxes[client_id]


def _read_queue(store: MessageStore, topic: str, queue_id: int, batch: int = 256):
    offset = store.min_offset(topic, queue_id)
    high = store.max_offset(topic, queue_id)
    while offset < high:
        got = store.get(topic, queue_id, offset, batch)
        if not got.messages:
            if got.next_offset <= offset:
                return
            offset = got.next_offset
            continue
        yield from got.messages
        offset = got.next_offset
