"""The broker's clock (tidemq/broker/clock.py): the virtual clock fires timers at their time, in
order, with the time they were due; the wall clock's timers and `sleep` run on the event loop."""

import asyncio

from tidemq.broker.clock import VirtualClock, WallClock, sleep


def test_virtual_timers_fire_in_due_order_at_their_time_and_not_when_cancelled():
    clock = VirtualClock(1_000)
    fired = []
    clock.call_later(30, lambda: fired.append(("b", clock())))
    clock.call_later(10, lambda: fired.append(("a", clock())))
    cancelled = clock.call_later(20, lambda: fired.append(("never", clock())))
    clock.call_later(0, lambda: fired.append(("now", clock())))
    cancelled.cancel()
    clock.advance(29)
    assert fired == [("now", 1_000), ("a", 1_010)] and clock() == 1_029
    clock.advance(1)
    assert fired[-1] == ("b", 1_030) and len(fired) == 3


def test_a_virtual_timer_set_by_a_firing_one_fires_in_the_same_advance_when_due():
    clock = VirtualClock(0)
    fired = []

    def first():
        fired.append(clock())
        clock.call_later(5, lambda: fired.append(clock()))
        clock.call_later(50, lambda: fired.append(clock()))

    clock.call_later(10, first)
    clock.advance(20)
    assert fired == [10, 15] and clock() == 20
    clock.advance(40)
    assert fired == [10, 15, 60]


def test_sleep_ends_when_the_virtual_clock_passes_it():
    clock = VirtualClock(0)

    async def scenario():
        sleeper = asyncio.ensure_future(sleep(clock, 100))
        await asyncio.sleep(0)
        clock.advance(99)
        await asyncio.sleep(0)
        early = sleeper.done()
        clock.advance(1)
        await asyncio.wait_for(sleeper, 10)
        return early

    assert asyncio.run(scenario()) is False


def test_wall_clock_timers_run_on_the_loop_and_can_be_cancelled():
    clock = WallClock()

    async def scenario():
        fired = []
        clock.call_later(-5, lambda: fired.append("past"))  # a time already passed: at once
        clock.call_later(60_000, lambda: fired.append("later")).cancel()
        await sleep(clock, 1)
        return fired

    assert asyncio.run(scenario()) == ["past"]
