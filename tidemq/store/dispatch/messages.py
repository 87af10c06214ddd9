"""The messages between parallel dispatch's coordinator and its worker processes (see
parallel_dispatch), and the pipes they travel over.

Coordinator -> worker: a `BatchTask` to build; the `UnitsHandover`s of the queues it owns, which
another worker's build handed over (forwarded unopened); an `IndexAppend` request; "ping"; None
to stop.  Worker -> coordinator: a `BatchResult` (with the slots of every queue of the batch,
`QueueRuns`, and its handovers, pickled); `UnitsWritten`; `IndexAppended`; "pong".  Each is
pickled as its fields, its NumPy arrays as bytes (`_pickled_as_fields`).

Pipes: a worker's answers can be large (a 16 MiB batch of 10,000 queues: 240 KB of runs, 710 KB
handed over), and so can what the coordinator forwards to it.  The coordinator's sends block; a
worker's never block without reading: while its answer does not fit in the pipe, it takes in what
the coordinator sends (`Channel.send_reading`), so that neither waits for the other forever.
"""

from __future__ import annotations

import operator
import os
import pickle
import select
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import numpy as np


def _pickled_as_fields(cls):
    """Pickle a slots dataclass as its class and its field values, its NumPy arrays as their
    bytes (rebuilt read-only, by `_rebuilt`): the `__getstate__` / `__setstate__` that
    `dataclass(slots=True)` gives it call `dataclasses.fields` for every object pickled or
    unpickled, and NumPy pickles an array with its dtype's state (a BatchResult holds seven):
    both on the coordinator's thread, for every message."""
    get = operator.attrgetter(*cls.__slots__)
    one = len(cls.__slots__) == 1

    def __reduce__(self):
        values = (get(self),) if one else get(self)
        arrays = [i for i, value in enumerate(values) if type(value) is np.ndarray]
        if arrays:
            items = list(values)
            for i in arrays:
                array = items[i]
                items[i] = (array.dtype.str, array.tobytes())
            return _rebuilt, (cls, arrays, items)
        return _rebuilt, (cls, arrays, values)

    cls.__reduce__ = __reduce__
    return cls


def _rebuilt(cls, arrays: list[int], values):
    if arrays:
        values = list(values)
        for i in arrays:
            dtype, data = values[i]
            values[i] = np.frombuffer(data, dtype)
    return cls(*values)


@_pickled_as_fields
@dataclass(slots=True)
class QueueRuns:
    """The slots a batch wrote, one row per queue (`topic_names[topic_ids[i]]`, `queue_ids[i]`):
    [firsts[i], firsts[i] + counts[i]), then `extras[i]` when the queue's slots in the batch were
    not one contiguous run."""

    topic_names: list[str]
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    firsts: np.ndarray
    counts: np.ndarray
    extras: dict[int, list[int]]

    def __len__(self) -> int:
        return len(self.firsts)

    @classmethod
    def empty(cls) -> QueueRuns:
        i32, i64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
        return cls([], i32, i32, i64, i64, {})


@_pickled_as_fields
@dataclass(slots=True, frozen=True)
class BatchTask:
    batch_id: int
    segment_path: str
    segment_start: int
    segment_size: int
    begin: int  # commit-log offsets, record-aligned, inside the segment
    end: int


@final
@_pickled_as_fields
@dataclass(slots=True)
class BatchResult:
    batch_id: int
    begin: int
    end: int  # where building stopped: the task's end unless `error`
    error: str | None
    records: int
    last_store_timestamp: int
    queues: QueueRuns  # per queue, the slots written, in order
    index_hashes: np.ndarray
    index_phys: np.ndarray
    index_timestamps: np.ndarray
    index_held: int = 0  # entries the worker keeps for an IndexAppend (the arrays are then empty)
    # (owner, pickled UnitsHandover) for each other worker owning queues of the batch
    handovers: Sequence[tuple[int, bytes]] = ()


@_pickled_as_fields
@dataclass(slots=True, frozen=True)
class UnitsHandover:
    """Builder -> coordinator -> owner: the units of batch `batch_id` for queues the owner owns.
    Queue i (`topic_names[topic_ids[i]]`, `queue_ids[i]`) has `counts[i]` units, back to back in
    `units` (20 bytes each, in the queues' order), at slots `firsts[i]` onwards, or, when `slots`
    is set (some queue's slots in the batch are not one run), at the slots it lists, one per unit."""

    batch_id: int
    topic_names: list[str]
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    firsts: np.ndarray
    counts: np.ndarray
    slots: np.ndarray | None
    units: bytes


@_pickled_as_fields
@dataclass(slots=True, frozen=True)
class UnitsWritten:
    """Owner -> coordinator: the units batch `batch_id` handed over are written (or could not be:
    `error`)."""

    batch_id: int
    error: str | None = None


@_pickled_as_fields
@dataclass(slots=True, frozen=True)
class IndexAppend:
    """Coordinator -> worker: append the held entries of batch `batch_id` (those of records at
    or past `skip_below`) to the index file at `path`, as many as fit; `path` None: the newest
    file is full or there is none, only say when the first entry was stored.  Asked for a batch
    it has not built yet (sent to it, or under way), the worker appends as soon as it has built
    it, answering after the batch's own answer (none held: 0 appended)."""

    batch_id: int
    path: str | None
    skip_below: int
    # the file's geometry (its header does not state the slot table's size)
    hash_slots: int = 0
    max_entries: int = 0


@final
@_pickled_as_fields
@dataclass(slots=True, frozen=True)
class IndexAppended:
    """Worker -> coordinator: `appended` entries of batch `batch_id` written; `remaining` still
    held (the file filled), the first of them stored at `next_timestamp`; `last_timestamp`: store
    time of the last entry appended (0 if none)."""

    batch_id: int
    appended: int
    remaining: int
    next_timestamp: int
    last_timestamp: int
    error: str | None = None


_LENGTH = struct.Struct("!i")  # a message's header: its length (multiprocessing.connection's framing)
_READ_BUFFER = 1 << 20  # as much as a worker's pipe holds (RESULT_PIPE_BYTES): one read takes it all
_NOTHING = object()


class Channel:
    """Both ends of a worker's pipes as one duplex connection: pickled messages, each after its
    length.  Reads go through a buffer (one system call takes in every message the pipe holds),
    and `poll` asks a `select.poll` made once: `multiprocessing.connection`'s reads took the
    header and the message in separate calls, and its `poll` and `wait` built a selector on each
    call, a quarter of the coordinator's time."""

    __slots__ = ("read_fd", "write_fd", "_buffer", "_start", "_end", "_poller")

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._buffer = bytearray(_READ_BUFFER)
        self._start = 0  # the buffer's unread bytes: [_start, _end)
        self._end = 0
        self._poller: select.poll | None = None

    # -- sending

    def send(self, obj) -> None:
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def send_bytes(self, message: bytes) -> None:
        """Send a message pickled already (`recv` on the other end unpickles it), waiting for
        room in the pipe (the coordinator's sends; a worker's go through `send_reading`)."""
        fd = self.write_fd
        parts: list[bytes | memoryview] = [_LENGTH.pack(len(message)), message]
        while parts:
            written = os.writev(fd, parts)
            while parts and written >= len(parts[0]):
                written -= len(parts.pop(0))
            if parts and written:
                parts[0] = memoryview(parts[0])[written:]

    def send_reading(self, obj, keep, *more) -> None:
        """Send `obj` (and `more` objects after it), headers and pickles in one write where the
        pipe has room, through a non-blocking writer without ever waiting only for room: while
        the pipe is full, receive the messages coming the other way and give them to `keep`.
        (The coordinator may be blocked sending to this end, not reading its answers.)"""
        chunks: list[bytes] = []
        for item in (obj, *more):
            data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
            chunks += (_LENGTH.pack(len(data)), data)
        fd = self.write_fd
        poller = None
        view = memoryview(b"".join(chunks))  # one write: headers and bodies (a copy costs less than a system call)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                if poller is None:
                    # poll, not select: a pipe inherited from a store with many files open
                    # has a descriptor past select's limit (FD_SETSIZE, 1,024)
                    poller = select.poll()
                    poller.register(self.read_fd, select.POLLIN)
                    poller.register(fd, select.POLLOUT)
                for ready, _ in poller.poll():
                    if ready != fd:
                        for message in self.take():  # EOFError: the coordinator is gone
                            keep(message)

    # -- receiving

    def recv(self):
        """The next message, waiting for it."""
        while True:
            message = self._next()
            if message is not _NOTHING:
                return message
            if not self._read():
                raise EOFError

    def take(self) -> list:
        """Read once (the pipe must be readable, or this waits) and return the messages that
        are whole, maybe none (the rest of one is still to come); EOFError when the pipe is
        closed and no whole message is left."""
        open_ = self._read()
        messages = []
        while (message := self._next()) is not _NOTHING:
            messages.append(message)
        if not messages and not open_:
            raise EOFError
        return messages

    def poll(self) -> bool:
        """A whole message is buffered, or the pipe has something to read (maybe its end)."""
        if self._whole():
            return True
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self.read_fd, select.POLLIN)
        return bool(self._poller.poll(0))

    def _whole(self) -> bool:
        start, unread = self._start, self._end - self._start
        return unread >= 4 and unread - 4 >= _LENGTH.unpack_from(self._buffer, start)[0]

    def _next(self):
        """The next whole message in the buffer, unpickled, or _NOTHING."""
        start = self._start
        unread = self._end - start
        if unread < 4:
            return _NOTHING
        size = _LENGTH.unpack_from(self._buffer, start)[0]
        if unread - 4 < size:
            return _NOTHING
        self._start = start + 4 + size
        with memoryview(self._buffer) as view:
            return pickle.loads(view[start + 4 : start + 4 + size])

    def _read(self) -> bool:
        """Read what the pipe holds (at least a byte: waits for it) into the buffer, making room
        for the whole of a message begun; False at the end of the pipe."""
        buffer, start, end = self._buffer, self._start, self._end
        if start == end:
            start = end = 0
        unread = end - start
        room = _READ_BUFFER // 4
        if unread >= 4:
            room = max(room, 4 + _LENGTH.unpack_from(buffer, start)[0] - unread)
        if len(buffer) - end < room:
            # move the unread bytes to the front, into a larger buffer if a message needs it
            if len(buffer) < unread + room:
                grown = bytearray(unread + room)
                grown[:unread] = buffer[start:end]
                buffer = self._buffer = grown
            else:
                buffer[:unread] = buffer[start:end]
            start, end = 0, unread
        with memoryview(buffer) as view:
            count = os.readv(self.read_fd, [view[end:]])
        self._start, self._end = start, end + count
        return count > 0

    def fileno(self) -> int:
        return self.read_fd

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.read_fd = self.write_fd = -1
