"""tidemq's side of the round trips: its broker on a store directory, in process, on a clock the
test moves (timers and transactions run on it; the timer service releases only when asked)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path

from rocketmq.grpc_protocol import definition_pb2 as pb

from tidemq.broker import Broker, BrokerConfig, ReceiveRequest
from tidemq.broker.clock import VirtualClock
from tidemq.protocol.grpc.convert import fill_delivered_message
from tidemq.store import MessageStore, StoreConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's e2e helpers

from e2e.server import ServerProcess


def Clock(now: int | None = None) -> VirtualClock:
    """The broker's virtual clock, at the wall clock's time (or `now`); it moves when told."""
    return VirtualClock(time.time_ns() // 1_000_000 if now is None else now)


def move_to(clock: VirtualClock, now: int) -> None:
    """Advance `clock` to `now` (not back), firing the broker's rounds due meanwhile."""
    clock.advance(max(0, now - clock.now))


async def _no_background_round(*args) -> None:
    return None


class InProcessBroker:
    """tidemq's broker on a store, on a private event loop."""

    def __init__(self, store: Path, clock: VirtualClock | None = None) -> None:
        self.clock = clock or Clock()
        self.loop = asyncio.new_event_loop()
        self.store = MessageStore(store, StoreConfig(clock=self.clock))
        self.broker = Broker(self.store, BrokerConfig(clock=self.clock))
        self.broker.timers.run = _no_background_round  # released by `release_timers`
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        self.broker.start(asyncio.get_running_loop())

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def receive_all(self, group: str, topic: str, expected: int) -> list:
        got: list = []
        for _ in range(expected // 16 + 20):
            batch = self.run(self.broker.receive(ReceiveRequest(group=group, topic=topic, batch_size=32)))
            got.extend(batch)
            if not batch and len(got) >= expected:
                break
        return got

    def release_timers(self) -> int:
        released = self.run(self.broker.timers.release_due())
        assert self.store.wait_dispatched()
        return released

    def queue_records(self, topic: str, queues: int, start: dict[int, int] | None = None) -> list:
        """The records of `topic`'s queues from `start` (queue id -> offset) on."""
        out = []
        for qid in range(queues):
            out += self.store.get(topic, qid, (start or {}).get(qid, 0), 10_000).messages
        return out

    def max_offsets(self, topic: str, queues: int) -> dict[int, int]:
        return {qid: self.store.max_offset(topic, qid) for qid in range(queues)}

    def close(self) -> None:
        self.run(self.broker.close())
        self.store.close()
        self.loop.close()


def delivered(received) -> pb.Message:
    """A received message as tidemq's gRPC service gives it to a client."""
    m = pb.Message()
    fill_delivered_message(m, received.record, "", received.receipt_handle, received.delivery_attempt, 30_000)
    return m


def copy_store(source: Path, target: Path) -> Path:
    subprocess.run(["cp", "-r", "--sparse=always", str(source), str(target)], check=True)
    return target


@contextlib.contextmanager
def serving(store: Path):
    """`tidemq serve` on `store` (a store's own segment size is kept) for the `with` block."""
    server = ServerProcess(store, "--segment-size", str(1 << 30)).start(timeout=120)
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log_text()
