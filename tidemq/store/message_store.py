"""MessageStore: the embedded store's one entry point.

    store = MessageStore(path, StoreConfig(flush="sync"))
    result = store.put(Message(topic="orders", body=b"...", queue_id=3, tags="paid"))
    got = store.get("orders", 3, offset=0, max_count=32)
    store.close()

Threads and ownership:
- callers of `put` (any number): encode outside the lock (`MessageEncoder`), except the common single put, which
  encodes and writes in one compiled call under it (`_append_one`); `_append_lock` guards the queue-offset
  table, the commit log's write position and segment rolls — one writer at a time;
- the dispatch thread: the only caller of the `ParallelDispatcher`'s `dispatch_until` once the store is
  open (recovery calls it before that thread starts);
- the flush thread (group commit under sync flush, periodic under async) and the maintenance
  thread (checkpoint, consume-queue flush, retention).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, overload

from .dispatch.lag import milliseconds_behind, sink_lags
from .dispatch.parallel import ParallelDispatcher
from .dispatch.requests import ArrivalListener
from .errors import StoreClosedError, StoreIOError, StoreLockedError
from .format import record
from .index.index_file import DEFAULT_HASH_SLOTS, DEFAULT_MAX_ENTRIES
from .index.key_index import KeyIndex
from .light.queues import LIGHT_QUEUE_STORES, LightQueues
from .log.checkpoint import Checkpoint
from .log.commit_log import DEFAULT_SEGMENT_SIZE, CommitLog
from .log.disk_space import DEFAULT_WARNING_LEVEL_RATIO, DiskSpaceGuard, refuse_to_open_if_full
from .log.flush import DurableCallback, FlushListener, GroupCommit, PeriodicService
from .log.message_encoder import CommonPutState, MessageEncoder
from .queues.consume_queue import DEFAULT_UNITS_PER_FILE, Unit
from .queues.queue_set import ConsumeQueueStore
from .recovery.quarantine import DAMAGED_PROPERTY
from .recovery.recover import queue_units, recover

log = logging.getLogger(__name__)

FLUSH_ASYNC = "async"
FLUSH_SYNC = "sync"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class StoreConfig:
    """Store options; names follow RocketMQ's MessageStoreConfig where one exists."""

    segment_size: int = DEFAULT_SEGMENT_SIZE  # mappedFileSizeCommitLog
    consume_queue_units: int = DEFAULT_UNITS_PER_FILE  # mappedFileSizeConsumeQueue / 20
    flush: str = FLUSH_ASYNC  # flushDiskType
    flush_interval_ms: int = 500  # flushIntervalCommitLog
    sync_flush_timeout_ms: int = 5000  # syncFlushTimeout
    max_message_size: int = 4 * 1024 * 1024  # maxMessageSize (body)
    max_topic_bytes: int = 255
    max_queue_id: int = 65535
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    retention_hours: float = 72.0  # fileReservedTime
    maintenance_interval_ms: int = 1000  # checkpoint, consume-queue flush, retention
    repair: bool = False
    # processes building the indexes in parallel (RIP-52); 0: the dispatch thread alone
    dispatch_workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    message_index_enable: bool = True  # messageIndexEnable: the key index (UNIQ_KEY and KEYS)
    index_hash_slots: int = DEFAULT_HASH_SLOTS  # maxHashSlotNum
    index_max_entries: int = DEFAULT_MAX_ENTRIES  # maxIndexNum
    # light message queues (RIP-28): both on for multi-dispatch, as in RocketMQ (see docs/light-queues.md)
    enable_lmq: bool = True  # enableLmq: %LMQ% queues are light queues, read as queue 0
    enable_multi_dispatch: bool = True  # enableMultiDispatch: INNER_MULTI_DISPATCH names get units
    light_queue_store: str = "kv"  # "kv": the key-value tables; "file": RocketMQ's consumequeue/%LMQ%name/0/
    light_queue_idle_expiry_ms: int = 24 * 3600 * 1000  # idle, fully consumed light queues go after it; 0: never
    # enabledAppendPropCRC: each record carries RocketMQ's whole-record CRC property (`__CRC32#`)
    append_crc_property: bool = True
    # diskSpaceWarningLevelRatio: appends are refused while the store's disk is more used (percent)
    disk_space_warning_level_ratio: int = DEFAULT_WARNING_LEVEL_RATIO
    disk_usage: Callable = field(default=shutil.disk_usage, repr=False)  # (path) -> (total, used, free)
    clock: Callable[[], int] = field(default=wall_clock_ms, repr=False)

    def __post_init__(self) -> None:
        if self.flush not in (FLUSH_ASYNC, FLUSH_SYNC):
            raise ValueError(f"flush must be {FLUSH_ASYNC!r} or {FLUSH_SYNC!r}, not {self.flush!r}")
        if self.light_queue_store not in LIGHT_QUEUE_STORES:
            raise ValueError(f"light_queue_store must be one of {LIGHT_QUEUE_STORES}, not {self.light_queue_store!r}")
        if self.light_queue_idle_expiry_ms < 0:
            raise ValueError(
                f"light_queue_idle_expiry_ms must be 0 (never) or more, not {self.light_queue_idle_expiry_ms}"
            )
        if self.dispatch_workers < 0:
            raise ValueError(
                f"dispatch_workers must be 0 (the dispatch thread alone) or more, not {self.dispatch_workers}"
            )


@dataclass
class Message:
    """A message to append.  `tags` and `keys` become the TAGS and KEYS properties."""

    topic: str
    body: bytes
    queue_id: int = 0
    tags: str | None = None
    keys: list[str] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sysflag: int = 0
    born_timestamp: int | None = None
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


class PutResult(NamedTuple):
    """Where a put landed.  `msg_id` is the offset message id (store host + commit-log offset);
    `unique_key` (UNIQ_KEY) is the client-facing message id."""

    commit_log_offset: int
    size: int
    queue_offset: int
    unique_key: str
    store_timestamp: int
    store_host: tuple[str, int]

    @property
    def msg_id(self) -> str:
        return record.message_id(self.store_host, self.commit_log_offset)


@dataclass(slots=True)
class GetResult:
    messages: list[record.Record]  # bodies copied out of the log
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(slots=True, frozen=True)
class DispatchLag:
    bytes: int
    milliseconds: int
    sinks: dict[str, tuple[int, int]] = field(default_factory=dict)  # per sink: (bytes, milliseconds)


_put_common: Callable[..., PutResult | None] | None
_write_records: Callable[..., int] | None
try:  # the compiled append loop; without it (no C compiler at install) the Python loop does it all
    from .log._append import put_common as _put_common
    from .log._append import write_records as _write_records
except ImportError:
    _put_common = _write_records = None

_TRANSACTION_TYPE_MASK = record.TRANSACTION_TYPE_MASK
_TRANSACTION_COMMIT = record.TRANSACTION_COMMIT


class MessageStore:
    def __init__(self, directory: str | os.PathLike, config: StoreConfig | None = None) -> None:
        self.directory = Path(directory)
        self.config = config or StoreConfig()
        self.clock = self.config.clock
        self.directory.mkdir(parents=True, exist_ok=True)
        self._closed = True
        self._lock_fd = self._take_lock()
        self.dispatcher: ParallelDispatcher  # recovery starts it (`_start_dispatcher`)
        try:
            self._open()
        except BaseException:
            dispatcher = getattr(self, "dispatcher", None)
            if dispatcher is not None:
                dispatcher.close()  # its worker processes, if recovery started them
            os.close(self._lock_fd)
            raise
        self._closed = False

    # -- opening --------------------------------------------------------------------------------

    def _take_lock(self) -> int:
        path = self.directory / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(f"store {self.directory} is in use by another process (pid {holder})") from None
        try:
            refuse_to_open_if_full(self.directory, self.config.disk_usage)  # before anything is written
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open(self) -> None:
        cfg = self.config
        self.abort_path = self.directory / "abort"
        self.checkpoint_path = self.directory / "checkpoint"
        abnormal = self.abort_path.exists()
        self.checkpoint = Checkpoint.load(self.checkpoint_path)
        self.commit_log = CommitLog(
            self.directory / "commitlog", cfg.segment_size, background_warm=cfg.flush != FLUSH_SYNC
        )
        self.disk_space = DiskSpaceGuard(
            self.directory / "commitlog", cfg.disk_space_warning_level_ratio, cfg.disk_usage
        )
        self.consume_queues = ConsumeQueueStore(self.directory / "consumequeue", cfg.consume_queue_units)
        self._append_lock = threading.Lock()
        self._queue_offsets: dict[tuple[str, int], int] = {}
        self._last_written = (0, 0)  # (write position, store timestamp) of the newest record
        self.light_queues = (
            LightQueues(
                self.directory,
                self.consume_queues,
                self._queue_offsets,
                self.commit_log,
                self._append_lock,
                multi_dispatch=cfg.enable_multi_dispatch,
                backend=cfg.light_queue_store,
                idle_expiry_ms=cfg.light_queue_idle_expiry_ms,
                max_name_bytes=cfg.max_topic_bytes,
            )
            if cfg.enable_lmq
            else None
        )
        self._expiry_listeners: list[Callable[[list[str]], None]] = []  # told of expired light queues
        self._expiry_driven = False  # light-queue expiry runs from `expire_light_queues`, not maintenance
        self._encoder = MessageEncoder(cfg, self.commit_log.segment_size)
        self._dispatch_event_set = False  # skip redundant Event.set() calls on the put path
        self.key_index = (
            KeyIndex(self.directory / "index", cfg.index_hash_slots, cfg.index_max_entries)
            if cfg.message_index_enable
            else None
        )
        self.damaged_records: set[int] = set()  # offsets of damaged records reads skipped
        recovered = recover(
            self.directory,
            self.commit_log,
            self.consume_queues,
            self.key_index,
            self.light_queues,
            self.checkpoint,
            abnormal,
            cfg.repair,
            self._start_dispatcher,
        )
        self.recovery = recovered.report
        self._queue_offsets.update(recovered.queue_offsets)
        if recovered.last_written is not None:
            self._last_written = recovered.last_written
        self._put_state = self._common_put_state()
        self.dispatcher.limit_source = lambda: self.confirmed_offset
        self.abort_path.write_text(str(os.getpid()))
        self._dispatch_event = threading.Event()
        self._stopping = False
        self.group_commit: GroupCommit | None = None
        self._flush_service: PeriodicService | None = None
        if cfg.flush == FLUSH_SYNC:
            self.group_commit = GroupCommit(self.commit_log, self._on_flushed, cfg.sync_flush_timeout_ms)
        else:
            self._flush_service = PeriodicService("tidemq-flush", cfg.flush_interval_ms / 1000, self._flush_async)
        self._dispatch_thread = threading.Thread(target=self._dispatch_loop, name="tidemq-dispatch", daemon=True)
        self._dispatch_thread.start()
        self._maintenance = PeriodicService(
            "tidemq-maintenance", cfg.maintenance_interval_ms / 1000, self.run_maintenance
        )

    def _start_dispatcher(self, offset: int, parallel: bool = True) -> ParallelDispatcher:
        """The store's dispatcher, starting at `offset` (a rebuild's replaces the first: its
        statistics are those of the records it dispatches again); `parallel=False`: without
        worker processes."""
        self.dispatcher = ParallelDispatcher(
            self.commit_log,
            self.consume_queues,
            self.key_index,
            offset,
            self.config.dispatch_workers if parallel else 0,
        )
        if self.light_queues is not None:
            self.dispatcher.add_sink(self.light_queues)
        return self.dispatcher

    # -- writing --------------------------------------------------------------------------------

    def put(self, message: Message, on_durable: DurableCallback | None = None) -> PutResult:
        """Append one message.

        Without `on_durable`, returns once the flush policy is satisfied.  With it, returns as
        soon as the message is written and later calls `on_durable(result, error)` from the flush
        thread: error is None once the bytes are durable (at once under async flush), or a
        FlushTimeoutError.  Many callers waiting this way share fsyncs without a thread each.

        Raises InvalidMessageError (nothing stored, no queue offset used), StoreIOError (the disk
        refused; nothing stored), FlushTimeoutError (sync flush: written, durability unconfirmed)."""
        group_commit = self.group_commit
        if group_commit is None and on_durable is None:  # async flush: written is stored
            result = self._append_one(message)
            self._wake_dispatcher()
            return result
        blocking = group_commit if on_durable is None else None  # waits here, under sync flush
        if blocking is not None:
            blocking.begin()
        try:
            result = self._append_one(message)
            self._await_durable(result.commit_log_offset + result.size, blocking is not None, on_durable, result)
        finally:
            if blocking is not None:
                blocking.end()
        return result

    @overload
    def put_unflushed(self, messages: Message) -> tuple[PutResult, int]: ...
    @overload
    def put_unflushed(self, messages: list[Message]) -> tuple[list[PutResult], int]: ...

    def put_unflushed(self, messages: Message | list[Message]) -> tuple[PutResult | list[PutResult], int]:
        """Append one message (or a non-empty batch, as `put_batch`) without waiting for the flush
        policy; returns its PutResult (or list of them) and the log offset that must be durable
        before the caller may call it stored (see `await_flush`).  Raises as `put` and
        `put_batch` do when nothing, or only part of a batch, is stored."""
        results: PutResult | list[PutResult]
        if isinstance(messages, list):
            results, end = self._append(messages)
        else:
            result = results = self._append_one(messages)
            end = result.commit_log_offset + result.size
        if self.group_commit is None:
            self._wake_dispatcher()
        return results, end

    def await_flush(self, end_offset: int, listener: FlushListener) -> bool:
        """True if the log up to `end_offset` is already durable under the flush policy (always,
        under async flush).  Else False, and `listener.flushed(position, stopping)` is called from
        the flush thread after the next fsync: one call for any number of waits."""
        group_commit = self.group_commit
        if group_commit is None or group_commit.flushed >= end_offset:
            return True
        return group_commit.request(end_offset, listener)

    def put_batch(self, messages: list[Message], on_durable: DurableCallback | None = None) -> list[PutResult]:
        """Append several messages under one lock and one durability wait, in order.

        Every message is validated first: an InvalidMessageError stores none of them.  A
        StoreIOError part way says how many were stored (`exc.stored`, the first ones) and
        their results (`exc.results`).
        `on_durable(results, error)`, if given, is called once for the whole batch."""
        if not messages:
            return []
        blocking = self.group_commit if on_durable is None else None  # waits here, under sync flush
        if blocking is not None:
            blocking.begin()
        try:
            results, end = self._append(messages)
            self._await_durable(end, blocking is not None, on_durable, results)
        finally:
            if blocking is not None:
                blocking.end()
        return results

    def _common_put_state(self) -> CommonPutState | None:
        """What the compiled single put (`_append.put_common`) reads besides the message; None
        where it is not built."""
        if _put_common is None:
            return None
        clock = None if self.clock is wall_clock_ms else self.clock
        return self._encoder.common_put_state(Message, self._queue_offsets, PutResult, self.commit_log, clock)

    def _append_one(self, message: Message) -> PutResult:
        """`_append` for one message.  The common one (a known topic, tag and born host, no
        properties or keys, a record that ends in the warm pages) is encoded and written in one
        compiled call under the lock; any other, or where that is not built, goes through
        `_append`, which validates it and raises as documented."""
        if self.disk_space.full:
            raise self.disk_space.refusal()
        state = self._put_state
        if state is not None and _put_common is not None:  # a state only where it is built
            with self._append_lock:
                if self._closed:
                    raise StoreClosedError("the store is closed")
                result = _put_common(state, message, self.commit_log.warm_region())
                if result is not None:
                    self._last_written = (result.commit_log_offset + result.size, result.store_timestamp)
            if result is not None:
                return result
        return self._append((message,))[0][0]

    def _append(self, messages) -> tuple[list[PutResult], int]:
        if self._closed:
            raise StoreClosedError("the store is closed")
        light = self.light_queues
        multi = light.check(messages) if light is not None else None  # raises before anything is stored
        prepared = self._encoder.prepare_all(messages)  # raises before anything is stored
        if light is not None and multi:
            light.fit(multi, prepared)
        if self.disk_space.full:
            raise self.disk_space.refusal()
        results: list[PutResult] = []
        with self._append_lock:
            if self._closed:
                raise StoreClosedError("the store is closed")
            store_timestamp = self.clock()
            taken = light.assign(multi, prepared) if light is not None and multi else None
            try:
                self._append_locked(messages, prepared, store_timestamp, results)
            except BaseException as exc:
                if light is not None and taken:
                    light.unassign(taken, len(results))
                if not isinstance(exc, OSError):
                    raise
                cut = f" from message {len(results)} of the batch on" if len(messages) > 1 else ""
                error = StoreIOError(exc.errno, f"append failed, nothing stored{cut}: {exc.strerror or exc}")
                error.stored = len(results)
                error.results = list(results)
                raise error from exc
            finally:
                if results:
                    last = results[-1]
                    self._last_written = (last.commit_log_offset + last.size, store_timestamp)
        return results, self._last_written[0]

    def _append_locked(self, messages, prepared, store_timestamp: int, results: list[PutResult]) -> None:
        """Assign each message its queue offset and write its record at the log's end, in order,
        adding its PutResult to `results` once written (so after an OSError part way, `results`
        holds exactly the stored ones).  The append lock is held.

        The compiled loop (`_append.write_records`, when built) writes the records that fit the
        active segment's warm pages; the Python loop writes the one that does not (it rolls the
        segment or warms more), and the compiled loop goes on after it."""
        write_records = _write_records
        if write_records is None:
            self._append_python(messages, prepared, store_timestamp, results, 0, len(messages))
            return
        if type(messages) is not list and type(messages) is not tuple:
            messages = list(messages)
        commit_log = self.commit_log
        queue_offsets = self._queue_offsets
        store_host = self.config.store_host
        index, count = 0, len(messages)
        while index < count:
            region = commit_log.warm_region()
            if region is not None:
                mm, base, ready_end = region
                index = write_records(
                    mm,
                    base,
                    ready_end,
                    messages,
                    prepared,
                    index,
                    queue_offsets,
                    store_timestamp,
                    store_host,
                    results,
                    PutResult,
                    commit_log,
                    record.crc32,
                )
                if index == count:
                    break
            self._append_python(messages, prepared, store_timestamp, results, index, index + 1)
            index += 1

    def _append_python(
        self, messages, prepared, store_timestamp: int, results: list[PutResult], start: int, stop: int
    ) -> None:
        """`_append_locked` for messages[start:stop], in Python: the reference for the compiled
        loop, and the loop itself where it is not built."""
        commit_log = self.commit_log
        reserve = commit_log.reserve
        queue_offsets = self._queue_offsets
        store_host = self.config.store_host
        stored = results.append
        seal, seal_crc_property = self.config.append_crc_property, record.seal_crc_property
        for index in range(start, stop):
            message = messages[index]
            template, body, body_crc, properties_bytes, unique_key = prepared[index]
            born_timestamp = message.born_timestamp
            if born_timestamp is None:
                born_timestamp = store_timestamp  # the producer's time is unknown: the store's
            sysflag = message.sysflag
            transaction = sysflag & _TRANSACTION_TYPE_MASK
            takes_offset = not transaction or transaction == _TRANSACTION_COMMIT
            key = (message.topic, message.queue_id)
            queue_offset = queue_offsets.get(key, 0) if takes_offset else 0
            size = template.fixed_size + len(body) + len(properties_bytes)
            mm, pos, offset = reserve(size)
            template.write_into(
                mm,
                pos,
                body,
                body_crc,
                message.queue_id,
                properties_bytes,
                born_timestamp,
                message.flag,
                sysflag,
                message.reconsume_times,
                message.prepared_transaction_offset,
                queue_offset,
                offset,
                store_timestamp,
            )
            if seal:
                seal_crc_property(mm, pos, size)
            commit_log.write_position = offset + size
            if takes_offset:
                queue_offsets[key] = queue_offset + 1
            stored(PutResult(offset, size, queue_offset, unique_key, store_timestamp, store_host))

    def _await_durable(self, end: int, blocking: bool, on_durable: DurableCallback | None, token) -> None:
        group_commit = self.group_commit
        if group_commit is not None and blocking:
            group_commit.wait_for(end)
        elif group_commit is not None:
            assert on_durable is not None  # not blocking: the caller is told by callback
            group_commit.register(end, on_durable, token)
        else:
            self._wake_dispatcher()
            if on_durable is not None:
                on_durable(token, None)

    def _wake_dispatcher(self) -> None:
        """Async flush: what is written may be dispatched now (one Event.set per round)."""
        if not self._dispatch_event_set:
            self._dispatch_event_set = True
            self._dispatch_event.set()

    # -- reading --------------------------------------------------------------------------------

    def _light(self, topic: str, queue_id: int) -> LightQueues | None:
        """The light queues, if (topic, queue_id) is one of those in their key-value tables."""
        light = self.light_queues
        return light if light is not None and light.holds(topic, queue_id) else None

    def get(self, topic: str, queue_id: int, offset: int, max_count: int = 32) -> GetResult:
        """Messages of a queue from `offset`, up to its commit frontier."""
        light = self._light(topic, queue_id)
        if light is not None:
            low, high, units = light.read(topic, offset, max_count)
            messages = [m for m in (self.read_unit(u) for u in units) if m is not None]
            next_offset = units[-1].queue_offset + 1 if units else max(offset, low)
            return GetResult(messages, min(next_offset, high), low, high)
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return GetResult([], offset, 0, 0)
        units = cq.read(offset, max_count)
        messages = [m for m in (self.read_unit(u) for u in units) if m is not None]
        next_offset = units[-1].queue_offset + 1 if units else max(offset, cq.min_offset)
        return GetResult(messages, min(next_offset, cq.commit_frontier), cq.min_offset, cq.commit_frontier)

    def read_units(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[Unit]:
        light = self._light(topic, queue_id)
        if light is not None:
            return light.read_units(topic, offset, max_count)
        cq = self.consume_queues.get(topic, queue_id)
        return cq.read(offset, max_count) if cq is not None else []

    def read_unit(self, unit: Unit) -> record.Record | None:
        rec = self.read_record(unit.commit_log_offset)
        if rec is not None and rec.total_size != unit.size:
            return None
        return rec

    def read_record(self, commit_log_offset: int, with_body: bool = True) -> record.Record | None:
        """The record at a commit-log offset (body copied), or None if it is gone or invalid.  With
        its body, its CRCs are verified: a damaged record is never handed out as intact (logged
        once, counted in `damaged_records`), nor a repair's placeholder for one."""
        result = self.commit_log.read_record(commit_log_offset, check_crc=with_body, read_body=with_body)
        if type(result) is not record.Record:
            if type(result) is record.Invalid and result.offset not in self.damaged_records:
                if len(self.damaged_records) < 100_000:
                    self.damaged_records.add(result.offset)
                log.error(
                    "damaged record at commit-log offset %d (%s): skipped; 'tidemq store repair' sets it aside",
                    result.offset,
                    result.reason,
                )
            return None
        if DAMAGED_PROPERTY in result.properties:
            return None
        if with_body:
            result.body = result.body_bytes
        return result

    def store_time_of(self, commit_log_offset: int) -> int | None:
        result = self.commit_log.read_record(commit_log_offset, check_crc=False, read_body=False, read_properties=False)
        return result.store_timestamp if type(result) is record.Record else None

    def min_offset(self, topic: str, queue_id: int) -> int:
        light = self._light(topic, queue_id)
        if light is not None:
            return light.min_offset(topic)
        cq = self.consume_queues.get(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Exclusive maximum readable offset: the queue's commit frontier."""
        light = self._light(topic, queue_id)
        if light is not None:
            return light.max_offset(topic)
        cq = self.consume_queues.get(topic, queue_id)
        return cq.commit_frontier if cq is not None else 0

    def assigned_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset `put` will assign (ahead of max_offset until dispatched)."""
        with self._append_lock:
            if self.light_queues is not None and queue_id == 0 and topic.startswith("%LMQ%"):
                return self.light_queues.assigned_offset(topic)
            return self._queue_offsets.get((topic, queue_id), 0)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int, upper: bool = False) -> int:
        light = self._light(topic, queue_id)
        if light is not None:
            return light.offset_for_timestamp(topic, timestamp, upper)
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_for_timestamp(timestamp, self.store_time_of, upper=upper)

    def query_message(
        self, topic: str, key: str, begin: int = 0, end: int = 2**63 - 1, max_num: int = 64
    ) -> list[record.Record]:
        """Records of `topic` whose UNIQ_KEY or a KEYS entry is `key`, stored within [begin, end]
        (ms), newest first (the key index; empty when it is disabled)."""
        from .index.key_index import query

        return query(self.key_index, self.read_record, topic, key, begin, end, max_num) if self.key_index else []

    def queues(self) -> list[tuple[str, int]]:
        return sorted(self.consume_queues.queues)

    def on_light_queues_expired(self, listener: Callable[[list[str]], None]) -> None:
        """`listener(names)` is called on the maintenance thread with the light queues an expiry
        run removed (a queue of the same name starts again at offset 0)."""
        self._expiry_listeners.append(listener)

    def drive_light_queue_expiry(self) -> None:
        """From now on the maintenance thread leaves light-queue expiry to `expire_light_queues`
        (a broker that keeps consumer progress of its own drives it; a run under way ends first)."""
        self._expiry_driven = True
        if self.light_queues is not None:
            with self.light_queues.expiry_lock:
                pass

    def expire_light_queues(self, forget: Callable[[list[str]], bool]) -> list[str]:
        """Expire idle, fully consumed light queues (at most once a minute), calling
        `forget(names)` before any of `names` is deleted: the caller makes the consumers' progress
        on them durably forgotten there (True), or cannot (False: the run ends, none deleted).  Returns the names
        deleted.  Call `drive_light_queue_expiry` first."""
        if self.light_queues is None:
            return []
        return self.light_queues.expire_due(self.clock(), forget)

    def subscribe(self, listener: ArrivalListener) -> None:
        """`listener({(topic, queue_id): new max offset, ...})` is called on the dispatch thread
        whenever queues get newly committed entries."""
        self.dispatcher.listeners.append(listener)

    # -- dispatch -------------------------------------------------------------------------------

    @property
    def confirmed_offset(self) -> int:
        """What dispatch may read: flushed bytes under sync flush, written bytes under async."""
        if self.group_commit is not None:
            return self.commit_log.flushed_position
        return self.commit_log.write_position

    # While appends stream in, a dispatch round is followed by a pause that grows with what it
    # dispatched (DISPATCH_PAUSE_PER_BYTE_S, up to DISPATCH_PAUSE_MAX_S): the busier the log, the
    # more each round takes (a batch worth handing to the worker processes), and the appenders
    # are not interrupted for every few records (the dispatch thread shares their GIL), while a
    # light stream waits next to nothing.  A record that arrives after a quiet spell is
    # dispatched at once, so long polling hears of it without delay.
    DISPATCH_PAUSE_PER_BYTE_S = 0.002 / 8192  # 2 ms after a round of 8 KiB (about 20 SDK messages)
    DISPATCH_PAUSE_MAX_S = 0.006

    def _dispatch_loop(self) -> None:
        waiting_for_space = False  # a full disk stopped dispatch (said once; it retries)
        while not self._stopping:
            self._dispatch_event.wait(0.01)
            self._dispatch_event.clear()
            self._dispatch_event_set = False
            try:
                moved = self._dispatch_pending()
                if waiting_for_space:
                    log.warning(
                        "dispatch goes on at commit-log offset %d: the disk has room again",
                        self.dispatcher.dispatched_offset,
                    )
                    waiting_for_space = False
                if moved:
                    time.sleep(min(self.DISPATCH_PAUSE_MAX_S, moved * self.DISPATCH_PAUSE_PER_BYTE_S))
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    log.exception("dispatch failed; retrying")
                elif not waiting_for_space:
                    log.error(
                        "dispatch waits at commit-log offset %d for disk space (%s); the records after it "
                        "are stored, and readable once it goes on",
                        self.dispatcher.dispatched_offset,
                        exc,
                    )
                    waiting_for_space = True
                time.sleep(0.1)
            except Exception:
                log.exception("dispatch failed; retrying")
                time.sleep(0.1)

    def _dispatch_pending(self) -> int:
        """Dispatch what is confirmed; returns how many bytes of log that covered."""
        if self.dispatcher.dispatched_offset < self.commit_log.min_offset:
            self.dispatcher.dispatched_offset = self.commit_log.min_offset
        before = self.dispatcher.dispatched_offset
        self.dispatcher.dispatch_until(self.confirmed_offset)
        return self.dispatcher.dispatched_offset - before

    def wait_dispatched(self, timeout: float = 10.0) -> bool:
        """Block until everything confirmed so far is dispatched (tests, tools, shutdown)."""
        deadline = time.monotonic() + timeout
        target = self.confirmed_offset
        while self.dispatcher.dispatched_offset < target:
            if time.monotonic() > deadline:
                return False
            self._dispatch_event.set()
            time.sleep(0.001)
        return True

    def dispatch_lag(self) -> DispatchLag:
        dispatched = self.dispatcher.dispatched_offset
        behind = max(0, self.confirmed_offset - dispatched)
        newest = self._last_written[1]
        millis = milliseconds_behind(
            self.commit_log, dispatched, self.dispatcher.stats.last_store_timestamp, newest, behind
        )
        return DispatchLag(behind, millis, sink_lags(self.dispatcher, self.confirmed_offset, newest))

    # -- flushing and maintenance ----------------------------------------------------------------

    def _on_flushed(self, flushed: int) -> None:
        self._dispatch_event.set()

    def _flush_async(self) -> None:
        self.commit_log.flush()
        self._dispatch_event.set()

    def flush(self) -> None:
        """Make everything written so far durable, indexes included."""
        self.commit_log.flush()
        self._dispatch_event.set()
        self.consume_queues.flush()

    def save_checkpoint(self) -> None:
        """Flush the log and the indexes, then record how far each is durable.  The dispatch
        points are read before the flushes, so that every offset saved is one the files held when
        they were flushed: recovery trusts what lies below them."""
        position, timestamp = self._last_written
        last_dispatched = self.dispatcher.last_record_offset()
        dispatched = self.dispatcher.dispatched_offset
        units = queue_units(self.consume_queues)
        flushed = self.commit_log.flush()
        self.consume_queues.flush()
        cp = self.checkpoint
        if flushed >= position:
            cp.physic_msg_timestamp = max(cp.physic_msg_timestamp, timestamp)
        cp.logics_msg_timestamp = max(cp.logics_msg_timestamp, self.consume_queues.logics_msg_timestamp)
        if self.key_index is not None:
            cp.index_msg_timestamp = max(cp.index_msg_timestamp, self.key_index.flush())
            cp.index_physical_offset = self.key_index.flushed_until
        if self.light_queues is not None:
            self.light_queues.flush()
        if last_dispatched is not None:  # the queues were flushed above: they hold that record
            cp.logics_physical_offset = max(cp.logics_physical_offset, last_dispatched)
        cp.confirm_phy_offset = min(flushed, dispatched)
        cp.logics_unit_count = units
        cp.master_flushed_offset = flushed
        cp.save(self.checkpoint_path)

    def run_maintenance(self) -> None:
        self.disk_space.check()
        self.delete_expired_segments()
        if self.light_queues is not None and not self._expiry_driven:
            expired = self.light_queues.expire_due(self.clock())
            for listener in self._expiry_listeners if expired else ():
                listener(expired)
        try:
            self.save_checkpoint()
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            if not self.disk_space.checkpoint_refused:  # said once; the next round tries again
                log.error("checkpoint not saved, the disk is full (%s): a crash now recovers from the last one", exc)
                self.disk_space.checkpoint_refused = True
            return
        if self.disk_space.checkpoint_refused:
            log.warning("checkpoint saved again")
            self.disk_space.checkpoint_refused = False

    def delete_expired_segments(self) -> int:
        """Delete segments whose newest record is older than the retention time (never the one
        being written); returns how many.  Runs beside appends without taking their lock."""
        horizon = self.clock() - int(self.config.retention_hours * 3600 * 1000)
        segments = list(self.commit_log.segments)
        cut_before = None
        for current, following in itertools.pairwise(segments):
            first = self.commit_log.read_record(
                following.start, check_crc=False, read_body=False, read_properties=False
            )
            # records are in store-time order: the next segment's first record bounds this one's newest
            if type(first) is not record.Record or first.store_timestamp >= horizon:
                break
            if current.end > self.dispatcher.dispatched_offset:
                break  # never delete what is not yet indexed
            cut_before = current.end
        if cut_before is None:
            return 0
        removed = self.commit_log.delete_segments_before(cut_before)
        if removed:
            self.consume_queues.correct_min_offset(self.commit_log.min_offset)
            log.info("retention: deleted %d commit-log segment(s) below offset %d", len(removed), cut_before)
        return len(removed)

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, dispatch the rest, checkpoint, remove the abort marker, stop every thread and
        dispatch worker, close the files and release the lock.

        If the disk refuses a final flush (or the last dispatch or checkpoint fails), the rest
        of the shutdown still happens: threads and workers stop, files close, the lock is
        released, so the store can be opened again (by this process too).  The abort marker
        stays, so that open recovers as after a crash, and the first failure is raised
        (StoreIOError for a disk error)."""
        if self._closed:
            return
        with self._append_lock:
            self._closed = True
        errors: list[Exception] = []

        def attempt(step: Callable[[], object]) -> None:
            try:
                step()
            except Exception as exc:  # keep shutting down; the first failure is raised at the end
                errors.append(exc)

        attempt(self._maintenance.stop)
        if self._flush_service is not None:
            attempt(self._flush_service.stop)
        if self.group_commit is not None:
            attempt(self.group_commit.stop)
        attempt(self.commit_log.flush)
        self._stopping = True
        self._dispatch_event.set()
        self._dispatch_thread.join()
        if not errors:  # with nothing made durable, leave dispatch and checkpoint to recovery
            attempt(lambda: self.dispatcher.dispatch_until(self.confirmed_offset))
            attempt(self.save_checkpoint)
        if not errors and self.dispatcher.dispatched_offset >= self.commit_log.write_position:
            self.abort_path.unlink(missing_ok=True)
        attempt(self.dispatcher.close)
        if self.key_index is not None:
            attempt(self.key_index.close)
        attempt(self.consume_queues.close)
        if self.light_queues is not None:
            attempt(self.light_queues.close)
        attempt(self.commit_log.close)
        os.close(self._lock_fd)
        if errors:
            first = errors[0]
            log.error("closing the store %s failed: %s; the next open recovers as after a crash", self.directory, first)
            if isinstance(first, OSError) and not isinstance(first, StoreIOError):
                raise StoreIOError(first.errno, f"closing the store: {first.strerror or first}") from first
            raise first

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
