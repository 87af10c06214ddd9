"""Light queues in an embedded key-value engine (LMDB): one environment whatever the number of
queues, so a broker holds millions of them without a file, a mapping or a Python object each.

Layout: one LMDB environment, `{store}/lightqueue/` (`data.mdb` and `lock.mdb`), five tables:

    names   queue name (UTF-8)                      -> queue number (u64)
    queues  queue number (u64)                      -> QUEUE_ROW + queue name (UTF-8)
    units   queue number (u64) + queue offset (u64) -> UNIT_ROW (8 + 4 + 8 + 8 = 28 bytes)
    groups  queue number (u64) + group (UTF-8)      -> GROUP_ROW
    meta    b"dispatched"                           -> commit-log offset (i64): every unit of a
                                                       record below it is in the tables
            b"next_queue"                           -> the next queue number (u64)

Integers are big-endian, so a queue's units sort by offset and are contiguous, and a new queue's
(numbers are handed out in order, never reused) go at the end of the tree.  QUEUE_ROW is the
queue's min offset, max offset (exclusive: its commit frontier), the store time of its newest
unit and the time of its last activity (a unit or a consumer's commit), each i64.  UNIT_ROW is
RocketMQ's 20-byte unit plus the record's store time, as its RocksDB consume queue keeps it, so
that a search by time reads no record.

Ownership: the dispatch thread writes units (`write`, one transaction per dispatched range, with
the `dispatched` mark in the same transaction: the table's own checkpoint); the maintenance
thread deletes expired queues; both are writers LMDB runs one at a time.  Readers (any thread)
read a snapshot each, without a lock.  The environment is opened without syncing each commit:
a commit is in the operating system's hands at once (it survives the process being killed) and
`flush` syncs it to the disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..queues.consume_queue import Unit, offset_by_time

NUMBER = struct.Struct(">Q")
UNIT_KEY = struct.Struct(">QQ")  # queue number, queue offset
UNIT_ROW = struct.Struct(">qiqq")  # commit-log offset, size, tags code, store time
QUEUE_ROW = struct.Struct(">qqqq")  # min offset, max offset, newest unit's store time, last activity
GROUP_ROW = struct.Struct(">qq")  # consumed offset, commit time
OFFSET = struct.Struct(">q")
_LAST_ACTIVE = struct.Struct(">q")  # QUEUE_ROW's fourth field, at byte 24

DISPATCHED_KEY = b"dispatched"
NEXT_QUEUE_KEY = b"next_queue"
DEFAULT_MAP_SIZE = 1 << 40  # address space reserved for the tables; the file grows with their data
WRITE_CHUNK = 1024  # units a write transaction holds at most


@dataclass(slots=True)
class QueueState:
    number: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int
    last_active: int
    name: str


def _queue_state(number: int, row: bytes) -> QueueState:
    low, high, stored, active = QUEUE_ROW.unpack_from(row)
    return QueueState(number, low, high, stored, active, bytes(row[QUEUE_ROW.size :]).decode("utf-8"))


def back_lock_file(path: Path) -> None:
    """Allocate the blocks of LMDB's lock file: LMDB maps it shared and writes a reader's slot
    through the mapping when a thread first reads, and a slot in a page of the sparse file on a
    full disk would end the process with SIGBUS.  ENOSPC here fails the open instead."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return  # opened without a lock file
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system that cannot: as before
            raise
    finally:
        os.close(fd)


class KvLightQueues:
    """The light queues' units, bounds and consumer offsets in one LMDB environment."""

    def __init__(self, directory: Path | str, map_size: int = DEFAULT_MAP_SIZE) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        import lmdb  # here, not at the top: Spark executors import the store's codecs without lmdb

        self.env = lmdb.open(
            str(self.directory),
            map_size=map_size,
            max_dbs=8,
            max_readers=1024,
            sync=False,
            metasync=False,
            readahead=False,
        )
        back_lock_file(self.directory / "lock.mdb")
        self.names = self.env.open_db(b"names")
        self.queues = self.env.open_db(b"queues")
        self.units = self.env.open_db(b"units")
        self.groups = self.env.open_db(b"groups")
        self.meta = self.env.open_db(b"meta")
        with self.env.begin() as txn:
            dispatched = txn.get(DISPATCHED_KEY, db=self.meta)
            self.dispatched = OFFSET.unpack(dispatched)[0] if dispatched is not None else 0

    # -- reading ----------------------------------------------------------------------------------

    def _state(self, txn, name: str) -> QueueState | None:
        number = txn.get(name.encode("utf-8"), db=self.names)
        if number is None:
            return None
        row = txn.get(number, db=self.queues)
        return _queue_state(NUMBER.unpack(number)[0], row) if row is not None else None

    def state(self, name: str) -> QueueState | None:
        with self.env.begin() as txn:
            return self._state(txn, name)

    def max_offsets(self, names: Iterable[str]) -> list[int]:
        """Each queue's max offset (0 for a queue not in the tables), from one snapshot."""
        with self.env.begin() as txn:
            result = []
            for name in names:
                state = self._state(txn, name)
                result.append(state.max_offset if state is not None else 0)
            return result

    def read_from(
        self, name: str, offset: int, max_count: int, min_commit_log_offset: int
    ) -> tuple[int, int, list[Unit]]:
        """From one snapshot: the queue's readable min offset (its first unit whose record is
        at or past `min_commit_log_offset`), its max offset, and `read`'s units from `offset`
        (clamped to that min)."""
        with self.env.begin() as txn:
            state = self._state(txn, name)
            if state is None:
                return 0, 0, []
            low = self._readable_min(txn, state, min_commit_log_offset)
            start = max(offset, low)
            end = min(state.max_offset, start + max(0, max_count))
            out: list[Unit] = []
            if start < end:
                cursor = txn.cursor(db=self.units)
                if cursor.set_range(UNIT_KEY.pack(state.number, start)):
                    for key, value in cursor:
                        key_number, queue_offset = UNIT_KEY.unpack(key)
                        if key_number != state.number or queue_offset >= end:
                            break
                        commit_log_offset, size, tags_code, _ = UNIT_ROW.unpack(value)
                        out.append(Unit(queue_offset, commit_log_offset, size, tags_code))
            return low, state.max_offset, out

    def _readable_min(self, txn, state: QueueState, min_commit_log_offset: int) -> int:
        """The first offset whose unit's record is at or past `min_commit_log_offset` (older
        records are deleted), or the max offset if none is.  Units' records are in offset
        order: a binary search, after a look at the stored min."""
        first = txn.get(UNIT_KEY.pack(state.number, state.min_offset), db=self.units)
        if first is None or UNIT_ROW.unpack(first)[0] >= min_commit_log_offset:
            return state.min_offset
        low, high = state.min_offset, state.max_offset
        while low < high:
            middle = (low + high) // 2
            row = txn.get(UNIT_KEY.pack(state.number, middle), db=self.units)
            if row is not None and UNIT_ROW.unpack(row)[0] >= min_commit_log_offset:
                high = middle
            else:
                low = middle + 1
        return low

    def bounds(self, name: str) -> tuple[int, int]:
        state = self.state(name)
        return (state.min_offset, state.max_offset) if state is not None else (0, 0)

    def readable_min(self, name: str, min_commit_log_offset: int) -> int:
        with self.env.begin() as txn:
            state = self._state(txn, name)
            return self._readable_min(txn, state, min_commit_log_offset) if state is not None else 0

    def offset_for_timestamp(
        self, name: str, timestamp: int, upper: bool = False, min_commit_log_offset: int = -1
    ) -> int:
        """As `ConsumeQueue.offset_for_timestamp` (LOWER: the first unit stored at or after
        `timestamp`; UPPER: the last stored at or before), from the units' own store times,
        over the units whose records are at or past `min_commit_log_offset`."""
        with self.env.begin() as txn:
            state = self._state(txn, name)
            if state is None:
                return 0
            number = state.number

            def time_at(slot: int) -> int:
                row = txn.get(UNIT_KEY.pack(number, slot), db=self.units)
                return UNIT_ROW.unpack(row)[3] if row is not None else -1

            low = self._readable_min(txn, state, min_commit_log_offset)
            return offset_by_time(low, state.max_offset, time_at, timestamp, upper)

    def consumer_offset(self, group: str, name: str) -> int | None:
        with self.env.begin() as txn:
            number = txn.get(name.encode("utf-8"), db=self.names)
            if number is None:
                return None
            row = txn.get(number + group.encode("utf-8"), db=self.groups)
            return GROUP_ROW.unpack(row)[0] if row is not None else None

    def count(self) -> int:
        with self.env.begin() as txn:
            return txn.stat(self.queues)["entries"]

    def names_from(self, prefix: str) -> Iterator[str]:
        """The names of the queues starting with `prefix`, in order (one snapshot)."""
        start = prefix.encode("utf-8")
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self.names)
            if not cursor.set_range(start):
                return
            for key in cursor.iternext(values=False):
                if not key.startswith(start):
                    return
                yield bytes(key).decode("utf-8")

    def idle_queues(self, after: int, horizon: int, limit: int) -> tuple[list[str], int, int]:
        """Looking at up to `limit` queues numbered above `after`, in number order (one
        snapshot): the names of those last active at or before `horizon`, the number of the last
        queue looked at (-1 if none), and how many were looked at."""
        names: list[str] = []
        last, looked = -1, 0
        unpack_active = _LAST_ACTIVE.unpack_from
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self.queues)
            if not cursor.set_range(NUMBER.pack(after + 1)):
                return names, last, looked
            for key, value in cursor:
                looked += 1
                if unpack_active(value, 24)[0] <= horizon:
                    names.append(bytes(value[QUEUE_ROW.size :]).decode("utf-8"))
                if looked >= limit:
                    last = NUMBER.unpack(key)[0]
                    break
        return names, last, looked

    # -- writing ----------------------------------------------------------------------------------

    def write(self, units: list[tuple[str, int, int, int, int, int]], dispatched: int) -> dict[str, int]:
        """Put each (name, queue offset, commit-log offset, size, tags code, store time) at its
        slot, then mark everything below commit-log offset `dispatched` as in; returns the
        queues whose max offset moved, with the new max.  A queue is created at its first unit
        (its min offset is that unit's).  Putting a unit again is harmless: the same bytes at
        the same slot (recovery dispatches the tail past `dispatched` again).

        At most WRITE_CHUNK units go in one transaction (LMDB keeps the pages a transaction
        dirtied in memory, and keeps that memory for the next), the mark with the last."""
        moved: dict[str, int] = {}
        for start in range(0, len(units), WRITE_CHUNK):
            last = start + WRITE_CHUNK >= len(units)
            self._write(units[start : start + WRITE_CHUNK], dispatched if last else -1, moved)
        return moved

    def _write(self, units: list[tuple[str, int, int, int, int, int]], dispatched: int, moved: dict[str, int]) -> None:
        with self.env.begin(write=True) as txn:
            states: dict[str, QueueState] = {}
            for name, queue_offset, commit_log_offset, size, tags_code, store_timestamp in units:
                state = states.get(name)
                if state is None:
                    state = self._state(txn, name)
                    if state is None:
                        state = self._create(txn, name, queue_offset)
                    states[name] = state
                txn.put(
                    UNIT_KEY.pack(state.number, queue_offset),
                    UNIT_ROW.pack(commit_log_offset, size, tags_code, store_timestamp),
                    db=self.units,
                )
                if queue_offset >= state.max_offset:
                    state.max_offset = queue_offset + 1
                    moved[name] = state.max_offset
                state.min_offset = min(state.min_offset, queue_offset)
                state.last_store_timestamp = max(state.last_store_timestamp, store_timestamp)
                state.last_active = max(state.last_active, store_timestamp)
            for state in states.values():
                self._put_state(txn, state)
            if dispatched > self.dispatched:
                txn.put(DISPATCHED_KEY, OFFSET.pack(dispatched), db=self.meta)
        self.dispatched = max(self.dispatched, dispatched)

    def _create(self, txn, name: str, first_offset: int) -> QueueState:
        """A new queue starting at `first_offset`, numbered next (its row is the caller's to put)."""
        raw = txn.get(NEXT_QUEUE_KEY, db=self.meta)
        number = NUMBER.unpack(raw)[0] if raw is not None else 0
        txn.put(NEXT_QUEUE_KEY, NUMBER.pack(number + 1), db=self.meta)
        txn.put(name.encode("utf-8"), NUMBER.pack(number), db=self.names)
        return QueueState(number, first_offset, first_offset, 0, 0, name)

    def _put_state(self, txn, state: QueueState) -> None:
        row = QUEUE_ROW.pack(state.min_offset, state.max_offset, state.last_store_timestamp, state.last_active)
        txn.put(NUMBER.pack(state.number), row + state.name.encode("utf-8"), db=self.queues)

    # one queue at a time (the QueueStore view, kv_queue.KvQueue)

    def create(self, name: str, first_offset: int) -> bool:
        """Start queue `name` at `first_offset`; False if it exists."""
        with self.env.begin(write=True) as txn:
            if self._state(txn, name) is not None:
                return False
            self._put_state(txn, self._create(txn, name, first_offset))
            return True

    def unit(self, name: str, queue_offset: int) -> tuple[int, int, int, int] | None:
        """(commit-log offset, size, tags code, store time) at a slot of `name`, or None."""
        with self.env.begin() as txn:
            number = txn.get(name.encode("utf-8"), db=self.names)
            row = txn.get(number + NUMBER.pack(queue_offset), db=self.units) if number is not None else None
            return UNIT_ROW.unpack(row) if row is not None else None

    def put_unit(
        self, name: str, queue_offset: int, commit_log_offset: int, size: int, tags_code: int, store_timestamp: int = 0
    ) -> None:
        """Store a unit at its slot of the existing queue `name`, its bounds left as they are."""
        with self.env.begin(write=True) as txn:
            number = txn.get(name.encode("utf-8"), db=self.names)
            if number is None:
                raise KeyError(name)
            txn.put(
                number + NUMBER.pack(queue_offset),
                UNIT_ROW.pack(commit_log_offset, size, tags_code, store_timestamp),
                db=self.units,
            )

    def delete_unit(self, name: str, queue_offset: int) -> bool:
        """Delete the unit at a slot of `name`, its bounds left as they are; False if none."""
        with self.env.begin(write=True) as txn:
            number = txn.get(name.encode("utf-8"), db=self.names)
            return number is not None and txn.delete(number + NUMBER.pack(queue_offset), db=self.units)

    def set_bounds(self, name: str, min_offset: int | None = None, max_offset: int | None = None) -> None:
        with self.env.begin(write=True) as txn:
            state = self._state(txn, name)
            if state is None:
                raise KeyError(name)
            if min_offset is not None:
                state.min_offset = min_offset
            if max_offset is not None:
                state.max_offset = max_offset
                state.min_offset = min(state.min_offset, max_offset)
            self._put_state(txn, state)

    def drop_units_from(self, name: str, queue_offset: int) -> None:
        """Delete the units of `name` at and past `queue_offset`."""
        with self.env.begin(write=True) as txn:
            number = txn.get(name.encode("utf-8"), db=self.names)
            if number is not None:
                _delete_prefixed(txn.cursor(db=self.units), number, bytes(number) + NUMBER.pack(queue_offset))

    def mark_dispatched(self, dispatched: int) -> None:
        """Everything below `dispatched` is in (a range with no light queue's unit)."""
        if dispatched > self.dispatched:
            with self.env.begin(write=True) as txn:
                txn.put(DISPATCHED_KEY, OFFSET.pack(dispatched), db=self.meta)
            self.dispatched = dispatched

    def commit_consumer_offset(self, group: str, name: str, offset: int, now: int) -> bool:
        """Keep `group`'s consumed offset of queue `name` (an activity of the queue); False if
        there is no such queue."""
        with self.env.begin(write=True) as txn:
            state = self._state(txn, name)
            if state is None:
                return False
            txn.put(NUMBER.pack(state.number) + group.encode("utf-8"), GROUP_ROW.pack(offset, now), db=self.groups)
            state.last_active = max(state.last_active, now)
            self._put_state(txn, state)
            return True

    def commit_consumer_offsets(self, offsets: list[tuple[str, str, int]], now: int) -> int:
        """`commit_consumer_offset` of each (group, name, offset) whose offset the table does not
        hold already, in one transaction; returns how many were written."""
        written = 0
        with self.env.begin(write=True) as txn:
            for group, name, offset in offsets:
                state = self._state(txn, name)
                if state is None:
                    continue
                key = NUMBER.pack(state.number) + group.encode("utf-8")
                row = txn.get(key, db=self.groups)
                if row is not None and GROUP_ROW.unpack(row)[0] == offset:
                    continue
                txn.put(key, GROUP_ROW.pack(offset, now), db=self.groups)
                state.last_active = max(state.last_active, now)
                self._put_state(txn, state)
                written += 1
        return written

    def group_offsets(self, txn, number: int) -> list[tuple[str, int]]:
        prefix = NUMBER.pack(number)
        cursor = txn.cursor(db=self.groups)
        found = []
        if cursor.set_range(prefix):
            for key, value in cursor:
                if key[:8] != prefix:
                    break
                found.append((bytes(key[8:]).decode("utf-8"), GROUP_ROW.unpack(value)[0]))
        return found

    def delete_if(self, names: list[str], still_expired: Callable[[object, QueueState], bool]) -> list[str]:
        """Delete each named queue (its units, consumer offsets, row and name) for which
        `still_expired(txn, state)`, asked inside the deleting transaction, holds; returns the
        deleted names."""
        deleted = []
        with self.env.begin(write=True) as txn:
            for name, state in self._matching(txn, names, still_expired):
                prefix = NUMBER.pack(state.number)
                for table in (self.units, self.groups):
                    _delete_prefixed(txn.cursor(db=table), prefix, prefix)
                txn.delete(prefix, db=self.queues)
                txn.delete(name.encode("utf-8"), db=self.names)
                deleted.append(name)
        return deleted

    def select_if(self, names: list[str], still_expired: Callable[[object, QueueState], bool]) -> list[str]:
        """The named queues for which `still_expired(txn, state)` holds, in one read snapshot
        (nothing is deleted)."""
        with self.env.begin() as txn:
            return [name for name, _ in self._matching(txn, names, still_expired)]

    def _matching(self, txn, names: list[str], still_expired: Callable[[object, QueueState], bool]):
        for name in names:
            state = self._state(txn, name)
            if state is not None and still_expired(txn, state):
                yield name, state

    def clear(self) -> None:
        """Forget every queue (before a rebuild from the commit log)."""
        with self.env.begin(write=True) as txn:
            for table in (self.names, self.queues, self.units, self.groups, self.meta):
                txn.drop(table, delete=False)
        self.dispatched = 0

    def file_count(self) -> int:
        return len(os.listdir(self.directory))

    def flush(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()


def offline_count(directory: Path | str) -> tuple[int, int] | None:
    """(light queues, dispatched mark) of the tables in `directory`, read-only (safe beside a
    store that has them open), or None if there are none."""
    if not (Path(directory) / "data.mdb").is_file():
        return None
    import lmdb  # see KvLightQueues

    env = lmdb.open(str(directory), readonly=True, max_dbs=8, max_readers=1024, create=False)
    try:
        with env.begin() as txn:
            queues = env.open_db(b"queues", txn=txn, create=False)
            meta = env.open_db(b"meta", txn=txn, create=False)
            dispatched = txn.get(DISPATCHED_KEY, db=meta)
            return txn.stat(queues)["entries"], OFFSET.unpack(dispatched)[0] if dispatched is not None else 0
    finally:
        env.close()


def _delete_prefixed(cursor, prefix: bytes, start: bytes) -> None:
    """Delete the keys from `start` on that begin with `prefix` (a queue number)."""
    if not cursor.set_range(start):
        return
    while cursor.key()[: len(prefix)] == prefix:
        if not cursor.delete():  # the cursor is past the last key
            break


class OfflineTables:
    """A read-only snapshot of the tables in a directory (safe beside a store that has them
    open): the dispatched mark and each queue with its units, for `store check`."""

    def __init__(self, env, txn) -> None:
        self.txn = txn
        self.queue_table = env.open_db(b"queues", txn=txn, create=False)
        self.unit_table = env.open_db(b"units", txn=txn, create=False)
        meta = env.open_db(b"meta", txn=txn, create=False)
        dispatched = txn.get(DISPATCHED_KEY, db=meta)
        self.dispatched = OFFSET.unpack(dispatched)[0] if dispatched is not None else 0

    def queues(self) -> Iterator[QueueState]:
        for key, value in self.txn.cursor(db=self.queue_table):
            yield _queue_state(NUMBER.unpack(key)[0], value)

    def units(self, number: int) -> Iterator[tuple[int, int, int, int, int]]:
        """(queue offset, commit-log offset, size, tags code, store time) of each unit of the
        queue numbered `number`, in offset order."""
        prefix = NUMBER.pack(number)
        cursor = self.txn.cursor(db=self.unit_table)
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if key[:8] != prefix:
                return
            yield (UNIT_KEY.unpack(key)[1], *UNIT_ROW.unpack(value))


@contextlib.contextmanager
def offline_tables(directory: Path | str) -> Iterator[OfflineTables | None]:
    """The tables in `directory` read-only (see OfflineTables), or None if there are none."""
    if not (Path(directory) / "data.mdb").is_file():
        yield None
        return
    import lmdb  # see KvLightQueues

    env = lmdb.open(str(directory), readonly=True, max_dbs=8, max_readers=1024, create=False)
    try:
        with env.begin() as txn:
            yield OfflineTables(env, txn)
    finally:
        env.close()
