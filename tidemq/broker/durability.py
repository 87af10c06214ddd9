"""DurableFutures: how a send waits for the flush policy without a thread or a callback per message.

Under sync flush a send may be acknowledged only once an fsync covers its bytes.  Each send on
the event loop appends (`MessageStore.put_unflushed`) and awaits a future from `after`; the store's
flush thread tells this object once per fsync (`flushed`, one `call_soon_threadsafe`), and the loop
settles every future the fsync covered.  Under async flush the future is settled at once.

Sends share a wait, not a future: the sends appended one after another while no fsync started
form a group, settled together when the log is durable up to the group's last byte.  Every send
awaits a future of its own (the group holds them all): a future awaited by several tasks breaks
when a coroutine is run by hand up to its first suspension before a task takes it over (as the
gRPC transport does), because the future's "blocking" flag set by one awaiter is consumed by
another's task, which then fails with "await wasn't used with future".  A group closes when
the flush thread starts an fsync (`GroupCommit.fsyncs_started`, counted before the fsync looks at
how far the log is written) or tells of one: every send of a group is then covered by the same
fsyncs, and none waits for a later fsync than its own bytes need, except those appended in the
instant between that count and the look.

One request to the store covers any number of waits: while one is outstanding (asked, and not yet
answered by a `flushed`), `after` asks nothing more.  That request makes the next fsync happen,
and an fsync writes the whole log written so far; whatever it did not cover, `_settle` asks for
again.

Ownership: `_groups`, `_epoch` and `_outstanding` belong to the event loop's thread; the flush
thread only calls `flushed`.
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
        self._group_commit = store.group_commit
        # [last end offset, deadline, [futures]], ends ascending: one thread appends, in order
        self._groups: deque[list] = deque()
        self._epoch = -1  # fsyncs started when the last group opened; -1: it is closed
        self._outstanding = False  # a request the flush thread has not answered yet
        self._timeout = store.group_commit.timeout if store.group_commit is not None else 0.0

    def after(self, end_offset: int) -> asyncio.Future:
        """A future settled (with None) once the log is durable up to `end_offset`, or failed with
        FlushTimeoutError after the store's sync-flush timeout or when the store closes first."""
        group_commit = self._group_commit
        future = self.loop.create_future()
        if group_commit is not None and self._epoch == group_commit.fsyncs_started:
            group = self._groups[-1]  # no fsync started since it opened: join it
            group[0] = end_offset
            group[1] = time.monotonic() + self._timeout  # each send waits the whole timeout at least
            group[2].append(future)
            return future
        if not self._outstanding:
            if self._store.await_flush(end_offset, self):
                future.set_result(None)
                return future
            self._outstanding = True
        assert group_commit is not None  # without one (async flush) the log is durable at once
        self._groups.append([end_offset, time.monotonic() + self._timeout, [future]])
        self._epoch = group_commit.fsyncs_started
        return future

    def flushed(self, position: int, stopping: bool) -> None:
        """The flush thread: an fsync made the log durable up to `position`."""
        try:
            self.loop.call_soon_threadsafe(self._settle, position, stopping)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _settle(self, position: int, stopping: bool) -> None:
        self._outstanding = False
        self._epoch = -1
        groups = self._groups
        while groups and groups[0][0] <= position:
            _succeed(groups.popleft()[2])
        now = time.monotonic()
        group_commit = self._group_commit
        while groups and (stopping or groups[0][1] <= now):
            assert group_commit is not None  # groups wait for an fsync of the group commit
            end_offset, _, futures = groups.popleft()
            error = group_commit.timeout_error(end_offset)
            for future in futures:
                if not future.done():
                    future.set_exception(error)
        # the rest was written while that fsync ran: the next one will tell (or one already did)
        if groups:
            if self._store.await_flush(groups[-1][0], self):
                for group in groups:
                    _succeed(group[2])
                groups.clear()
            else:
                self._outstanding = True


def _succeed(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():  # a waiter that was cancelled
            future.set_result(None)
