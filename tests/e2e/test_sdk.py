"""The official RocketMQ 5 Python SDK against a real tidemq server: produce, consume, ack, change
invisible time, tags, groups, long polling, push consumers with retries and dead letters."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, Producer, PushConsumer, SimpleConsumer
from tidemq.protocol.grpc import admin_call

from .server import wait_until


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def message(topic: str, body: bytes, tag: str | None = None, keys: tuple = (), **properties) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        for key in keys:  # the SDK's setter adds one key per assignment
            m.keys = key
    for k, v in properties.items():
        m.add_property(k, v)
    return m


class Clients:
    """Starts SDK clients and shuts them all down at the end of a test."""

    def __init__(self, server) -> None:
        self.server = server
        self.started = []

    def producer(self, *topics) -> Producer:
        p = Producer(self.server.config(), topics)
        p.startup()
        self.started.append(p)
        return p

    def simple(self, group: str, subscription: dict, await_duration: int = 2) -> SimpleConsumer:
        c = SimpleConsumer(self.server.config(), group, subscription, await_duration=await_duration)
        c.startup()
        self.started.append(c)
        return c

    def push(self, group: str, subscription: dict, listener) -> PushConsumer:
        c = PushConsumer(self.server.config(), group, listener, subscription)
        c.startup()
        self.started.append(c)
        return c

    def close(self) -> None:
        for c in reversed(self.started):
            c.shutdown()


@pytest.fixture
def clients(server):
    c = Clients(server)
    yield c
    c.close()


def receive_all(consumer: SimpleConsumer, count: int, invisible: int = 20, ack: bool = True) -> list:
    got = []
    give_up = time.monotonic() + 30
    while len(got) < count and time.monotonic() < give_up:
        batch = consumer.receive(32, invisible)
        for m in batch:
            if ack:
                consumer.ack(m)
        got.extend(batch)
    return got


def test_sync_and_async_sends_are_received_with_their_fields(server, clients):
    topic = unique("Fields")
    producer = clients.producer(topic)
    receipt = producer.send(message(topic, b"sync body", tag="TagA", keys=("k1", "k2"), color="red"))
    future = producer.send_async(message(topic, b"async body", tag="TagB"))
    async_receipt = future.result(timeout=10)
    assert receipt.message_id and async_receipt.message_id and receipt.message_id != async_receipt.message_id

    consumer = clients.simple(unique("G"), {topic: FilterExpression()})
    got = {m.message_id: m for m in receive_all(consumer, 2)}
    assert set(got) == {receipt.message_id, async_receipt.message_id}
    sync = got[receipt.message_id]
    assert sync.body == b"sync body" and sync.tag == "TagA" and sync.keys == {"k1", "k2"}
    assert sync.properties == {"color": "red"}
    assert sync.topic == topic and sync.delivery_attempt == 1
    assert sync.born_timestamp > 0 and sync.born_host
    assert not sync.corrupted
    assert got[async_receipt.message_id].body == b"async body"


def test_acked_messages_are_gone_and_unacked_ones_come_back_after_change_invisible_duration(server, clients):
    topic = unique("Ack")
    producer = clients.producer(topic)
    for i in range(4):
        producer.send(message(topic, b"m%d" % i))
    consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=1)
    got = receive_all(consumer, 4, ack=False)
    assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2", b"m3"]
    keep, retry = got[:2], got[2:]
    for m in keep:
        consumer.ack(m)
    for m in retry:
        consumer.change_invisible_duration(m, 1)
    again = receive_all(consumer, 2, ack=False)
    assert sorted(m.body for m in again) == sorted(m.body for m in retry)
    assert {m.delivery_attempt for m in again} == {2}
    for m in again:
        consumer.ack(m)
    assert consumer.receive(32, 20) == []


def test_two_consumers_of_one_group_share_and_two_groups_each_get_everything(server, clients):
    topic = unique("Share")
    producer = clients.producer(topic)
    sent = {producer.send(message(topic, b"m%d" % i)).message_id for i in range(20)}
    group = unique("G")
    a = clients.simple(group, {topic: FilterExpression()}, await_duration=1)
    b = clients.simple(group, {topic: FilterExpression()}, await_duration=1)
    first = a.receive(8, 20)  # held by a (not acked): b must not get them
    second = receive_all(b, 20 - len(first))
    for m in first:
        a.ack(m)
    ids = [m.message_id for m in first + second]
    assert 1 <= len(first) <= 8 and second
    assert sorted(ids) == sorted(sent)  # shared, none twice
    assert b.receive(32, 20) == []
    other = clients.simple(unique("H"), {topic: FilterExpression()})
    assert {m.message_id for m in receive_all(other, 20)} == sent


def test_tag_filters(server, clients):
    topic = unique("Tags")
    producer = clients.producer(topic)
    for tag in ("A", "B", "C", "A"):
        producer.send(message(topic, tag.encode(), tag=tag))
    producer.send(message(topic, b"untagged"))
    a_or_c = clients.simple(unique("G"), {topic: FilterExpression("A || C")}, await_duration=1)
    assert sorted(m.tag for m in receive_all(a_or_c, 3)) == ["A", "A", "C"]
    assert a_or_c.receive(32, 20) == []
    everything = clients.simple(unique("G"), {topic: FilterExpression("*")}, await_duration=1)
    assert len(receive_all(everything, 5)) == 5


def test_long_polling_receiver_is_woken_by_a_send(server, clients):
    topic = unique("Idle")
    producer = clients.producer(topic)
    consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=15)
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        waiting = pool.submit(consumer.receive, 32, 20)
        wait_until(lambda: _waiting_receives(server, topic) == 1, what="the receive to be held")
        producer.send(message(topic, b"wake up"))
        got = waiting.result(timeout=20)
        elapsed = time.monotonic() - started
    assert [m.body for m in got] == [b"wake up"]
    assert elapsed < 15  # answered by the arrival, not by the end of the 15 s poll
    consumer.ack(got[0])


def _waiting_receives(server, topic):
    (t,) = [t for t in admin_call(server.address, "ListTopics") if t["name"] == topic]
    return t["waiting_receives"]


class Listener(MessageListener):
    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.calls = []
        self.lock = threading.Lock()

    def consume(self, m):
        with self.lock:
            self.calls.append((m.body, m.delivery_attempt))
        return self.behaviour(m)


def test_push_consumer_success(server, clients):
    topic = unique("Push")
    group = unique("PG")
    listener = Listener(lambda m: ConsumeResult.SUCCESS)
    clients.push(group, {topic: FilterExpression()}, listener)
    producer = clients.producer(topic)
    futures = [producer.send_async(message(topic, b"m%d" % i)) for i in range(200)]
    for f in futures:
        f.result(timeout=30)
    wait_until(lambda: len(listener.calls) >= 200, what="200 consumed")
    assert sorted(listener.calls) == sorted((b"m%d" % i, 1) for i in range(200))
    wait_until(lambda: _backlog(server, group, topic) == 0, what="backlog 0")


def _backlog(server, group, topic):
    for g in admin_call(server.address, "ListGroups"):
        if g["name"] == group:
            for t in g["topics"]:
                if t["topic"] == topic:
                    return t["backlog"]
    return None


def _raise(m):
    raise RuntimeError("listener failure")


@pytest.mark.parametrize("behaviour", [lambda m: ConsumeResult.FAILURE, _raise], ids=["fails", "raises"])
def test_push_consumer_retries_with_backoff_then_dead_letters(server, clients, behaviour):
    topic = unique("Retry")
    group = unique("PG")
    admin_call(server.address, "CreateGroup", name=group, max_attempts=3, retry_backoff_ms=[0, 1000])
    listener = Listener(lambda m: ConsumeResult.SUCCESS if m.body == b"fine" else behaviour(m))
    clients.push(group, {topic: FilterExpression()}, listener)
    producer = clients.producer(topic)
    producer.send(message(topic, b"poison", tag="P", keys=("pk",)))
    producer.send(message(topic, b"fine"))
    wait_until(lambda: sum(1 for b, _ in listener.calls if b == b"poison") >= 3, what="3 attempts")
    assert sorted(a for b, a in listener.calls if b == b"poison") == [1, 2, 3]
    assert [a for b, a in listener.calls if b == b"fine"] == [1]

    dlq = clients.simple(unique("DLQReader"), {f"%DLQ%{group}": FilterExpression()}, await_duration=1)
    (dead,) = receive_all(dlq, 1)
    assert dead.body == b"poison" and dead.tag == "P" and dead.keys == {"pk"}
    wait_until(lambda: _backlog(server, group, topic) == 0, what="backlog 0")
    assert sum(1 for b, _ in listener.calls if b == b"poison") == 3


def test_namespaces_keep_same_named_topics_and_groups_apart(server):
    from rocketmq import ClientConfiguration, Credentials

    topic, group = unique("Spaced"), unique("G")
    started = []
    try:
        received = {}
        for namespace in ("tenantA", "tenantB"):
            config = ClientConfiguration(server.address, Credentials(), namespace=namespace)
            producer = Producer(config, (topic,))
            producer.startup()
            started.append(producer)
            producer.send(message(topic, namespace.encode()))
        for namespace in ("tenantA", "tenantB"):
            config = ClientConfiguration(server.address, Credentials(), namespace=namespace)
            consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=1)
            consumer.startup()
            started.append(consumer)
            got = receive_all(consumer, 1)
            assert consumer.receive(32, 20) == []
            received[namespace] = [(m.body, m.topic) for m in got]
        assert received == {"tenantA": [(b"tenantA", topic)], "tenantB": [(b"tenantB", topic)]}
        names = {t["name"] for t in admin_call(server.address, "ListTopics")}
        assert {f"tenantA%{topic}", f"tenantB%{topic}"} <= names
    finally:
        for client in reversed(started):
            client.shutdown()
