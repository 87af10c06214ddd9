"""The server restarted under live SDK clients, and killed with SIGKILL under sync flush: nothing
a client was told is stored is lost, unacked messages come back, acked ones do not."""

from __future__ import annotations

import contextlib
import threading
import time

from rocketmq import FilterExpression, Producer, SimpleConsumer
from tidemq.protocol.grpc import admin_call

from .server import ServerProcess, wait_until
from .test_sdk import message, unique


class SendLoop(threading.Thread):
    """Sends continuously; remembers the message ids the SDK reported as sent."""

    def __init__(self, producer: Producer, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer, self.topic = producer, topic
        self.sent: list[str] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            i += 1
            try:
                self.sent.append(self.producer.send(message(self.topic, b"msg-%d" % i)).message_id)
            except Exception:
                self.failures += 1
                time.sleep(0.05)  # pacing while the server is down, not a timing assertion

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def retrying(call, *args):
    """Call an SDK method, tolerating its channel still reconnecting after a restart."""
    give_up = time.monotonic() + 30
    while True:
        try:
            return call(*args)
        except Exception:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.1)  # reconnect pacing


def receive(consumer: SimpleConsumer, count: int = 32, invisible: int = 30) -> list:
    return retrying(consumer.receive, count, invisible)


def drain(consumer: SimpleConsumer, want: set[str], give_up_s: float = 60) -> set[str]:
    seen: set[str] = set()
    give_up = time.monotonic() + give_up_s
    while not want <= seen and time.monotonic() < give_up:
        for m in receive(consumer):
            seen.add(m.message_id)
            consumer.ack(m)
    return seen


def visible(address: str, topic: str) -> int:
    """How many entries of `topic` readers can see (dispatched), over all its queues."""
    for t in admin_call(address, "ListTopics"):
        if t["name"] == topic:
            return sum(q["max_offset"] - q["min_offset"] for q in t["queues"])
    return 0


def group_progress(address: str, group: str, topic: str) -> dict:
    for g in admin_call(address, "ListGroups"):
        for t in g["topics"]:
            if g["name"] == group and t["topic"] == topic:
                return t
    raise AssertionError(f"no progress for {group} on {topic}")


@contextlib.contextmanager
def sending(server: ServerProcess, prefix: str):
    """A producer sending in a loop and a simple consumer, on a fresh topic and group; everything
    (the server included) is stopped on the way out."""
    topic, group = unique(prefix), unique("G")
    producer = Producer(server.config(), (topic,))
    consumer = SimpleConsumer(server.config(), group, {topic: FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    loop = SendLoop(producer, topic)
    try:
        loop.start()
        yield topic, group, consumer, loop
    finally:
        loop.stopping.set()
        consumer.shutdown()
        producer.shutdown()
        server.stop()


def test_restart_mid_stream_loses_nothing_and_unacked_handles_survive(tmp_path):
    server = ServerProcess(tmp_path / "store").start()
    with sending(server, "Restart") as (topic, group, consumer, loop):
        wait_until(lambda: len(loop.sent) >= 50, what="50 sends")
        # a receive answers with what is visible then: wait until dispatch (which may trail the
        # acknowledged sends on a loaded machine) has made five visible, so the batch is full
        wait_until(lambda: visible(server.address, topic) >= 5, what="5 visible entries")
        held = consumer.receive(5, 60)  # delivered, not acked across the restart
        assert len(held) == 5
        assert server.stop() == 0
        assert not (server.store / "abort").exists()
        sent_before = len(loop.sent)
        server.start(same_port=True)
        wait_until(lambda: len(loop.sent) >= sent_before + 50, timeout=60, what="sends to resume")
        loop.stop()
        assert group_progress(server.address, group, topic)["queues"] and \
            sum(q["in_flight"] for q in group_progress(server.address, group, topic)["queues"]) == 5
        for m in held:  # the pre-restart receipt handles are still valid
            retrying(consumer.change_invisible_duration, m, 1)
        held_ids = {m.message_id for m in held}
        seen = drain(consumer, set(loop.sent))
        assert set(loop.sent) <= seen
        assert held_ids <= seen
        assert group_progress(server.address, group, topic)["backlog"] == 0


def test_sigkill_under_sync_flush_loses_no_acknowledged_send(tmp_path):
    server = ServerProcess(tmp_path / "store", "--flush", "sync").start()
    with sending(server, "Kill") as (topic, group, consumer, loop):
        wait_until(lambda: len(loop.sent) >= 40, what="40 sends")
        first = consumer.receive(10, 60)
        acked = {m.message_id for m in first[:4]}
        for m in first[:4]:
            consumer.ack(m)
        unacked = {m.message_id for m in first[4:]}
        server.kill()
        loop.stop()
        assert loop.sent, "no send succeeded"
        server.start(same_port=True)
        progress = group_progress(server.address, group, topic)
        assert sum(q["in_flight"] for q in progress["queues"]) == len(unacked)

        again = set()  # the same group: neither the acked nor the still-invisible come back now
        give_up = time.monotonic() + 30
        expected_now = set(loop.sent) - acked - unacked
        while not expected_now <= again and time.monotonic() < give_up:
            for m in receive(consumer, 32, 60):
                again.add(m.message_id)
                consumer.ack(m)
        assert expected_now <= again
        assert not (again & acked) and not (again & unacked)

        fresh = SimpleConsumer(server.config(), unique("Fresh"), {topic: FilterExpression()}, await_duration=1)
        fresh.startup()
        try:
            assert set(loop.sent) <= drain(fresh, set(loop.sent))
        finally:
            fresh.shutdown()
