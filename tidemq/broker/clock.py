"""The broker's one clock: the time in ms that deadlines are kept in, and timers on that time for
long-poll expiry, wake-ups and the background rounds.

`WallClock` (production): the time of day; its timers run on the running event loop's monotonic
clock, so a step of the time of day moves deadlines but not how long a timer waits.
`VirtualClock` (tests, benchmarks): a time that moves only when `advance` is called; its timers
fire, in the order of their due time, as it passes them.  Both are used from the event loop's
thread only."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def __call__(self) -> int:
        """Now, in ms."""
        ...

    def call_later(self, delay_ms: float, callback: Callable[[], object]) -> Timer:
        """Call `callback` once `delay_ms` have passed on this clock (at once when not positive),
        unless the returned timer is cancelled first."""
        ...


class WallClock:
    def __call__(self) -> int:
        return time.time_ns() // 1_000_000

    def call_later(self, delay_ms: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, delay_ms) / 1000, callback)


class VirtualClock:
    """Virtual time in ms, advanced by its owner."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now
        self._timers: list[tuple[float, int, _VirtualTimer]] = []
        self._order = itertools.count()

    def __call__(self) -> int:
        return self.now

    def call_later(self, delay_ms: float, callback: Callable[[], object]) -> Timer:
        timer = _VirtualTimer(callback)
        heapq.heappush(self._timers, (self.now + max(0.0, delay_ms), next(self._order), timer))
        return timer

    def advance(self, ms: int) -> None:
        """Move time on by `ms`, firing the timers due meanwhile (those they set too) at their
        time; time ends `ms` later."""
        end = self.now + ms
        while self._timers and self._timers[0][0] <= end:
            due, _, timer = heapq.heappop(self._timers)
            self.now = max(self.now, int(due))
            timer.fire()
        self.now = end


class _VirtualTimer:
    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        self.callback = None

    def fire(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


async def sleep(clock: Clock, ms: float) -> None:
    """Wait `ms` on `clock`."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    timer = clock.call_later(ms, wake)
    try:
        await future
    finally:
        timer.cancel()
