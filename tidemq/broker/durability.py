"""DurableFutures: how a send waits for the flush policy without a thread or a callback per message.

Under sync flush a send may be acknowledged only once an fsync covers its bytes.  Each send on
the event loop appends (`MessageStore.put_unflushed`) and awaits a future from `after`; the store's
flush thread tells this object once per fsync (`flushed`, one `call_soon_threadsafe`), and the loop
settles every future the fsync covered.  Under async flush the future is settled at once.

One request to the store covers any number of waits: while one is outstanding (asked, and not yet
answered by a `flushed`), `after` asks nothing more.  That request makes the next fsync happen,
and an fsync writes the whole log written so far; whatever it did not cover, `_settle` asks for
again.

Ownership: `_waiting` and `_outstanding` belong to the event loop's thread; the flush thread only
calls `flushed`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from ..store import MessageStore


class DurableFutures:
    def __init__(self, store: MessageStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self.loop = loop
        # (end offset, deadline, future, result), ends ascending: one thread appends, in order
        self._waiting: deque[tuple[int, float, asyncio.Future, object]] = deque()
        self._outstanding = False  # a request the flush thread has not answered yet
        self._timeout = store.group_commit.timeout if store.group_commit is not None else 0.0

    def after(self, end_offset: int, result: object) -> asyncio.Future:
        """A future that gets `result` once the log is durable up to `end_offset`, or
        FlushTimeoutError after the store's sync-flush timeout or when the store closes first."""
        future = self.loop.create_future()
        if not self._outstanding:
            if self._store.await_flush(end_offset, self):
                future.set_result(result)
                return future
            self._outstanding = True
        self._waiting.append((end_offset, time.monotonic() + self._timeout, future, result))
        return future

    def flushed(self, position: int, stopping: bool) -> None:
        """The flush thread: an fsync made the log durable up to `position`."""
        try:
            self.loop.call_soon_threadsafe(self._settle, position, stopping)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _settle(self, position: int, stopping: bool) -> None:
        self._outstanding = False
        waiting = self._waiting
        while waiting and waiting[0][0] <= position:
            _, _, future, result = waiting.popleft()
            if not future.done():
                future.set_result(result)
        now = time.monotonic()
        while waiting and (stopping or waiting[0][1] <= now):
            end_offset, _, future, _ = waiting.popleft()
            if not future.done():
                future.set_exception(self._store.group_commit.timeout_error(end_offset))
        # the rest was written while that fsync ran: the next one will tell (or one already did)
        if waiting:
            if self._store.await_flush(waiting[-1][0], self):
                for _, _, future, result in waiting:
                    if not future.done():
                        future.set_result(result)
                waiting.clear()
            else:
                self._outstanding = True
