"""Push consumers ask for auto-renew: the broker renews while the client is alive, so a slow
listener's message is not redelivered, and its original receipt handle still acks it."""

from __future__ import annotations

import threading

import pytest
from rocketmq import ConsumeResult, FilterExpression, MessageListener, Producer, PushConsumer

from .server import ServerProcess, wait_until
from .test_restart import group_progress
from .test_sdk import message, unique


@pytest.fixture(scope="module")
def quick_renew_server(tmp_path_factory):
    """Auto-renewed messages invisible for 2 s, renewed 1.5 s ahead, every 0.2 s."""
    s = ServerProcess(tmp_path_factory.mktemp("renew") / "store", "--auto-renew-invisible-time-ms", "2000",
                      "--renew-ahead-ms", "1500", "--renew-interval-ms", "200").start()
    yield s
    assert s.stop() == 0, s.log_text()


class SlowListener(MessageListener):
    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.attempts = []

    def consume(self, m):
        self.attempts.append((m.body, m.delivery_attempt))
        self.release.wait(30)  # holds the message well past its 2 s invisible time
        return ConsumeResult.SUCCESS


def test_slow_push_listener_keeps_its_message_and_acks_with_the_first_handle(quick_renew_server):
    server = quick_renew_server
    topic, group = unique("Renew"), unique("PG")
    release = threading.Event()
    listener = SlowListener(release)
    consumer = PushConsumer(server.config(), group, listener, {topic: FilterExpression()})
    producer = Producer(server.config(), (topic,))
    consumer.startup()
    producer.startup()
    try:
        producer.send(message(topic, b"slow"))
        wait_until(lambda: listener.attempts, what="the first delivery")
        # while the listener holds it, the broker keeps renewing: wait for several renewals
        start = _renewals(server)
        wait_until(lambda: _renewals(server) >= start + 3, what="three renewals")
        assert listener.attempts == [(b"slow", 1)]
        release.set()
        wait_until(lambda: group_progress(server.address, group, topic)["backlog"] == 0, what="the ack")
        assert listener.attempts == [(b"slow", 1)]
    finally:
        release.set()
        producer.shutdown()
        consumer.shutdown()


def _renewals(server) -> int:
    from tidemq.protocol.grpc import admin_call

    return admin_call(server.address, "Stats")["auto_renewals"]
