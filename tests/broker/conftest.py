import asyncio

import pytest

from tidemq.broker import Broker, BrokerConfig
from tidemq.broker.clock import VirtualClock
from tidemq.store import MessageStore, StoreConfig


class Harness:
    """A broker over a real store in a temp dir, on a private event loop, with a virtual clock
    (deadlines, long polls and the background rounds all move with `clock.advance`)."""

    def __init__(self, directory, **config) -> None:
        self.directory = directory
        self.clock = VirtualClock()
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.open()

    def open(self) -> None:
        self.store = MessageStore(self.directory, StoreConfig(segment_size=1 << 20))
        self.broker = Broker(self.store, BrokerConfig(clock=self.clock, **self.config))
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        self.broker.start(asyncio.get_running_loop())

    def close(self) -> None:
        self.run(self.broker.close())
        self.store.close()

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def send(self, topic: str, body: bytes, tag: str | None = None, **kw):
        from tidemq.broker import Publish

        self.sent = getattr(self, "sent", 0) + 1
        result = self.run(self.broker.send(Publish(topic=topic, body=body, message_id=f"ID{self.sent:08d}", tag=tag, **kw)))
        self.store.wait_dispatched()
        return result

    def receive(self, group: str, topic: str, batch: int = 32, invisible_ms: int = 30_000, poll_ms: int = 0,
                expression: str = "*", auto_renew: bool = False, client_id: str = "c1", filter_type: str = "TAG"):
        from tidemq.broker import ReceiveRequest

        req = ReceiveRequest(group=group, topic=topic, client_id=client_id, filter_type=filter_type, filter_expression=expression,
                             batch_size=batch, invisible_ms=invisible_ms, auto_renew=auto_renew, poll_ms=poll_ms)
        return self.run(self.broker.receive(req))


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path / "store")
    yield h
    h.close()
    h.loop.close()
