"""Lite topics at the broker: what an arrival, a subscription change and a maintenance round cost
as the broker holds more receives, subscriptions and light-queue progress (in process, a real
store in a temporary directory, the broker without gRPC).

    .venv/bin/python bench/lite_broker.py [--sizes 100,1000,10000]

For each size N:
1. wake: N lite receives wait on one bind topic, each client subscribed to its own lite topic;
   100 messages, each to one of them: the lite pops per arrival (the receives woken) and the
   time per arrival until its receive returned;
2. sync: N clients hold 20 lite topics each; the median time of a PARTIAL_ADD and of a
   PARTIAL_REMOVE by one client, and the median bytes the subscription log grew by at an add;
3. round: 20*N groups' progress on light queues known to the broker; the time of a
   maintenance round (client expiry, changed offsets to the tables, log fsync, consumerOffset.json)
   with nothing changed, and with 100 pairs changed.
Runs against an earlier version too (PYTHONPATH at its checkout), to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tidemq.broker import Broker, BrokerConfig, Publish, ReceiveRequest, admin
from tidemq.broker.lite import COMPLETE_ADD, PARTIAL_ADD, PARTIAL_REMOVE, lmq_name
from tidemq.store import MessageStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    args = parser.parse_args()
    print(
        f"{'N':>8} {'pops/arrival':>12} {'ms/arrival':>10} {'us/add':>8} {'us/remove':>9} "
        f"{'log B/change':>12} {'ms/round idle':>13} {'ms/round 100 changed':>20}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(run(Path(directory) / "store", size))


async def run(directory: Path, n: int) -> None:
    store = MessageStore(directory)
    limits = {"max_lite_subscription_count": 100 * n}
    config = BrokerConfig(lite_subscription_quota=2000, **{k: v for k, v in limits.items() if hasattr(BrokerConfig, k)})
    broker = Broker(store, config)
    broker.start(asyncio.get_running_loop())
    try:
        admin.create_topic(broker, "Bind", message_type="LITE")
        admin.create_group(broker, "Readers", lite_bind_topic="Bind")
        pops_per_arrival, ms_per_arrival = await wake(broker, store, n)
        add_us, remove_us, log_bytes = sync(broker, n)
        idle_ms, changed_ms = maintenance(broker, n)
        print(
            f"{n:>8} {pops_per_arrival:>12.1f} {ms_per_arrival:>10.2f} {add_us:>8.0f} {remove_us:>9.0f} "
            f"{log_bytes:>12.0f} {idle_ms:>13.2f} {changed_ms:>20.2f}"
        )
    finally:
        await broker.close()
        store.close()


async def wake(broker: Broker, store: MessageStore, n: int) -> tuple[float, float]:
    for i in range(n):
        broker.lite.sync(f"c{i}", "Readers", "Bind", COMPLETE_ADD, [f"own-{i}"])
    pops = [0]
    pop = broker.lite.pop

    def counted(*args):
        pops[0] += 1
        return pop(*args)

    broker.lite.pop = counted  # type: ignore[method-assign]
    waits = {
        i: asyncio.ensure_future(broker.receive(ReceiveRequest("Readers", "Bind", client_id=f"c{i}", poll_ms=600_000)))
        for i in range(n)
    }
    while pops[0] < n:  # noqa: ASYNC110 (every receive has popped once and waits)
        await asyncio.sleep(0.01)
    times, before = [], pops[0]
    for k in range(100):
        i = (k * 7919) % n
        started = time.perf_counter()
        await broker.send(
            Publish(topic="Bind", body=b"x" * 100, message_id=f"W{k}", message_type="LITE", lite_topic=f"own-{i}")
        )
        got = await waits[i]
        times.append(time.perf_counter() - started)
        assert got
        waits[i] = asyncio.ensure_future(
            broker.receive(ReceiveRequest("Readers", "Bind", client_id=f"c{i}", poll_ms=600_000))
        )
        await asyncio.sleep(0)
    arrivals_pops = (pops[0] - before - 100) / 100  # each re-issued receive pops once: not the arrival's
    broker.long_polling.close()
    await asyncio.gather(*waits.values())
    broker.long_polling.closed = False
    broker.lite.pop = pop  # type: ignore[method-assign]
    return arrivals_pops, statistics.mean(times) * 1000


def sync(broker: Broker, n: int) -> tuple[float, float, float]:
    for i in range(n):
        broker.lite.sync(f"c{i}", "Readers", "Bind", COMPLETE_ADD, [f"t{i}-{j}" for j in range(20)])
    path = broker.lite.table.path
    adds, removes, grown = [], [], []
    for k in range(200):
        size = path.stat().st_size
        started = time.perf_counter()
        broker.lite.sync("c0", "Readers", "Bind", PARTIAL_ADD, [f"extra-{k}"])
        adds.append(time.perf_counter() - started)
        grown.append(path.stat().st_size - size)  # negative where the log was compacted
        if hasattr(broker.lite, "partial_adds"):  # the rate limit is not what is measured
            broker.lite.partial_adds._tokens = broker.lite.partial_adds.rate
        started = time.perf_counter()
        broker.lite.sync("c0", "Readers", "Bind", PARTIAL_REMOVE, [f"extra-{k}"])
        removes.append(time.perf_counter() - started)
    return statistics.median(adds) * 1e6, statistics.median(removes) * 1e6, statistics.median(grown)


def maintenance(broker: Broker, n: int) -> tuple[float, float]:
    queues = [lmq_name("Bind", f"t{i}-{j}") for i in range(n) for j in range(20)]
    for q in queues:
        broker.move_cursor("Readers", q, 0, 0)
    lite = broker.lite

    def maintain() -> None:
        if hasattr(lite, "maintain"):
            lite.maintain(broker.clock())
        else:  # a version before it: the same round's lite steps
            lite.expire(broker.clock())
            lite.commit_offsets(broker.clock())
        broker.save_consumer_offsets()

    maintain()
    while getattr(lite, "_changed", None):  # the rounds that take in the new pairs
        maintain()

    def round_ms() -> float:
        started = time.perf_counter()
        maintain()
        return (time.perf_counter() - started) * 1000

    idle = statistics.median(round_ms() for _ in range(5))
    changed = []
    for r in range(5):
        for q in queues[r * 100 : (r + 1) * 100]:
            broker.move_cursor("Readers", q, 0, 0)
        changed.append(round_ms())
    return idle, statistics.median(changed)


if __name__ == "__main__":
    main()
