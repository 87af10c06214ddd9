"""Message-type benchmark: FIFO and transactional messages against normal ones, and the accuracy
of timers with many pending, in the broker.

    .venv/bin/python bench/types.py [--messages N] [--groups G] [--rounds R]
                                    [--pending P] [--measured M] [--no-timers]

The broker runs in this process over a real store (temp directory, async flush), without the
gRPC transport, whose cost per call is the same for every type: the figures are the broker's own
cost of each type, as messages per CPU second of this process (CPU time, not wall time, so that
other load on the machine moves the figures less).  Prints, per round and as the median of the
rounds:
- consume: N messages received (batch 32) and acked, one consumer loop, from a normal topic by a
  normal group, and from a FIFO topic (G message groups, sent round-robin over the groups) by a
  FIFO group (the two take turns going first): messages per second and the FIFO/normal ratio
  (target: at least 0.70);
- send: N one-message sends to a normal topic, then N transactional sends each followed by its
  EndTransaction COMMIT: transactions per second and the ratio to normal sends;
- timers (bench/timers.py `timers`, wall clock, normal load meanwhile): M delay messages due over
  10 s, first with no other timer pending, then with P (default 1,000,000) due in 12-24 h:
  delivery minus due time, p50 and p99 (target: p99 under 100 ms), with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timers import report, run_timers  # bench/timers.py, beside this file

from tidemq.broker import Broker, BrokerConfig, Publish, ReceiveRequest, admin
from tidemq.store import MessageStore, StoreConfig

BATCH = 64  # messages per send_batch call when filling a topic


async def fill(broker: Broker, topic: str, count: int, groups: int = 0, kind: str = "NORMAL") -> None:
    for start in range(0, count, BATCH):
        batch = [Publish(topic=topic, body=b"x" * 100, message_id=f"{topic}-{i}", message_type=kind,
                         message_group=f"group-{i % groups}" if groups else None)
                 for i in range(start, min(count, start + BATCH))]
        await broker.send_batch(batch)


async def consume(broker: Broker, group: str, topic: str, count: int) -> float:
    """CPU seconds of this process to receive and ack `count` messages."""
    got = 0
    began = time.process_time()
    while got < count:
        received = await broker.receive(ReceiveRequest(group=group, topic=topic, client_id="bench", batch_size=32,
                                                       invisible_ms=60_000, poll_ms=1_000))
        broker.ack_many(group, topic, [r.receipt_handle for r in received])
        got += len(received)
    return time.process_time() - began


async def sends(broker: Broker, topic: str, count: int, transactional: bool) -> float:
    """CPU seconds of this process (the dispatch workers are others) for `count` sends."""
    began = time.process_time()
    for i in range(count):
        msg = Publish(topic=topic, body=b"x" * 100, message_id=f"{topic}-s{i}",
                      message_type="TRANSACTION" if transactional else "NORMAL")
        result = await broker.send(msg)
        if transactional:
            await broker.end_transaction(topic, msg.message_id, result.transaction_id, "COMMIT")
    return time.process_time() - began


async def one_round(directory: Path, messages: int, groups: int, fifo_first: bool) -> dict:
    store = MessageStore(directory, StoreConfig(segment_size=256 << 20))
    broker = Broker(store, BrokerConfig())
    broker.start(asyncio.get_running_loop())
    try:
        admin.create_topic(broker, "normal", 8)
        admin.create_topic(broker, "fifo", 8, "FIFO")
        admin.create_topic(broker, "tx", 8, "TRANSACTION")
        admin.create_group(broker, "fifo-group", fifo=True)
        await fill(broker, "normal", messages)
        await fill(broker, "fifo", messages, groups, "FIFO")
        store.wait_dispatched(60)
        phases = [("normal-group", "normal"), ("fifo-group", "fifo")]
        if fifo_first:
            phases.reverse()
        rates = {topic: messages / await consume(broker, group, topic, messages) for group, topic in phases}
        normal, fifo = rates["normal"], rates["fifo"]
        plain_sends = messages / await sends(broker, "normal", messages, transactional=False)
        transactions = messages / await sends(broker, "tx", messages, transactional=True)
    finally:
        await broker.close()
        store.close()
    return {"normal consume/s": normal, "FIFO consume/s": fifo, "FIFO/normal": fifo / normal,
            "normal sends/s": plain_sends, "transactions/s": transactions, "tx/normal sends": transactions / plain_sends}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pending", type=int, default=1_000_000, help="far-future timers pending meanwhile")
    parser.add_argument("--measured", type=int, default=2_000, help="delay messages whose lateness is measured")
    parser.add_argument("--no-timers", action="store_true", help="FIFO and transactions only")
    args = parser.parse_args()
    rounds = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="tidemq-bench-types-") as tmp:
            figures = asyncio.run(one_round(Path(tmp) / "store", args.messages, args.groups, fifo_first=r % 2 == 1))
        rounds.append(figures)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.2f}" if v < 10 else f"{k} {v:,.0f}" for k, v in figures.items()))
    print(f"median of {args.rounds} rounds, {args.messages:,} messages, {args.groups:,} message groups:")
    for key in rounds[0]:
        value = statistics.median(r[key] for r in rounds)
        print(f"  {key:18} {value:,.2f}" if value < 10 else f"  {key:18} {value:,.0f}")
    ratio = statistics.median(r["FIFO/normal"] for r in rounds)
    print(f"FIFO consume at {ratio:.0%} of normal (target: at least 70%)")
    if not args.no_timers:
        timer_accuracy(args.pending, args.measured)
    return 0


def timer_accuracy(pending: int, measured: int, spread_ms: int = 10_000, load_rate: int = 2_000) -> None:
    print(f"timer accuracy: {measured:,} delay messages due over {spread_ms:,} ms, {load_rate:,} normal messages/s"
          f" meanwhile; with no other timer pending, then with {pending:,}:")
    runs = [asyncio.run(run_timers(n, measured, spread_ms, load_rate)) for n in (0, pending)]
    for figures in runs:
        report(figures, measured)
    p99 = runs[1]["p99"]
    print(f"timer p99 {p99:.0f} ms with {pending:,} pending (target: under 100 ms: {'met' if p99 < 100 else 'NOT met'})")


if __name__ == "__main__":
    raise SystemExit(main())
