"""Flush policies: when appended bytes become durable.

- async: a background thread flushes every `flush_interval_ms`; a put returns once written.
- sync (group commit): a put waits until an fsync covers its bytes.  The flusher starts an
  fsync once every put in progress has appended and is waiting (or `gather_ms` has passed since
  the first waiter), so N concurrent putters share one fsync instead of paying for N; a lone
  putter is flushed at once.

Ownership: `GroupCommit._cond` guards `requested`, `flushed`, `active`, `waiting`, the blocked
putters' locks, the callbacks and the listeners; only the flusher thread calls
`CommitLog.flush`, and it reads `write_position` without the append lock (a stale value only
flushes less, and the requester waits for the next round).
"""

from __future__ import annotations

import logging
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable
from typing import Protocol

from ..errors import FlushTimeoutError
from .commit_log import CommitLog

log = logging.getLogger(__name__)


DurableCallback = Callable[[object, BaseException | None], None]


class FlushListener(Protocol):
    def flushed(self, position: int, stopping: bool) -> None:
        """Called on the flusher thread after an fsync made the log durable up to `position`
        (`stopping`: the store is closing, no further fsync will come)."""


class GroupCommit:
    """The sync-flush service.  Two ways to wait for durability:

    - `wait_for(end)`: the calling thread blocks (bracketed by `begin()`/`end()`, so the flusher
      knows how many putters are still appending);
    - `register(end, callback, token)`: returns at once; the flusher thread later calls
      `callback(token, None)`, or `callback(token, FlushTimeoutError)`;
    - `request(end, listener)`: the flusher calls `listener.flushed` once after the next fsync,
      however many puts the listener waits for (the broker's futures of one event loop).
    """

    def __init__(
        self, commit_log: CommitLog, on_flushed: Callable[[int], None], timeout_ms: int = 5000, gather_ms: float = 2.0
    ) -> None:
        self.commit_log = commit_log
        self.on_flushed = on_flushed
        self.timeout = timeout_ms / 1000.0
        self.gather = gather_ms / 1000.0
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # guards the state below (blocked putters sleep on locks of their own)
        self._work = threading.Condition(lock)  # the flusher sleeps here; putters wake it
        self.active = 0  # blocking puts between begin() and end()
        self.waiting = 0  # of those, how many have appended and wait for the fsync
        self.requested = commit_log.flushed_position
        self.flushed = commit_log.flushed_position
        self._callbacks: list[tuple[int, float, DurableCallback, object]] = []
        self._listeners: set[FlushListener] = set()  # to tell of the next fsync
        self._waiters: list[
            tuple[int, threading.Lock]
        ] = []  # blocked putters: (end offset, their lock, held until released)
        self.fsyncs = 0
        self.fsyncs_started = 0  # the flusher counts an fsync here before it looks at write_position
        self.error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tidemq-group-commit", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """A blocking put has started: the flusher waits for it to append before the next fsync."""
        with self._cond:
            self.active += 1

    def end(self) -> None:
        with self._cond:
            self.active -= 1
            if self.waiting and self.waiting >= self.active:
                self._work.notify()

    def register(self, end_offset: int, callback: DurableCallback, token: object) -> None:
        with self._cond:
            if self.flushed >= end_offset:
                ready = True
            else:
                ready = False
                self.requested = max(self.requested, end_offset)
                self._callbacks.append((end_offset, time.monotonic() + self.timeout, callback, token))
                if len(self._callbacks) == 1:
                    self._work.notify()
        if ready:
            callback(token, None)

    def request(self, end_offset: int, listener: FlushListener) -> bool:
        """Flush up to `end_offset`, and tell `listener` after the next fsync (which may cover
        less, if the bytes were written while it ran: then request again).  Returns True, and
        registers nothing, if the log is already durable up to `end_offset`.

        A listener is only ever registered with a request past `flushed`: one registered for
        bytes an fsync had already covered (between the caller's look at `flushed` and this
        lock) would stay in the set while the flusher slept, and every later request of that
        listener, finding it there, would not wake the flusher."""
        with self._cond:
            if self.flushed >= end_offset:
                return True
            if self._stopping:
                stopped = True
            else:
                stopped = False
                if end_offset > self.requested:
                    self.requested = end_offset
                if listener not in self._listeners:
                    self._listeners.add(listener)
                    self._work.notify()
        if stopped:
            listener.flushed(self.flushed, True)
        return False

    def wait_for(self, end_offset: int) -> None:
        """Block until the log is durable up to `end_offset`, or raise FlushTimeoutError.

        The caller sleeps on a lock of its own, which the flusher releases after the fsync that
        covers it (and counts it as no longer waiting): woken, it returns without taking the
        shared lock again, so the putters an fsync releases do not queue for it one by one."""
        with self._cond:
            if self.flushed >= end_offset:
                return
            if self._stopping:
                raise self.timeout_error(end_offset)
            self.requested = max(self.requested, end_offset)
            waiter = _allocate_lock()
            waiter.acquire()
            entry = (end_offset, waiter)
            self._waiters.append(entry)
            self.waiting += 1
            if self.waiting >= self.active or self.waiting == 1:
                self._work.notify()
        if not waiter.acquire(timeout=self.timeout):
            with self._cond:
                if entry in self._waiters:  # not released: no fsync covered it in time
                    self._waiters.remove(entry)
                    self.waiting -= 1
        if self.flushed < end_offset:
            raise self.timeout_error(end_offset)

    def timeout_error(self, end_offset: int) -> FlushTimeoutError:
        cause = f"; last fsync error: {self.error}" if self.error is not None else ""
        return FlushTimeoutError(
            f"bytes up to offset {end_offset} not flushed within {self.timeout:.1f}s "
            f"(flushed up to {self.flushed}){cause}; the message is written and may survive"
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                while self.requested <= self.flushed and not self._stopping:
                    self._work.wait()
                if self._stopping and self.requested <= self.flushed:
                    break
                # gather: let every blocking put in progress append before paying for the fsync
                deadline = time.monotonic() + self.gather
                while self.waiting < self.active and not self._stopping:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._work.wait(remaining)
            self.fsyncs_started += 1  # before `flush` reads how far to flush (see DurableFutures)
            try:
                flushed = self.commit_log.flush()
                self.fsyncs += 1
                error = None
            except OSError as exc:  # the environment: waiters time out with this as the cause
                log.error("commit-log fsync failed: %s", exc)
                flushed, error = self.flushed, exc
            with self._cond:
                self.error = error
                self.flushed = max(self.flushed, flushed)
                self._release_waiters()
                done, expired, pending = [], [], []
                now = time.monotonic()
                for entry in self._callbacks:
                    if entry[0] <= self.flushed:
                        done.append(entry)
                    elif entry[1] <= now or self._stopping:
                        expired.append(entry)
                    else:
                        pending.append(entry)
                self._callbacks = pending
                listeners, self._listeners = self._listeners, set()
            for listener in listeners:
                listener.flushed(self.flushed, self._stopping)
            for _, _, callback, token in done:
                callback(token, None)
            for end_offset, _, callback, token in expired:
                callback(token, self.timeout_error(end_offset))
            if error is None:
                self.on_flushed(flushed)
            elif self._stopping:
                break  # closing on a disk that will not flush: every waiter was just told
            else:
                time.sleep(0.01)

    def _release_waiters(self) -> None:
        """Wake the blocked putters whose bytes are durable, or all when stopping (`_cond` held)."""
        flushed, stopping, keep = self.flushed, self._stopping, []
        for entry in self._waiters:
            if entry[0] <= flushed or stopping:
                entry[1].release()
                self.waiting -= 1
            else:
                keep.append(entry)
        self._waiters = keep

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._release_waiters()
            self._work.notify_all()
        self._thread.join()
        with self._cond:
            listeners, self._listeners = self._listeners, set()
        for listener in listeners:
            listener.flushed(self.flushed, True)


class PeriodicService:
    """Runs `work()` every `interval` seconds on its own thread until stopped; `wake()` runs it
    at once."""

    def __init__(self, name: str, interval: float, work: Callable[[], None]) -> None:
        self.interval = interval
        self.work = work
        self._event = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._event.set()

    def _run(self) -> None:
        while not self._stopping:
            self._event.wait(self.interval)
            self._event.clear()
            if self._stopping:
                break
            try:
                self.work()
            except Exception:
                log.exception("%s failed", self._thread.name)

    def stop(self) -> None:
        self._stopping = True
        self._event.set()
        self._thread.join()
