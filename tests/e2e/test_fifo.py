"""FIFO with the official Python SDK against a real server: per message group, order holds
across four simple consumers that fail at random (nack by change invisible duration) and a broker
restart; the FIFO push consumer retries locally and forwards to the dead-letter queue without
breaking its group's order.  (A head never acked coming back after its invisible time, at least
10 s here, is tested in virtual time in tests/broker/test_fifo.py.)"""

from __future__ import annotations

import random
import threading
import time

from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, Producer, SimpleConsumer
from tidemq.protocol.grpc import admin_call

from .server import ServerProcess, tidemq, wait_until
from rocketmq.grpc_protocol import Code
from rocketmq.v5.exception import BadRequestException

from .test_restart import retrying
from .test_sdk import Clients, receive_all, unique


def fifo_message(topic: str, group: str, seq: int) -> Message:
    m = Message()
    m.topic = topic
    m.body = f"{group}:{seq}".encode()
    m.message_group = group
    return m


class OrderedConsumer(threading.Thread):
    """A simple consumer of the FIFO group that fails at random; records every delivery."""

    def __init__(self, consumer: SimpleConsumer, seed: int, log: list, lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.consumer, self.random, self.log, self.lock = consumer, random.Random(seed), log, lock
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                batch = self.consumer.receive(16, 10)
            except Exception:  # the broker is restarting
                time.sleep(0.1)  # reconnect pacing
                continue
            with self.lock:  # in the order of delivery: a slow settle below must not reorder the log
                for m in batch:
                    group, seq = m.body.decode().split(":")
                    self.log.append((group, int(seq), m.delivery_attempt, m.message_group))
            for m in batch:
                if self.random.random() < 0.2:  # a nack: back at once
                    settle(self.consumer.change_invisible_duration, m, 0)
                else:
                    settle(self.consumer.ack, m)


def settle(call, *args) -> None:
    """Ack or nack, again after a restart (the handle outlives it); INVALID_RECEIPT_HANDLE means
    the broker took it before going down (or its deadline passed: the message comes back)."""
    give_up = time.monotonic() + 30
    while True:
        try:
            call(*args)
            return
        except BadRequestException as exc:
            if exc.code == Code.INVALID_RECEIPT_HANDLE:
                return
        except Exception:
            if time.monotonic() > give_up:
                raise
        time.sleep(0.1)  # reconnect pacing


def check_order(log: list, groups: int, per_group: int) -> None:
    """Per message group: deliveries go 0, 1, ... with repeats only of the latest message (a
    retry); the next one never comes while an earlier one is in flight or waits for retry."""
    by_group: dict[str, list[int]] = {}
    for group, seq, _, message_group in log:
        assert message_group == group
        by_group.setdefault(group, []).append(seq)
    assert len(by_group) == groups
    for group, seqs in by_group.items():
        for before, after in zip(seqs, seqs[1:]):
            assert after in (before, before + 1), f"{group}: {before} then {after} in {seqs}"
        assert seqs[0] == 0 and seqs[-1] == per_group - 1, seqs


def test_order_holds_across_four_consumers_with_failures_and_a_restart(tmp_path):
    server = ServerProcess(tmp_path / "store").start()
    clients = Clients(server)
    consumers: list[OrderedConsumer] = []
    try:
        topic, group, groups, per_group = unique("Fifo"), unique("FG"), 6, 12
        assert tidemq("topic", "create", topic, "--type", "FIFO", "--queues", "2", "--server", server.address).returncode == 0
        assert tidemq("group", "create", group, "--fifo", "--server", server.address).returncode == 0
        producer = clients.producer(topic)
        for seq in range(per_group):
            for g in range(groups):
                producer.send(fifo_message(topic, f"g{g}", seq))
        log, lock = [], threading.Lock()
        for i in range(4):
            consumer = clients.simple(group, {topic: FilterExpression()}, await_duration=1)
            consumers.append(OrderedConsumer(consumer, seed=i, log=log, lock=lock))
        for c in consumers:
            c.start()

        def delivered() -> int:
            with lock:
                return len({(g, s) for g, s, _, _ in log})

        wait_until(lambda: delivered() >= groups * per_group // 2, timeout=60, what="half delivered")
        server.stop()
        server.start(same_port=True)
        wait_until(lambda: _backlog(server, group, topic) == 0, timeout=90, what="everything acked")
        for c in consumers:
            c.stopping.set()
        for c in consumers:
            c.join(30)
        check_order(log, groups, per_group)
        assert any(attempt > 1 for _, _, attempt, _ in log)  # the failures did happen
    finally:
        for c in consumers:
            c.stopping.set()
        clients.close()
        assert server.stop() == 0, server.log_text()


def _backlog(server: ServerProcess, group: str, topic: str) -> int | None:
    try:
        groups = admin_call(server.address, "ListGroups")
    except Exception:
        return None
    for g in groups:
        for t in g["topics"]:
            if g["name"] == group and t["topic"] == topic:
                return t["backlog"]
    return None


class FailingListener(MessageListener):
    def __init__(self, poison: bytes) -> None:
        self.poison = poison
        self.calls: list[bytes] = []
        self.lock = threading.Lock()

    def consume(self, message) -> ConsumeResult:
        with self.lock:
            self.calls.append(message.body)
        return ConsumeResult.FAILURE if message.body == self.poison else ConsumeResult.SUCCESS


def test_push_consumer_fifo_retries_locally_then_forwards_to_dead_letters_in_order(server):
    clients = Clients(server)
    try:
        topic, group = unique("FifoPush"), unique("FPG")
        admin_call(server.address, "CreateTopic", name=topic, queue_nums=4, message_type="FIFO")
        admin_call(server.address, "CreateGroup", name=group, max_attempts=3, retry_backoff_ms=[10, 10], fifo=True)
        producer: Producer = clients.producer(topic)
        for seq in range(5):
            for g in ("a", "b"):
                producer.send(fifo_message(topic, g, seq))
        listener = FailingListener(poison=b"a:2")
        clients.push(group, {topic: FilterExpression()}, listener)
        wait_until(lambda: len(listener.calls) >= 12, what="every message consumed")
        retrying(lambda: wait_until(lambda: _backlog(server, group, topic) == 0, what="backlog 0"))
        with listener.lock:
            a_calls = [c.decode() for c in listener.calls if c.startswith(b"a:")]
            b_calls = [c.decode() for c in listener.calls if c.startswith(b"b:")]
        assert a_calls == ["a:0", "a:1", "a:2", "a:2", "a:2", "a:3", "a:4"]  # 3 local attempts, then on
        assert b_calls == [f"b:{i}" for i in range(5)]
        dlq = clients.simple(unique("DLQReader"), {f"%DLQ%{group}": FilterExpression()}, await_duration=1)
        (dead,) = receive_all(dlq, 1)
        assert dead.body == b"a:2" and dead.message_group == "a"
    finally:
        clients.close()
