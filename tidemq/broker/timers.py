"""Delay and timer messages, stored as RocketMQ 5.5.0 stores them, and the service that releases
them to their topics when due.

Storage (RocketMQ's HookUtils / TimerMessageStore / ScheduleMessageService):
- A message with a delivery time in the future is stored in queue 0 of the timer topic
  `rmq_sys_wheel_timer` with `TIMER_OUT_MS` (its due time, ms), `REAL_TOPIC` and `REAL_QID`
  added; the client's `TIMER_DELIVER_MS` stays.  A 4.x delay-level message (`DELAY` = level) is
  stored in queue `level - 1` of `SCHEDULE_TOPIC_XXXX`, due at its store time plus the level's
  delay (`messageDelayLevel`), read from the record, never from the consume-queue tags code.
- When due, a copy goes to `REAL_TOPIC`/`REAL_QID` with `REAL_*` removed and `TIMER_ENQUEUE_MS`,
  `TIMER_DEQUEUE_MS` added (timer messages), or `DELAY` and `TIMER_*` delivery times removed
  (delay levels).
- A recall stores a marker in the timer topic: `TIMER_DEL_UNIQKEY` = `topic+uniqueKey`, due a
  millisecond after the message it cancels; a due message whose key is marked is dropped.

The service (owned by the broker's event loop, no locks):
- Pending timers are a binary heap of `due << 40 | timer-queue offset` ints: a pop or a push
  costs O(log n) and a tick pops only what is due, so the work per tick does not grow with the
  number pending.  The heap is filled incrementally from the timer queue, in offset order, from
  `loaded` (the next offset to read) up to the queue's commit frontier, a bounded batch per call.
  Delay levels need no heap: within a level the due times follow the queue order, so each level
  is a cursor whose head is its next due message.
- Checkpoint (`{store}/config/timers.json`, written atomically every second when changed and at
  close, after the store is flushed so that every release it counts is durable): `low`, the
  lowest timer-queue offset not yet released; rules `[upto, floor, above]`: of the entries
  below `upto` (read into the heap by then), those with a heap key below `floor` went out (None:
  all did), and so did those at offsets `above` (a timer read after its due time can go out
  before an earlier-read one with a later key); each delay level's cursor (also in RocketMQ's
  `config/delayOffset.json`, read instead when it is not the one tidemq wrote).  After an open
  the timer queue is read again from `low`, in the same rounds, each entry judged by the rules
  read at the open; a checkpoint written before that reading is done carries the old rules for
  the rest.  So no timer is lost; after a clean close none is released twice; after a crash
  those released since the last checkpoint go out again.
- RocketMQ keeps its progress in `config/timercheck` (lastReadTimeMs at 0, lastTimerQueueOffset
  at 16, masterTimerQueueOffset at 24).  tidemq writes it with each checkpoint (read time now,
  queue offsets `low`), so that RocketMQ opening the store reads the timer queue from the lowest
  pending entry; entries above it that tidemq released go out again there.  When tidemq opens
  a store whose timercheck is not the one it wrote (RocketMQ ran since, or only RocketMQ did),
  it starts from RocketMQ's progress: entries below its queue offset due before its read time
  went out; the rest are pending."""

from __future__ import annotations

import base64
import heapq
import json
import logging
import os
import re
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..store import Message, MessageStore, record
from .clock import Clock

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

TIMER_TOPIC = "rmq_sys_wheel_timer"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_DELAY = "DELAY"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
RECALL_TAG = "_RECALL_TAG_"

# messageDelayLevel "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", in ms
DELAY_LEVELS_MS = tuple(
    s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)

_OFFSET_BITS = 40  # timer-queue offsets below 2**40 share a heap key with their due time
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_LOAD_BATCH = 256  # consume-queue units read per step while loading
_RELEASE_BATCH = 256  # messages stored together per release step
_LOAD_ROUND = 4096  # entries one round loads at most: a round holds the event loop for a few ms

Put = Callable[[list[Message]], Awaitable[list]]


TIMERCHECK = "timercheck"  # RocketMQ's timer checkpoint, in the store's config directory
DELAY_OFFSET_FILE = "delayOffset.json"  # RocketMQ's delay-level progress, beside it
_OFFSET_TABLE = re.compile(r'"offsetTable"\s*:\s*\{([^}]*)\}')
_OFFSET_ENTRY = re.compile(r'"?(\d+)"?\s*:\s*(\d+)')
_TIMERCHECK_SIZE = 4096


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- the messages ----------------------------------------------------------------------------------


def timer_message(message: Message, due_ms: int) -> Message:
    """`message` (for its real topic and queue) as it is kept in the timer topic until `due_ms`."""
    properties = dict(message.properties)
    properties[PROPERTY_TIMER_DELIVER_MS] = properties.get(PROPERTY_TIMER_DELIVER_MS, str(due_ms))
    properties[PROPERTY_TIMER_OUT_MS] = str(due_ms)
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QID] = str(message.queue_id)
    return _moved(message, TIMER_TOPIC, 0, properties)


def delay_level_message(message: Message, level: int) -> Message:
    """`message` as it is kept in SCHEDULE_TOPIC_XXXX for delay `level` (capped at the last)."""
    level = min(level, len(DELAY_LEVELS_MS))
    properties = dict(message.properties)
    properties[PROPERTY_DELAY] = str(level)
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QID] = str(message.queue_id)
    return _moved(message, SCHEDULE_TOPIC, level - 1, properties)


def recall_marker(topic: str, unique_key: str, handle_ms: int) -> Message:
    """The timer-topic entry that cancels `topic`'s message `unique_key` (RocketMQ's recall)."""
    properties = {
        PROPERTY_TIMER_DEL_UNIQKEY: delete_key(topic, unique_key),
        record.PROPERTY_UNIQ_KEY: unique_key,
        PROPERTY_TIMER_DELIVER_MS: str(handle_ms),
        PROPERTY_TIMER_OUT_MS: str(handle_ms - 1),
        PROPERTY_REAL_TOPIC: topic,
        PROPERTY_REAL_QID: "0",
    }
    return Message(topic=TIMER_TOPIC, body=b"0", queue_id=0, tags=RECALL_TAG, properties=properties)


def delete_key(topic: str, unique_key: str) -> str:
    return f"{topic}+{unique_key}"


def _moved(message: Message, topic: str, queue_id: int, properties: dict[str, str]) -> Message:
    return Message(
        topic=topic,
        body=message.body,
        queue_id=queue_id,
        tags=message.tags,
        keys=message.keys,
        properties=properties,
        flag=message.flag,
        sysflag=message.sysflag,
        born_timestamp=message.born_timestamp,
        born_host=message.born_host,
        reconsume_times=message.reconsume_times,
    )


def released_message(rec: record.Record, now: int, enqueued_ms: int | None = None) -> Message | None:
    """The copy of a due record that goes to its real topic, or None if it names none."""
    properties = dict(rec.properties)
    topic = properties.get(PROPERTY_REAL_TOPIC)
    qid = properties.get(PROPERTY_REAL_QID, "0")
    if not topic or not qid.isdigit():
        return None
    if rec.topic == SCHEDULE_TOPIC:  # REAL_* stay, as RocketMQ's ScheduleMessageService leaves them
        for name in (PROPERTY_DELAY, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC):
            properties.pop(name, None)
    else:
        del properties[PROPERTY_REAL_TOPIC]
        properties.pop(PROPERTY_REAL_QID, None)
        if enqueued_ms is not None:
            properties[PROPERTY_TIMER_ENQUEUE_MS] = str(enqueued_ms)
        properties[PROPERTY_TIMER_DEQUEUE_MS] = str(now)
    tags = properties.get(record.PROPERTY_TAGS)
    keys = properties.get(record.PROPERTY_KEYS)
    for name in (record.PROPERTY_TAGS, record.PROPERTY_KEYS):
        properties.pop(name, None)
    return Message(
        topic=topic,
        body=rec.body_bytes,
        queue_id=int(qid),
        tags=tags,
        keys=[k for k in keys.split(record.KEY_SEPARATOR) if k] if keys else None,
        properties=properties,
        flag=rec.flag,
        sysflag=rec.sysflag,
        born_timestamp=rec.born_timestamp,
        born_host=rec.born_host,
        reconsume_times=rec.reconsume_times,
    )


def due_of(rec: record.Record) -> int | None:
    """When a timer-topic record is due (TIMER_OUT_MS, else TIMER_DELIVER_MS), or None."""
    for name in (PROPERTY_TIMER_OUT_MS, PROPERTY_TIMER_DELIVER_MS):
        value = rec.properties.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


# -- recall handles (RocketMQ's RecallMessageHandle v1) --------------------------------------------


def recall_handle(topic: str, broker_name: str, due_ms: int, unique_key: str) -> str:
    """Base64 (URL-safe) of "v1 topic brokerName timestamp uniqueKey"; the timestamp is a
    millisecond past the due time, as RocketMQ makes it."""
    raw = " ".join(("v1", topic, broker_name, str(due_ms + 1), unique_key))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def parse_recall_handle(handle: str) -> tuple[str, str, int, str] | None:
    """(topic, broker name, timestamp ms, unique key), or None if it is not a v1 handle."""
    try:
        items = base64.urlsafe_b64decode(handle.encode()).decode().split(" ")
    except (ValueError, UnicodeError):
        return None
    if len(items) < 5 or items[0] != "v1":
        return None
    try:
        timestamp = int(items[3])
    except ValueError:
        timestamp = -1
    return items[1], items[2], timestamp, items[4]


# -- the service -----------------------------------------------------------------------------------


class TimerService:
    """Releases due timer and delay-level messages through `put` (the broker's durable store
    call).  `release_due()` does one round; the broker runs `run()` in the background."""

    def __init__(self, store: MessageStore, directory: Path, clock: Clock, put: Put) -> None:
        self.store = store
        self.path = directory / "timers.json"
        self.clock = clock
        self.put = put
        self._heap: list[int] = []
        self._deleted: dict[str, int] = {}  # delete key -> due time of its marker
        self._loaded = 0  # next timer-queue offset to read into the heap
        self._low = 0  # every timer-queue offset below it is released (or a marker)
        self._done = bytearray()  # per offset in [_low, _loaded): 1 once released
        self._above: set[int] = set()  # offsets released out of key order, kept for the checkpoint
        self._rules: list[tuple[int, int | None, set[int]]] = []  # the last checkpoint's, for what is not read yet
        self._recent: list[int] = []  # keys released since the last checkpoint
        self._levels: dict[int, int] = {}  # delay level queue -> next offset to release
        self._dirty = False
        self._timercheck_counter = 0
        self.stats = {"timers_released": 0, "timers_recalled": 0, "delay_levels_released": 0}
        self._wake: asyncio.Event | None = None  # made by run(), on its loop
        self._open()

    # -- checkpoint --------------------------------------------------------------------------

    def _open(self) -> None:
        state = self._read_checkpoint()
        self._loaded = self._low = max(state.get("low", 0), self.store.min_offset(TIMER_TOPIC, 0))
        self._rules = sorted((upto, floor, set(above)) for upto, floor, above in state.get("rules", ()))
        self._levels = {int(q): int(o) for q, o in state.get("levels", {}).items()}
        rocketmq_levels = self._read_delay_offsets()
        if rocketmq_levels is not None and rocketmq_levels != state.get("delayOffset"):
            self._levels = {int(level) - 1: offset for level, offset in rocketmq_levels.items() if int(level) >= 1}
        self._dirty = False

    def _read_checkpoint(self) -> dict:
        """tidemq's checkpoint, unless RocketMQ ran on the store since tidemq wrote it (its
        timercheck is not the one tidemq left), or there is only RocketMQ's."""
        state = json.loads(self.path.read_text()) if self.path.exists() else None
        rocketmq = self._read_timercheck()
        if rocketmq is not None and (state is None or list(rocketmq) != state.get("timercheck")):
            read_time, queue_offset = rocketmq
            log.info(
                "timers start from RocketMQ's timer checkpoint: queue offset %d, read time %d", queue_offset, read_time
            )
            # entries below the queue offset due before the read time went out
            return {"low": 0, "rules": [[queue_offset, read_time << _OFFSET_BITS, []]]}
        return state or {}

    def _read_timercheck(self) -> tuple[int, int] | None:
        """(lastReadTimeMs, lastTimerQueueOffset) of RocketMQ's `config/timercheck`, if any."""
        path = self.path.parent / TIMERCHECK
        if not path.exists() or path.stat().st_size < 24:
            return None
        with open(path, "rb") as f:
            read_time, _, queue_offset = struct.unpack(">qqq", f.read(24))
        return read_time, queue_offset

    def _write_timercheck(self, now: int) -> list[int]:
        """RocketMQ's timer checkpoint for this progress, so that RocketMQ 5.5.0 opening the store
        reads the timer queue from the lowest pending entry (it keeps its pending timers in
        files of its own, which it rebuilds from there) instead of from the start, which would
        release every retained timer again.  Returns what RocketMQ reads back from it."""
        self._timercheck_counter += 1
        page = bytearray(_TIMERCHECK_SIZE)
        struct.pack_into(">qqqqqqq", page, 0, now, 0, self._low, self._low, 0, now, self._timercheck_counter)
        _write_atomically(self.path.parent / TIMERCHECK, bytes(page))
        return [now, self._low]

    def checkpoint(self) -> None:
        """Write the progress (the caller has made the releases it counts durable)."""
        floor = self._heap[0] if self._heap else None
        above = {k & _OFFSET_MASK for k in self._recent if floor is not None and k >= floor}
        above |= {o for o in self._above if o >= self._low}
        self._above = above if floor is not None else set()
        self._recent.clear()
        # entries not read since the open keep the rule they had
        rules = [[self._loaded, floor, sorted(self._above)]]
        rules += [[upto, f, sorted(a)] for upto, f, a in self._rules if upto > self._loaded]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        timercheck = self._write_timercheck(self.clock())
        delay_offsets = self._write_delay_offsets(self.clock())
        state = {
            "low": self._low,
            "rules": rules,
            "levels": {str(q): o for q, o in sorted(self._levels.items())},
            "timercheck": timercheck,
            "delayOffset": delay_offsets,
        }
        _write_atomically(self.path, json.dumps(state).encode())
        self._dirty = False

    def _read_delay_offsets(self) -> dict[str, int] | None:
        """RocketMQ's `config/delayOffset.json` offsetTable (delay level -> next offset), if any.
        RocketMQ's JSON writer leaves these integer keys unquoted, so they are read leniently."""
        path = self.path.parent / DELAY_OFFSET_FILE
        if not path.exists():
            return None
        table = _OFFSET_TABLE.search(path.read_text(errors="replace"))
        if table is None:
            return None
        return {level: int(offset) for level, offset in _OFFSET_ENTRY.findall(table.group(1))}

    def _write_delay_offsets(self, now: int) -> dict[str, int]:
        """Each delay level's cursor in RocketMQ's `config/delayOffset.json`, so that RocketMQ
        opening the store goes on from there.  Returns the table written."""
        table = {str(qid + 1): offset for qid, offset in sorted(self._levels.items())}
        document = {
            "offsetTable": table,
            "dataVersion": {"counter": self._timercheck_counter, "stateVersion": 0, "timestamp": now},
        }
        _write_atomically(self.path.parent / DELAY_OFFSET_FILE, json.dumps(document).encode())
        return table

    # -- loading -----------------------------------------------------------------------------

    def _load(self, limit: int = _LOAD_ROUND) -> int:
        """Read up to `limit` timer-queue entries from `_loaded` into the heap, skipping those
        the checkpoint read at the open says went out."""
        store, read, rules = self.store, 0, self._rules
        high = store.max_offset(TIMER_TOPIC, 0)
        while self._loaded < high and read < limit:
            units = store.read_units(TIMER_TOPIC, 0, self._loaded, _LOAD_BATCH)
            if not units:
                break
            for unit in units:
                offset = unit.queue_offset
                self._loaded = offset + 1
                self._done.append(0)
                read += 1
                rec = store.read_unit(unit)
                due = due_of(rec) if rec is not None else None
                if rec is None or due is None:
                    self._mark_done(offset)
                    continue
                key = due << _OFFSET_BITS | offset
                marker = rec.properties.get(PROPERTY_TIMER_DEL_UNIQKEY)
                while rules and offset >= rules[0][0]:
                    del rules[0]
                if rules and (rules[0][1] is None or key < rules[0][1] or offset in rules[0][2]):
                    self._mark_done(offset)  # went out before the open
                    continue
                if marker:
                    self._deleted[marker] = max(due, self._deleted.get(marker, due))
                heapq.heappush(self._heap, key)
        return read

    def _mark_done(self, offset: int) -> None:
        if offset < self._low:
            return
        self._done[offset - self._low] = 1
        self._dirty = True
        start = 0
        while start < len(self._done) and self._done[start]:
            start += 1
        if start:
            del self._done[:start]
            self._low += start

    # -- release -----------------------------------------------------------------------------

    def loading(self) -> bool:
        """Whether timer-queue entries wait to be read into the heap."""
        return self._loaded < self.store.max_offset(TIMER_TOPIC, 0)

    def pending(self) -> int:
        """Timers (and recall markers) read and not yet due."""
        return len(self._heap)

    def recall(self, topic: str, unique_key: str, due_ms: int) -> None:
        """Cancel now, before the marker (already stored by the caller) is read back."""
        key = delete_key(topic, unique_key)
        self._deleted[key] = max(due_ms, self._deleted.get(key, due_ms))

    def next_due(self) -> int | None:
        dues = [self._heap[0] >> _OFFSET_BITS] if self._heap else []
        for qid, offset in self._levels.items():
            head = self._level_head(qid, offset)
            if head is not None:
                dues.append(head[1])
        return min(dues) if dues else None

    async def release_due(self) -> int:
        """Load what arrived, then store every message due by now in its topic.  Returns how
        many went out."""
        now = self.clock()
        self._load()
        released = 0
        while self._heap and self._heap[0] >> _OFFSET_BITS <= now:
            batch: list[tuple[int, Message | None]] = []
            while self._heap and self._heap[0] >> _OFFSET_BITS <= now and len(batch) < _RELEASE_BATCH:
                key = heapq.heappop(self._heap)
                batch.append((key, self._timer_release(key, now)))
            out = [(k, m) for k, m in batch if m is not None]
            if out and not await self._put([m for _, m in out]):
                for key, _ in out:
                    heapq.heappush(self._heap, key)  # tried again at the next round
                for key, m in batch:
                    if m is None:
                        self._finish(key)
                break
            for key, _ in batch:
                self._finish(key)
            released += len(out)
            self.stats["timers_released"] += len(out)
        released += await self._release_levels(now)
        return released

    def _finish(self, key: int) -> None:
        self._recent.append(key)
        self._mark_done(key & _OFFSET_MASK)

    def _timer_release(self, key: int, now: int) -> Message | None:
        """The message to store for the due entry `key`, or None (marker, recalled, gone)."""
        offset = key & _OFFSET_MASK
        units = self.store.read_units(TIMER_TOPIC, 0, offset, 1)
        rec = self.store.read_unit(units[0]) if units and units[0].queue_offset == offset else None
        if rec is None:
            log.error("timer-queue entry %d is gone before its due time; nothing to release", offset)
            return None
        marker = rec.properties.get(PROPERTY_TIMER_DEL_UNIQKEY)
        if marker:
            if self._deleted.get(marker, 0) <= key >> _OFFSET_BITS:
                self._deleted.pop(marker, None)
            return None
        topic, unique_key = rec.properties.get(PROPERTY_REAL_TOPIC), rec.unique_key
        if topic and unique_key and delete_key(topic, unique_key) in self._deleted:
            self.stats["timers_recalled"] += 1
            return None
        message = released_message(rec, now, rec.store_timestamp)
        if message is None:
            log.error("timer-queue entry %d names no real topic; dropped", offset)
        return message

    def _level_head(self, qid: int, offset: int):
        """(record, due) of a delay level's next message, or None."""
        units = self.store.read_units(SCHEDULE_TOPIC, qid, offset, 1)
        if not units:
            return None
        rec = self.store.read_unit(units[0])
        if rec is None:
            return None
        return rec, rec.store_timestamp + DELAY_LEVELS_MS[min(qid, len(DELAY_LEVELS_MS) - 1)]

    async def _release_levels(self, now: int) -> int:
        released = 0
        store = self.store
        for qid in range(len(DELAY_LEVELS_MS)):
            offset = max(self._levels.get(qid, 0), store.min_offset(SCHEDULE_TOPIC, qid))
            high = store.max_offset(SCHEDULE_TOPIC, qid)
            if offset >= high:
                continue
            self._levels.setdefault(qid, offset)
            while offset < high:
                out, nxt = [], offset
                for unit in store.read_units(SCHEDULE_TOPIC, qid, offset, _RELEASE_BATCH):
                    rec = store.read_unit(unit)
                    if rec is not None:
                        if rec.store_timestamp + DELAY_LEVELS_MS[min(qid, len(DELAY_LEVELS_MS) - 1)] > now:
                            break
                        message = released_message(rec, now)
                        if message is not None:
                            out.append(message)
                    nxt = unit.queue_offset + 1
                if nxt == offset or (out and not await self._put(out)):
                    break
                offset = self._levels[qid] = nxt
                self._dirty = True
                released += len(out)
                self.stats["delay_levels_released"] += len(out)
        return released

    async def _put(self, messages: list[Message]) -> bool:
        try:
            await self.put(messages)
            return True
        except Exception as exc:  # the store refused: keep them pending and try again
            log.error("could not release %d due messages (%s); trying again", len(messages), exc)
            return False

    # -- background ----------------------------------------------------------------------------

    def wake(self) -> None:
        """New entries in a timer queue (called on the loop)."""
        if self._wake is not None:
            self._wake.set()

    async def run(self, flush: Callable[[], Awaitable[None]], interval_ms: int = 1000) -> None:
        """Release due messages as their time comes; checkpoint every `interval_ms` when
        something changed.  `flush` makes the releases durable before a checkpoint.  Waits are on
        the broker's clock."""
        import asyncio

        wake = self._wake = asyncio.Event()
        last_checkpoint = self.clock()
        while True:
            wake.clear()  # arrivals from here on wake the wait below
            try:
                await self.release_due()
                now = self.clock()
                if self._dirty and now - last_checkpoint >= interval_ms:
                    await flush()
                    self.checkpoint()
                    last_checkpoint = now
            except Exception:
                log.exception("timer round failed")
            if self.loading():
                await asyncio.sleep(0)  # more entries to read: go on after letting others run
                continue
            due = self.next_due()
            wait = interval_ms if due is None else max(0, min(interval_ms, due - self.clock()))
            timer = self.clock.call_later(wait, wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()

    def listener(self, loop) -> Callable[[dict], None]:
        """A store arrival listener (dispatch thread) that wakes `run` for new timer entries."""

        def on_arrival(changes: dict) -> None:
            if any(topic in (TIMER_TOPIC, SCHEDULE_TOPIC) for topic, _ in changes) and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self.wake)
                except RuntimeError:
                    pass  # the loop closed between the check and the call

        return on_arrival


async def recall(broker, topic_name: str, handle: str) -> str:
    """RecallMessage: cancel the delay message `handle` names; returns its message id.  The
    codes are those RocketMQ's proxy answers with (its broker's ILLEGAL_OPERATION reaches the
    client as INTERNAL_SERVER_ERROR)."""
    from . import message_types, validation
    from .codes import BrokerError, Code
    from .types import DELAY

    validation.check_topic_name(topic_name, broker.config)
    topic = broker.topic(topic_name, create=False)
    message_types.check_topic_takes(topic.name, topic.message_type, DELAY)
    parsed = parse_recall_handle(handle)
    if parsed is None:
        raise BrokerError(Code.INTERNAL_SERVER_ERROR, "recall handle is invalid")
    handle_topic, broker_name, timestamp, unique_key = parsed
    if handle_topic != topic_name:
        raise BrokerError(Code.INTERNAL_SERVER_ERROR, "recall failed, topic not match")
    if broker_name != broker.config.broker_name:
        raise BrokerError(Code.INTERNAL_SERVER_ERROR, "recall failed, broker service not available")
    time_left = timestamp - broker.clock()
    if time_left <= 0 or time_left >= broker.config.timer_max_delay_sec * 1000:
        raise BrokerError(Code.INTERNAL_SERVER_ERROR, "recall failed, timestamp invalid")
    await broker.publisher.put([recall_marker(topic_name, unique_key, timestamp)])
    broker.timers.recall(topic_name, unique_key, timestamp)
    return unique_key
