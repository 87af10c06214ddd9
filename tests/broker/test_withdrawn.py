"""A send that fails after its record was appended (under sync flush, the fsync did not come in
time) is never delivered, even once a later fsync makes the record durable, and not after a
restart either: the client, told of the failure, sends it again."""

import asyncio

import pytest

from tidemq.broker import Broker, BrokerConfig, BrokerError, Code, Publish, ReceiveRequest
from tidemq.broker.clock import VirtualClock
from tidemq.store import MessageStore, StoreConfig


def open_broker(directory, clock):
    store = MessageStore(directory, StoreConfig(segment_size=1 << 20, flush="sync", sync_flush_timeout_ms=300))
    return store, Broker(store, BrokerConfig(clock=clock))


def test_a_send_reported_failed_after_its_append_is_never_delivered(tmp_path):
    clock = VirtualClock()
    loop = asyncio.new_event_loop()
    store, broker = open_broker(tmp_path / "store", clock)
    broker_started = False

    def failing_flush():
        raise OSError(5, "Input/output error")

    async def send(body: bytes, message_id: str):
        nonlocal broker_started
        if not broker_started:
            broker.start(asyncio.get_running_loop())
            broker_started = True
        return await broker.send(Publish(topic="w", body=body, message_id=message_id))

    async def receive():
        req = ReceiveRequest(group="g", topic="w", client_id="c", filter_expression="*", batch_size=32,
                             invisible_ms=30_000, auto_renew=False, poll_ms=0)
        return [r.record.body for r in await broker.receive(req)]

    try:
        store.commit_log.flush = failing_flush  # the environment: the disk does not flush
        with pytest.raises(BrokerError) as failure:
            loop.run_until_complete(send(b"failed", "ID1"))
        assert failure.value.code == Code.MASTER_PERSISTENCE_TIMEOUT
        del store.commit_log.flush  # the disk recovers: the next fsync covers the failed send too
        loop.run_until_complete(send(b"retried", "ID1"))
        assert store.wait_dispatched()
        assert loop.run_until_complete(receive()) == [b"retried"]
        loop.run_until_complete(broker.close())
        store.close()

        store, broker = open_broker(tmp_path / "store", clock)
        broker_started = False
        loop.run_until_complete(send(b"after restart", "ID2"))
        assert store.wait_dispatched()
        assert loop.run_until_complete(receive()) == [b"after restart"]
        assert sum(store.max_offset("w", q) for q in range(8)) == 3  # stored, but withdrawn
    finally:
        loop.run_until_complete(broker.close())
        store.close()
        loop.close()
