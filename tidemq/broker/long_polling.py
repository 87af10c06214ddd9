"""Receivers waiting for messages, woken by the store's dispatch notifications.

A waiting receive registers a future under its topic (and its client id); `notify(topics)` wakes
every waiter of those topics, which then pops again.  A wait ends after its timeout on the
broker's clock.  Owned by the event loop."""

from __future__ import annotations

import asyncio

from .clock import Clock


class LongPolling:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._by_topic: dict[str, set[asyncio.Future]] = {}
        self._by_client: dict[str, set[asyncio.Future]] = {}
        self.closed = False

    async def wait(self, topic: str, client_id: str, timeout_ms: float) -> None:
        """Return when woken or after `timeout_ms`, whichever comes first."""
        if self.closed or timeout_ms <= 0:
            return
        future = asyncio.get_running_loop().create_future()
        self._by_topic.setdefault(topic, set()).add(future)
        self._by_client.setdefault(client_id, set()).add(future)
        timer = self.clock.call_later(timeout_ms, lambda: _wake(future))
        try:
            await future
        finally:
            timer.cancel()
            _discard(self._by_topic, topic, future)
            _discard(self._by_client, client_id, future)

    def waiting(self, topic: str) -> int:
        return len(self._by_topic.get(topic, ()))

    def notify(self, topics) -> None:
        for topic in topics:
            for future in self._by_topic.get(topic, ()):
                _wake(future)

    def is_waiting(self, client_id: str) -> bool:
        return client_id in self._by_client

    def notify_client(self, client_id: str) -> None:
        for future in self._by_client.get(client_id, ()):
            _wake(future)

    def close(self) -> None:
        """Wake everyone and refuse to wait from now on (shutdown)."""
        self.closed = True
        for futures in self._by_topic.values():
            for future in futures:
                _wake(future)


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _discard(table: dict[str, set], key: str, future: asyncio.Future) -> None:
    waiters = table.get(key)
    if waiters is not None:
        waiters.discard(future)
        if not waiters:
            del table[key]
