"""Lite receive benchmark: the broker's cost of a receive on a bind topic for a client subscribed
to many lite topics (in process, a real store in a temporary directory, the broker's pop path
without gRPC).

    .venv/bin/python bench/lite_receive.py [--subscribed N] [--with-messages K] [--rounds R]

One lite consumer subscribes N lite topics (default 1,200, the Java client's quota); K of them
(default 120, spread evenly) hold one message each.  Prints the time to drain those messages
(receive 32, ack each) and the mean time of a receive that finds nothing (what every wake-up of
a waiting lite receive costs when the message that woke it is another client's), over R rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tidemq.broker import Broker, BrokerConfig, Publish, ReceiveRequest, admin
from tidemq.broker.lite import COMPLETE_ADD
from tidemq.store import MessageStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribed", type=int, default=1200)
    parser.add_argument("--with-messages", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run(Path(directory) / "store", args))


async def run(directory: Path, args) -> None:
    store = MessageStore(directory)
    broker = Broker(store, BrokerConfig())
    broker.start(asyncio.get_running_loop())
    try:
        admin.create_topic(broker, "Bind", message_type="LITE")
        admin.create_group(broker, "Readers", lite_bind_topic="Bind")
        names = [f"lite-{i}" for i in range(args.subscribed)]
        broker.lite.sync("client", "Readers", "Bind", COMPLETE_ADD, names)
        step = max(1, args.subscribed // max(1, args.with_messages))
        for i in range(0, args.subscribed, step)[: args.with_messages]:
            await broker.send(Publish(topic="Bind", body=b"x" * 100, message_id=f"M{i}", message_type="LITE",
                                      lite_topic=names[i]))
        store.wait_dispatched()
        request = ReceiveRequest("Readers", "Bind", client_id="client", batch_size=32)
        drained, started = 0, time.perf_counter()
        while batch := await broker.receive(request):
            drained += len(batch)
            for received in batch:
                broker.ack("Readers", received.queue_topic, received.receipt_handle)
        drain_s = time.perf_counter() - started
        empty = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            assert await broker.receive(request) == []
            empty.append(time.perf_counter() - started)
        print(f"subscribed lite topics: {args.subscribed}, holding a message: {drained}")
        print(f"drain (receive 32, ack each): {drain_s * 1000:.1f} ms, {drained / drain_s:,.0f} messages/s")
        print(f"empty receive: mean {statistics.mean(empty) * 1000:.2f} ms, "
              f"{statistics.mean(empty) / args.subscribed * 1e6:.1f} us per subscribed lite topic")
    finally:
        await broker.close()
        store.close()


if __name__ == "__main__":
    main()
