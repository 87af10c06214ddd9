"""Light message queues (RIP-28 multi-dispatch): one record in the commit log, a unit in each
light queue its `INNER_MULTI_DISPATCH` property names.

The life of a multi-dispatched message:
1. `check` (before the append lock): the names are valid (`%LMQ%` names get an offset; others
   are carried as RocketMQ carries them, with an empty offset), and the record still fits once
   the offsets are added; a put straight to an `%LMQ%` topic is refused (a light queue takes
   messages by multi-dispatch only).
2. `assign` (under the append lock, before the record is written): each light queue's next
   offset, in the order names are given, written into the record as `INNER_MULTI_QUEUE_OFFSET`
   (comma-separated, the same order), as RocketMQ's `LmqDispatch` does.  A name given twice in
   one message gets one offset.  After an append error `unassign` gives back the offsets of the
   messages not written.
3. Dispatch (`dispatch_range`, the dispatch thread, in log order after the topic's queues): one
   unit per light queue, queue id 0, pointing at the record; listeners hear of `(name, 0)`.

Where a light queue lives: a queue whose RocketMQ file queue (`consumequeue/%LMQ%name/0/`) exists
when the store opens, or every queue under `light_queue_store = "file"`, is a file ConsumeQueue
(its next offset in the store's queue-offset table, as a topic queue's); every other is in the
key-value tables (`kv.KvLightQueues`), its next offset read from them, or from `_pending` while
units are assigned and not yet dispatched: nothing is held in memory per idle queue.

Locks: `_pending` and the assignment are guarded by the store's append lock; the dispatch
thread takes that lock to drop the entries its units made current.  Expiry (`expire_idle`,
the maintenance thread) deletes under the append lock, so that no offset is handed out for a
queue being deleted.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..dispatch.requests import QueueKey, builds_queue_entry
from ..errors import InvalidMessageError
from ..format import record
from ..format.scan import scan
from ..format.special_queues import (
    LMQ_PREFIX,
    LMQ_QUEUE_ID,
    MULTI_DISPATCH_SEPARATOR,
    multi_dispatches,
)
from ..queues.consume_queue import Unit
from ..queues.queue_set import ConsumeQueueStore
from .kv import UNIT_KEY, UNIT_ROW, KvLightQueues, QueueState

if TYPE_CHECKING:
    from ..log.commit_log import CommitLog

log = logging.getLogger(__name__)

MULTI_DISPATCH = record.PROPERTY_INNER_MULTI_DISPATCH
MULTI_QUEUE_OFFSET = record.PROPERTY_INNER_MULTI_QUEUE_OFFSET
_MARKER = f"{MULTI_DISPATCH}\x01".encode("ascii")
LIGHT_QUEUE_STORES = ("kv", "file")
KV_DIRECTORY = "lightqueue"
# the widest offset list a name can add: a comma and 19 digits
_OFFSET_WIDTH = 20
_OFFSETS_PREFIX = f"{MULTI_QUEUE_OFFSET}\x01".encode("ascii")
_OFFSETS_PROPERTY = _OFFSETS_PREFIX  # a producer's own, found in the encoded properties
_OFFSETS_EXTRA = len(_OFFSETS_PREFIX) + 1
EXPIRY_SCAN = 50_000  # queues looked at per expiry run (a run resumes where the last stopped)
EXPIRY_INTERVAL_MS = 60_000  # the maintenance thread runs expiry at most this often
EXPIRY_DELETE_CHUNK = 256  # queues deleted per hold of the append lock


def is_light_queue(topic: str) -> bool:
    return topic.startswith(LMQ_PREFIX)


class LightQueues:
    """Every light queue of a store: offsets at append, units at dispatch, reads, expiry."""

    name = "light_queue"

    def __init__(
        self,
        directory: Path,
        consume_queues: ConsumeQueueStore,
        queue_offsets: dict[QueueKey, int],
        commit_log: CommitLog,
        append_lock: threading.Lock,
        *,
        multi_dispatch: bool = True,
        backend: str = "kv",
        idle_expiry_ms: int = 0,
        max_name_bytes: int = 255,
    ) -> None:
        if backend not in LIGHT_QUEUE_STORES:
            raise ValueError(f"light_queue_store must be one of {LIGHT_QUEUE_STORES}, not {backend!r}")
        self.kv_directory = Path(directory) / KV_DIRECTORY
        self.consume_queues = consume_queues
        self.queue_offsets = queue_offsets
        self.commit_log = commit_log
        self.append_lock = append_lock
        self.multi_dispatch = multi_dispatch
        self.use_files = backend == "file"
        self.idle_expiry_ms = idle_expiry_ms
        self.max_name_bytes = max_name_bytes
        # light queues served from RocketMQ's file queues (found at open, or all under "file")
        self.file_queues = {
            topic for topic, queue_id in consume_queues.queues if is_light_queue(topic) and queue_id == LMQ_QUEUE_ID
        }
        self.kv: KvLightQueues | None = KvLightQueues(self.kv_directory) if self.kv_directory.exists() else None
        self._pending: dict[str, int] = {}  # name -> next offset, for queues with undispatched units
        self._dispatched = self.kv.dispatched if self.kv is not None else 0  # in memory; kept by `flush`
        self._held_at_open = self._dispatched  # the tables held every unit of the log below this at open
        self._expiry_after = -1  # the number of the queue the last expiry run stopped at
        self._last_expiry = 0  # when expiry last ran (store clock)
        self.expiry_lock = threading.RLock()  # one expiry run at a time (a nested call finds it just ran)

    # -- where a queue lives ----------------------------------------------------------------------

    def in_files(self, name: str) -> bool:
        return self.use_files or name in self.file_queues

    def holds(self, topic: str, queue_id: int) -> bool:
        """Whether a read of (topic, queue_id) is this key-value store's to answer."""
        return queue_id == LMQ_QUEUE_ID and is_light_queue(topic) and not self.in_files(topic)

    def _kv(self) -> KvLightQueues:
        if self.kv is None:
            self.kv = KvLightQueues(self.kv_directory)
        return self.kv

    # -- appending ------------------------------------------------------------------------------

    def check(self, messages: Sequence) -> list[tuple[int, list[str]]]:
        """Before the append lock and before the messages are encoded: refuse what the store
        must not take (InvalidMessageError) and return (index, names) of each message to
        multi-dispatch."""
        todo: list[tuple[int, list[str]]] = []
        for topic in {message.topic for message in messages if type(message.topic) is str}:
            if topic.startswith(LMQ_PREFIX):
                raise InvalidMessageError(
                    f"topic {topic!r} is a light queue: it takes messages by multi-dispatch ({MULTI_DISPATCH}) only"
                )
        if not self.multi_dispatch:
            return todo
        longest = self.max_name_bytes
        for index in [
            i for i, message in enumerate(messages) if message.properties and MULTI_DISPATCH in message.properties
        ]:
            message = messages[index]
            topic = message.topic
            names_text = message.properties[MULTI_DISPATCH]
            if not names_text or type(names_text) is not str or type(topic) is not str or not multi_dispatches(topic):
                continue
            if message.sysflag & record.TRANSACTION_TYPE_MASK not in record.QUEUE_ENTRY_KINDS:
                continue  # a prepared transaction message is dispatched by its commit record
            names = names_text.split(MULTI_DISPATCH_SEPARATOR)
            for name in names:
                if name.startswith(LMQ_PREFIX) and (
                    name == LMQ_PREFIX
                    or "/" in name
                    or "\x00" in name
                    or (len(name) > longest // 4 and len(name.encode("utf-8")) > longest)
                ):
                    raise InvalidMessageError(
                        f"light queue name {name!r} in {MULTI_DISPATCH} is empty past {LMQ_PREFIX}, "
                        f"holds '/' or NUL, or is over {longest} bytes"
                    )
            todo.append((index, names))
        return todo

    def fit(self, todo: list[tuple[int, list[str]]], prepared: list) -> None:
        """After encoding, before the lock: drop an `INNER_MULTI_QUEUE_OFFSET` the producer set
        (the store assigns it) and refuse a record the offsets would make too large."""
        segment_size = self.commit_log.segment_size
        for index, names in todo:
            template, body, body_crc, properties_bytes, unique_key = prepared[index]
            if _OFFSETS_PROPERTY in properties_bytes:
                items = record.decode_properties(properties_bytes)
                items.pop(MULTI_QUEUE_OFFSET, None)
                crc = items.pop(record.CRC32_PROPERTY, None) is not None  # reserved: it stays the last one
                properties_bytes = record.encode_properties(items) + (record.CRC32_PROPERTY_RESERVED if crc else b"")
                prepared[index] = (template, body, body_crc, properties_bytes, unique_key)
            extra = _OFFSETS_EXTRA + _OFFSET_WIDTH * len(names)
            if len(properties_bytes) + extra > record.MAX_PROPERTIES_BYTES:
                raise InvalidMessageError(
                    f"{len(names)} light queues make the properties over {record.MAX_PROPERTIES_BYTES} bytes"
                )
            if template.fixed_size + len(body) + len(properties_bytes) + extra + record.BLANK_SIZE > segment_size:
                raise InvalidMessageError("the record with its light queues' offsets does not fit a commit-log segment")

    def assign(self, todo: list[tuple[int, list[str]]], prepared: list) -> list[tuple[int, list[str]]]:
        """Under the append lock: each named light queue's next offset, written into the
        message's properties (prepared[index]); returns what `unassign` needs."""
        pending, queue_offsets = self._pending, self.queue_offsets
        use_files, file_queues = self.use_files, self.file_queues
        if not use_files:
            unknown = {
                name
                for _, names in todo
                for name in names
                if name not in pending and name.startswith(LMQ_PREFIX) and name not in file_queues
            }
            if unknown:
                ordered = sorted(unknown)
                pending.update(zip(ordered, self._kv().max_offsets(ordered)))
        taken = []
        for index, names in todo:
            offsets: dict[str, int] = {}
            for name in names:
                if name in offsets or not name.startswith(LMQ_PREFIX):
                    continue
                if use_files or name in file_queues:
                    key = (name, LMQ_QUEUE_ID)
                    offset = queue_offsets.get(key, 0)
                    queue_offsets[key] = offset + 1
                else:
                    offset = pending[name]
                    pending[name] = offset + 1
                offsets[name] = offset
            if len(names) == 1:
                text = str(offsets[names[0]]) if offsets else ""
            else:
                text = MULTI_DISPATCH_SEPARATOR.join([str(offsets[name]) if name in offsets else "" for name in names])
            template, body, body_crc, properties_bytes, unique_key = prepared[index]
            offsets_property = b"".join((_OFFSETS_PREFIX, text.encode("ascii"), b"\x02"))
            prepared[index] = (
                template,
                body,
                body_crc,
                record.add_before_crc_property(properties_bytes, offsets_property),
                unique_key,
            )
            taken.append((index, list(offsets)))
        return taken

    def unassign(self, taken: list[tuple[int, list[str]]], stored: int) -> None:
        """Under the append lock, after an append stored only the first `stored` messages: give
        back the offsets of the others (the newest assigned, so the counters step back)."""
        for index, names in reversed(taken):
            if index < stored:
                break
            for name in names:
                if self.in_files(name):
                    self.queue_offsets[(name, LMQ_QUEUE_ID)] -= 1
                elif name in self._pending:
                    self._pending[name] -= 1

    def assigned_offset(self, name: str) -> int:
        """The next offset `assign` gives `name` (the append lock held)."""
        if self.in_files(name):
            return self.queue_offsets.get((name, LMQ_QUEUE_ID), 0)
        if name in self._pending:
            return self._pending[name]
        return self.kv.max_offsets([name])[0] if self.kv is not None else 0

    # -- dispatching ----------------------------------------------------------------------------

    def dispatch_range(self, commit_log: CommitLog, begin: int, end: int, changes: dict[QueueKey, int]) -> None:
        """The dispatcher built [begin, end) of the log (records wholly inside one segment): write
        the light queues' units of its multi-dispatched records.  A range without the property's
        name in its bytes is not decoded at all, nor one the tables held when the store opened
        (recovery dispatches it again for the other indexes) while no light queue is a file."""
        segment = commit_log.segment_for(begin)
        if segment is None or end <= begin:
            return
        if end <= self._held_at_open and not self.use_files and not self.file_queues:
            return
        mm, base = segment.mm, segment.start
        found = mm.find(_MARKER, begin - base, end - base) if self.multi_dispatch else -1
        if found < 0:
            self._dispatched = max(self._dispatched, end)
            return
        columns = scan(mm, begin - base, end - base, base)
        hits = [found]
        while True:
            found = mm.find(_MARKER, found + 1, end - base)
            if found < 0:
                break
            hits.append(found)
        rows = np.unique(np.searchsorted(columns.positions, np.array(hits, dtype=np.int64), side="right") - 1)
        rows = rows[rows >= 0]
        rows = rows[builds_queue_entry(columns.sysflags[rows])]
        offsets, sizes = columns.offsets[rows].tolist(), columns.sizes[rows].tolist()
        tags_codes, stored = columns.tags_codes[rows].tolist(), columns.store_timestamps[rows].tolist()
        starts, stops = columns.properties_starts[rows].tolist(), columns.properties_ends[rows].tolist()
        topic_ids, names_of = columns.topic_ids[rows].tolist(), columns.topic_names
        kv_units = []
        held = self._held_at_open
        for i in range(len(rows)):
            if not multi_dispatches(names_of[topic_ids[i]]):
                continue
            properties = record.decode_properties(mm[starts[i] : stops[i]])
            found_names, found_offsets = properties.get(MULTI_DISPATCH), properties.get(MULTI_QUEUE_OFFSET)
            if not found_names or not found_offsets:
                continue
            offset = offsets[i]
            for name, text in zip(
                found_names.split(MULTI_DISPATCH_SEPARATOR), found_offsets.split(MULTI_DISPATCH_SEPARATOR)
            ):
                if not name.startswith(LMQ_PREFIX) or "/" in name or not text.isdigit():
                    continue
                if self.in_files(name):
                    self._put_file_unit(name, int(text), offset, sizes[i], tags_codes[i], changes)
                elif offset >= held:
                    kv_units.append((name, int(text), offset, sizes[i], tags_codes[i], stored[i]))
        if kv_units:
            kv_units.sort()  # by name: the tables' pages are visited in order
            moved = self._kv().write(kv_units, end)
            for name, frontier in moved.items():
                changes[(name, LMQ_QUEUE_ID)] = frontier
            with self.append_lock:  # the tables now answer for these queues' next offsets
                pending = self._pending
                for name, frontier in moved.items():
                    if pending.get(name, frontier + 1) <= frontier:
                        del pending[name]
                if not pending:
                    self._pending = {}  # a dict keeps the table it grew to; a burst's is given back
        self._dispatched = max(self._dispatched, end)

    def _put_file_unit(
        self, name: str, queue_offset: int, offset: int, size: int, tags_code: int, changes: dict[QueueKey, int]
    ) -> None:
        cq = self.consume_queues.get_or_create(name, LMQ_QUEUE_ID)
        if cq.is_empty:
            cq.initialize_at(queue_offset)
        if cq.put(queue_offset, offset, size, tags_code):
            changes[(name, LMQ_QUEUE_ID)] = cq.commit_frontier

    def covered_offset(self) -> int:
        """Below this commit-log offset every key-value unit is in (recovery dispatches again
        from here; the file queues answer for themselves)."""
        return self.kv.dispatched if self.kv is not None else 1 << 62

    def truncate(self, commit_log_end: int) -> None:
        """Recovery cut the log at `commit_log_end`.  Tables that hold units past it (the log lost
        bytes the tables had: only after the machine, not the process, went down under async
        flush) are emptied, and recovery builds them again from the whole log."""
        if self.kv is not None and self.kv.dispatched > commit_log_end:
            log.warning(
                "light queues: the key-value tables hold units past the commit log's end %d; rebuilding them "
                "from the log",
                commit_log_end,
            )
            self.kv.clear()
            self._dispatched = self._held_at_open = 0

    def flush(self) -> None:
        if self.kv is not None:
            self.kv.mark_dispatched(self._dispatched)
            self.kv.flush()

    def close(self) -> None:
        if self.kv is not None:
            self.kv.mark_dispatched(self._dispatched)
            self.kv.close()
            self.kv = None

    def repair_units(self, fixes: list[tuple[str, str, int, tuple[int, int, int, int] | None]]) -> int:
        """`store repair`: put each key-value (form "kv") fix's unit at its slot of the tables
        (unit None: delete the unit there), for the units whose record the log holds after
        recovery; a queue's max offset moves past a unit put above it.  Returns how many were
        applied."""
        if self.kv is None:
            return 0
        applied = 0
        for form, name, slot, unit in fixes:
            if form != "kv":
                continue
            if unit is None:
                applied += self.kv.delete_unit(name, slot)
            elif unit[0] + unit[1] <= self.commit_log.write_position and self.kv.state(name) is not None:
                self.kv.put_unit(name, slot, *unit)
                if slot >= self.kv.bounds(name)[1]:
                    self.kv.set_bounds(name, max_offset=slot + 1)
                applied += 1
        return applied

    # -- reading --------------------------------------------------------------------------------

    def read_units(self, name: str, offset: int, max_count: int) -> list[Unit]:
        return self.read(name, offset, max_count)[2]

    def read(self, name: str, offset: int, max_count: int) -> tuple[int, int, list[Unit]]:
        """(min offset, max offset, units from `offset`) of a key-value light queue, from one
        snapshot; the min is the first offset whose record the commit log still holds."""
        if self.kv is None:
            return 0, 0, []
        return self.kv.read_from(name, offset, max_count, self.commit_log.min_offset)

    def min_offset(self, name: str) -> int:
        """The first offset whose record the commit log still holds."""
        return self.kv.readable_min(name, self.commit_log.min_offset) if self.kv is not None else 0

    def max_offset(self, name: str) -> int:
        return self.kv.bounds(name)[1] if self.kv is not None else 0

    def offset_for_timestamp(self, name: str, timestamp: int, upper: bool = False) -> int:
        return (
            self.kv.offset_for_timestamp(name, timestamp, upper, self.commit_log.min_offset)
            if self.kv is not None
            else 0
        )

    def names(self, prefix: str = LMQ_PREFIX) -> Iterator[str]:
        """The names of the live light queues starting with `prefix`, in order."""
        files = sorted(name for name in self.file_queues if name.startswith(prefix))
        return heapq.merge(files, self.kv.names_from(prefix) if self.kv is not None else ())

    def count(self) -> int:
        """Live light queues (key-value and file)."""
        return (self.kv.count() if self.kv is not None else 0) + len(
            [key for key in self.consume_queues.queues if is_light_queue(key[0])]
        )

    # -- consumer offsets and expiry ------------------------------------------------------------

    def commit_consumer_offset(self, group: str, name: str, offset: int, now: int) -> bool:
        """Keep `group`'s consumed offset of light queue `name` beside the queue, so that it
        expires with it; False if the queue is not in the key-value tables."""
        if self.kv is None or self.in_files(name):
            return False
        return self.kv.commit_consumer_offset(group, name, offset, now)

    def commit_consumer_offsets(self, offsets: list[tuple[str, str, int]], now: int) -> int:
        """`commit_consumer_offset` of many (group, name, offset) in one transaction, each only if
        it differs from the table's (a write counts as activity); file queues are left out."""
        if self.kv is None:
            return 0
        return self.kv.commit_consumer_offsets([o for o in offsets if not self.in_files(o[1])], now)

    def consumer_offset(self, group: str, name: str) -> int | None:
        return self.kv.consumer_offset(group, name) if self.kv is not None else None

    def expire_due(self, now: int, forget: Callable[[list[str]], bool] | None = None) -> list[str]:
        """`expire_idle`, at most once every EXPIRY_INTERVAL_MS."""
        with self.expiry_lock:
            if now - self._last_expiry < EXPIRY_INTERVAL_MS:
                return []
            self._last_expiry = now
            return self.expire_idle(now, forget=forget)

    def expire_idle(
        self, now: int, scan_limit: int = EXPIRY_SCAN, forget: Callable[[list[str]], bool] | None = None
    ) -> list[str]:
        """Delete key-value light queues idle (no unit, no consumer commit) for `idle_expiry_ms`
        and fully consumed: every group that committed an offset is at the max offset (and one
        did), or the commit log no longer holds any of its records.  A queue with an offset
        assigned and not yet dispatched is live.  Looks at up to `scan_limit` queues, resuming
        where the last run stopped; returns the names deleted.

        `forget(names)` is called with the queues found expired before any of them is deleted,
        and makes the consumers' progress on them durably forgotten (True), or cannot (False:
        the run ends, deleting none of them).  A queue that comes alive between the two is not deleted; `forget`'s
        caller hears of it as a name missing from the result.  So no crash leaves a consumer's
        position on a deleted queue, which a queue recreated at offset 0 would be read past."""
        if self.kv is None or self.idle_expiry_ms <= 0:
            return []
        horizon = now - self.idle_expiry_ms
        candidates, last, looked = self.kv.idle_queues(self._expiry_after, horizon, scan_limit)
        self._expiry_after = last if looked >= scan_limit else -1  # from the first again at the end
        kv, log_min = self.kv, self.commit_log.min_offset

        def still_expired(txn, state: QueueState) -> bool:
            if state.last_active > horizon or state.name in self._pending:
                return False
            groups = kv.group_offsets(txn, state.number)
            if groups:
                return all(offset >= state.max_offset for _, offset in groups)
            if state.max_offset <= state.min_offset:
                return True
            newest = txn.get(UNIT_KEY.pack(state.number, state.max_offset - 1), db=kv.units)
            return newest is None or UNIT_ROW.unpack(newest)[0] < log_min

        deleted: list[str] = []
        for start in range(0, len(candidates), EXPIRY_DELETE_CHUNK):
            chosen = candidates[start : start + EXPIRY_DELETE_CHUNK]
            if forget is not None:
                chosen = kv.select_if(chosen, still_expired)
                if not chosen:
                    continue
                if not forget(chosen):
                    break
            with self.append_lock:
                deleted += kv.delete_if(chosen, still_expired)
        if deleted:
            log.info("light queues: %d idle, fully consumed queue(s) expired", len(deleted))
        return deleted
