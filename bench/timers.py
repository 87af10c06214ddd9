"""Timer benchmarks (the delay and timer part of the message-type benchmarks; bench/types.py runs
FIFO, transactions and `timers` below).  Timer accuracy: how late delay messages reach a
consumer while many other timers are pending.

    .venv/bin/python bench/timers.py timers [--pending N] [--measured M] [--spread-ms S] [--load-rate R]
    .venv/bin/python bench/timers.py tick [--due-per-round K] [--rounds R]

In one process, over a real store (async flush, temp directory) and the broker with the wall
clock, its background timer service running:
1. N delay messages due in 12-24 h are sent (the pending timers) and read into the timer heap;
2. M measured delay messages due over the next S ms are sent, while R normal messages a second
   go to another topic and a long-polling receiver drains both topics;
3. per measured message: delivery minus due time, where delivery is when the receive returned it
   (p50, p99, max), and release minus due time (the released copy's store time); with the share
   of a core the process had meanwhile (on a shared machine, lateness follows it);
4. the timer service's CPU time per release round and per released message;
5. the same with no pending timers, and the ratios: what the pending timers cost.
Target (issue 44): p99 of delivery minus due under 100 ms with 1,000,000 pending.

`tick`: the CPU time of one release round (the service's tick) that releases K stored timers,
with 0, 10,000 and 1,000,000 far-future timers in the heap, in virtual time: what a tick costs
as the number pending grows (a heap: O(K log n)).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tidemq.broker import Broker, BrokerConfig, Publish, ReceiveRequest, admin  # noqa: E402
from tidemq.broker.clock import VirtualClock  # noqa: E402
from tidemq.store import MessageStore, StoreConfig  # noqa: E402


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def send_delayed(broker: Broker, topic: str, dues: list[int], prefix: str, batch: int = 512) -> None:
    for start in range(0, len(dues), batch):
        chunk = dues[start:start + batch]
        results = await broker.send_batch([
            Publish(topic=topic, body=b"timer", message_id=f"{prefix}{start + i:010d}", message_type="DELAY",
                    delivery_timestamp=due) for i, due in enumerate(chunk)])
        failed = [r for r in results if not hasattr(r, "queue_offset")]
        if failed:
            raise RuntimeError(f"send failed: {failed[0]}")


async def normal_load(broker: Broker, rate: int, stop: asyncio.Event) -> int:
    sent, tick = 0, 0.01
    while not stop.is_set():
        n = max(1, int(rate * tick))
        await broker.send_batch([Publish(topic="BenchLoad", body=b"x" * 256, message_id=f"L{sent + i:012d}")
                                 for i in range(n)])
        sent += n
        await asyncio.sleep(tick)
    return sent


async def drain(broker: Broker, topic: str, group: str, expect: int, lags: list[float], release_lags: list[float],
                stop: asyncio.Event) -> None:
    req = ReceiveRequest(group=group, topic=topic, client_id=group, batch_size=32, invisible_ms=60_000, poll_ms=1_000)
    while len(lags) < expect and not stop.is_set():
        got = await broker.receive(req)
        at = now_ms()
        for r in got:
            due = int(r.record.properties["TIMER_OUT_MS"])
            lags.append(at - due)
            release_lags.append(r.record.store_timestamp - due)
        if got:
            broker.ack_many(group, topic, [r.receipt_handle for r in got])


async def drain_load(broker: Broker, stop: asyncio.Event) -> None:
    req = ReceiveRequest(group="BenchLoadG", topic="BenchLoad", client_id="load", batch_size=32, invisible_ms=60_000,
                         poll_ms=200)
    while not stop.is_set():
        got = await broker.receive(req)
        if got:
            broker.ack_many("BenchLoadG", "BenchLoad", [r.receipt_handle for r in got])


class RoundCost:
    """CPU time the timer service spends in its release rounds (process time: what a round
    costs, whatever share of the machine the process gets)."""

    def __init__(self, service) -> None:
        self.cpu = 0.0
        self.rounds = self.released = 0
        release_due = service.release_due

        async def measured() -> int:
            start = time.process_time()
            n = await release_due()
            self.cpu += time.process_time() - start
            self.rounds += 1
            self.released += n
            return n

        service.release_due = measured


async def run_timers(pending: int, measured: int, spread_ms: int, load_rate: int) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="tidemq-bench-timers-"))
    store = MessageStore(directory / "store", StoreConfig(flush="async", segment_size=256 << 20))
    broker = Broker(store, BrokerConfig())
    broker.start(asyncio.get_running_loop())
    try:
        admin.create_topic(broker, "BenchDelay", 8, "DELAY")
        admin.create_topic(broker, "BenchLoad", 8, "NORMAL")
        out = {"pending": pending}
        # warm up: the dispatch workers start and a delay message goes through once
        await send_delayed(broker, "BenchDelay", [now_ms() + 10], "W")
        warm: list[float] = []
        await drain(broker, "BenchDelay", "BenchDelayG", 1, warm, [], asyncio.Event())
        t0 = time.perf_counter()
        base = now_ms() + 12 * 3_600_000
        await send_delayed(broker, "BenchDelay", [base + (i * 7919) % (12 * 3_600_000) for i in range(pending)], "P")
        out["fill_s"] = time.perf_counter() - t0
        while broker.timers.loading() or broker.timers.pending() < pending:
            await asyncio.sleep(0.05)
        out["fill_and_load_s"] = time.perf_counter() - t0
        out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        stop = asyncio.Event()
        lags: list[float] = []
        release_lags: list[float] = []
        start = now_ms() + 1_000
        dues = [start + i * spread_ms // measured for i in range(measured)]
        load = asyncio.ensure_future(normal_load(broker, load_rate, stop)) if load_rate else None
        load_drain = asyncio.ensure_future(drain_load(broker, stop)) if load_rate else None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        cost = RoundCost(broker.timers)
        receiver = asyncio.ensure_future(drain(broker, "BenchDelay", "BenchDelayG", measured, lags, release_lags, stop))
        await send_delayed(broker, "BenchDelay", dues, "M")
        give_up = time.monotonic() + spread_ms / 1000 + 30
        while len(lags) < measured and time.monotonic() < give_up:
            await asyncio.sleep(0.05)
        stop.set()
        out["cpu_share"] = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        out["round_us"] = cost.cpu / max(1, cost.rounds) * 1e6
        out["release_us"] = cost.cpu / max(1, cost.released) * 1e6
        for task in (receiver, load, load_drain):
            if task is not None:
                await task
        out.update(received=len(lags), p50=percentile(lags, 0.5), p99=percentile(lags, 0.99), max=max(lags or [0]),
                   release_p50=percentile(release_lags, 0.5), release_p99=percentile(release_lags, 0.99),
                   early=sum(1 for lag in lags if lag < 0), load_sent=load.result() if load else 0)
        return out
    finally:
        await broker.close()
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


async def round_cost(pending: int, due_per_round: int, rounds: int) -> float:
    """CPU us of one release round that releases `due_per_round` stored timers while `pending`
    far-future timers wait in the heap (their keys pushed as the service keys them: a round
    never reads a timer that is not due)."""
    import heapq

    directory = Path(tempfile.mkdtemp(prefix="tidemq-bench-tick-"))
    clock = VirtualClock(now_ms())
    store = MessageStore(directory / "store", StoreConfig(flush="async", segment_size=64 << 20))
    broker = Broker(store, BrokerConfig(clock=clock))
    try:
        admin.create_topic(broker, "BenchDelay", 8, "DELAY")
        service = broker.timers
        far = (clock() + 23 * 3_600_000) << 40
        service._heap.extend(far + i for i in range(pending))  # sorted keys: already a heap
        await send_delayed(broker, "BenchDelay", [clock() + 1 + r for r in range(rounds) for _ in range(due_per_round)], "T")
        store.wait_dispatched()
        while service.loading():
            service._load()
        heapq.heapify(service._heap)
        cpu = 0.0
        for _ in range(rounds):
            clock.advance(1)
            start = time.process_time()
            released = await service.release_due()
            cpu += time.process_time() - start
            assert released == due_per_round, released
        return cpu / rounds * 1e6
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def report(r: dict, measured: int) -> None:
    print(f"  pending timers {r['pending']:,}: sent in {r['fill_s']:.1f} s, in the heap after {r['fill_and_load_s']:.1f} s,"
          f" peak RSS {r['rss_mb']:.0f} MB")
    print(f"  delivered {r['received']}/{measured} measured, {r['early']} early;"
          f" delivery - due: p50 {r['p50']:.0f} ms, p99 {r['p99']:.0f} ms, max {r['max']:.0f} ms;"
          f" release - due: p50 {r['release_p50']:.0f} ms, p99 {r['release_p99']:.0f} ms;"
          f" normal load {r['load_sent']:,} messages; the process had {r['cpu_share']:.0%} of a core"
          f" (load average {os.getloadavg()[0]:.1f})")
    print(f"  timer service CPU: {r['round_us']:.0f} us per round, {r['release_us']:.0f} us per released message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    timers = sub.add_parser("timers", help="timer accuracy with many pending timers")
    timers.add_argument("--pending", type=int, default=1_000_000)
    timers.add_argument("--measured", type=int, default=2_000)
    timers.add_argument("--spread-ms", type=int, default=10_000)
    timers.add_argument("--load-rate", type=int, default=2_000, help="normal messages a second sent meanwhile")
    tick = sub.add_parser("tick", help="CPU of one release round against the number of pending timers")
    tick.add_argument("--due-per-round", type=int, default=10)
    tick.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    if args.part == "tick":
        print(f"CPU of a release round that releases {args.due_per_round} timers (mean of {args.rounds} rounds):")
        costs = {}
        for pending in (0, 10_000, 1_000_000):
            costs[pending] = asyncio.run(round_cost(pending, args.due_per_round, args.rounds))
            print(f"  {pending:>9,} pending: {costs[pending]:.0f} us")
        print(f"  1,000,000 pending / none: {costs[1_000_000] / costs[0]:.2f}")
    if args.part == "timers":
        print(f"timer accuracy: {args.measured} delay messages due over {args.spread_ms} ms, "
              f"{args.load_rate} normal messages/s meanwhile")
        empty = asyncio.run(run_timers(0, args.measured, args.spread_ms, args.load_rate))
        report(empty, args.measured)
        full = asyncio.run(run_timers(args.pending, args.measured, args.spread_ms, args.load_rate))
        report(full, args.measured)
        print(f"  p99 with {args.pending:,} pending / p99 with none: {full['p99'] / max(1, empty['p99']):.2f};"
              f" CPU per released message, {args.pending:,} pending / none:"
              f" {full['release_us'] / max(1e-9, empty['release_us']):.2f};"
              f" target p99 < 100 ms: {'met' if full['p99'] < 100 else 'NOT met'}")


if __name__ == "__main__":
    main()
