"""The official Python SDK against a real server: SQL92 subscriptions, delay messages (in the
SDK's seconds and in milliseconds), recall, and delay messages across a SIGKILL."""

from __future__ import annotations

import time

import pytest
from rocketmq import FilterExpression, SimpleConsumer
from rocketmq.grpc_protocol import FilterType, MessageType
from tidemq.protocol.grpc import admin_call

from .server import ServerProcess
from .test_sdk import Clients, message, unique


@pytest.fixture
def clients(server):
    c = Clients(server)
    yield c
    c.close()


def receive_bodies(consumer, until: int | set[bytes], timeout: float = 20.0,
                   messages: dict | None = None) -> dict[bytes, float]:
    """Body -> wall time (ms) of receipt, acking each, until `until` bodies (a count, or the
    bodies themselves) or timeout; the messages by body into `messages` when given."""
    got: dict[bytes, float] = {}
    give_up = time.monotonic() + timeout

    def done() -> bool:
        return until <= got.keys() if isinstance(until, set) else len(got) >= until

    while not done() and time.monotonic() < give_up:
        for m in consumer.receive(32, 15):
            got.setdefault(m.body, time.time() * 1000)
            if messages is not None:
                messages[m.body] = m
            consumer.ack(m)
    return got


def test_a_sql92_subscription_gets_exactly_the_matching_messages(server, clients):
    topic = unique("Sql")
    producer = clients.producer(topic)
    rows = [("red", 1), ("red", 5), ("blue", 7), ("red", 9), ("green", 2)]
    for i, (color, n) in enumerate(rows):
        producer.send(message(topic, f"m{i}".encode(), tag="t" if n % 2 else "u", color=color, n=str(n)))
    producer.send(message(topic, b"no-props"))
    expression = FilterExpression("color = 'red' AND n > 2 AND TAGS = 't'", FilterType.SQL)
    consumer = clients.simple(unique("SqlG"), {topic: expression}, await_duration=1)
    got = receive_bodies(consumer, 2)
    time.sleep(0.5)
    got.update(receive_bodies(consumer, 1, timeout=1))
    assert sorted(got) == [b"m1", b"m3"]


def test_a_bad_sql92_expression_fails_the_receive(server, clients):
    topic = unique("SqlBad")
    clients.producer(topic).send(message(topic, b"x"))
    consumer = clients.simple(unique("SqlBadG"), {topic: FilterExpression("n >", FilterType.SQL)}, await_duration=1)
    with pytest.raises(Exception) as err:
        consumer.receive(1, 15)
    assert "40010" in str(err.value) or "ILLEGAL_FILTER_EXPRESSION" in str(err.value)


def test_delay_messages_in_seconds_and_in_milliseconds_arrive_no_earlier_than_their_time(server, clients):
    topic = unique("Delay")
    admin_call(server.address, "CreateTopic", name=topic, queue_nums=2, message_type="DELAY")
    producer = clients.producer(topic)
    due_s = int(time.time()) + 2  # what the SDK's example does: seconds
    due_ms = int(time.time() * 1000) + 1_500  # what its documentation says: milliseconds
    for body, due in ((b"seconds", due_s), (b"millis", due_ms)):
        m = message(topic, body)
        m.delivery_timestamp = due
        receipt = producer.send(m)
        assert receipt.recall_handle
    consumer = clients.simple(unique("DelayG"), {topic: FilterExpression()}, await_duration=1)
    messages: dict = {}
    got = receive_bodies(consumer, 2, messages=messages)
    assert set(got) == {b"seconds", b"millis"}
    assert got[b"seconds"] >= due_s * 1000 and got[b"millis"] >= due_ms
    assert messages[b"millis"].delivery_timestamp == due_ms  # delivered as a DELAY message with its time
    assert messages[b"millis"].message_type == MessageType.DELAY


def test_a_recalled_delay_message_is_never_delivered(server, clients):
    topic = unique("Recall")
    admin_call(server.address, "CreateTopic", name=topic, queue_nums=2, message_type="DELAY")
    producer = clients.producer(topic)
    receipts = {}
    due = int(time.time() * 1000) + 1_500
    for body in (b"recalled", b"kept"):
        m = message(topic, body)
        m.delivery_timestamp = due
        receipts[body] = producer.send(m)
    assert producer.recall_message(topic, receipts[b"recalled"].recall_handle) == receipts[b"recalled"].message_id
    consumer = clients.simple(unique("RecallG"), {topic: FilterExpression()}, await_duration=1)
    got = receive_bodies(consumer, 1)
    got.update(receive_bodies(consumer, 2, timeout=2))
    assert set(got) == {b"kept"}
    with pytest.raises(Exception):  # delivered: too late to recall
        producer.recall_message(topic, receipts[b"kept"].recall_handle)


def test_delay_messages_survive_a_sigkill(tmp_path):
    server = ServerProcess(tmp_path / "store", "--flush", "sync").start()
    clients = Clients(server)
    try:
        topic = "KillDelay"
        admin_call(server.address, "CreateTopic", name=topic, queue_nums=2, message_type="DELAY")
        producer = clients.producer(topic)
        now = int(time.time() * 1000)
        dues = {f"early{i}".encode(): now + 500 for i in range(3)}
        dues.update({f"late{i}".encode(): now + 4_000 for i in range(3)})
        for body, due in dues.items():
            m = message(topic, body)
            m.delivery_timestamp = due
            producer.send(m)
        consumer = clients.simple("KillDelayG", {topic: FilterExpression()}, await_duration=1)
        early = receive_bodies(consumer, 3)
        assert set(early) == {b"early0", b"early1", b"early2"}
        clients.close()
        server.kill()
        server.start(same_port=True)
        clients = Clients(server)
        consumer = clients.simple("KillDelayG", {topic: FilterExpression()}, await_duration=1)
        late = receive_bodies(consumer, {b"late0", b"late1", b"late2"})  # early ones may come again
        assert {b"late0", b"late1", b"late2"} <= set(late)  # released again or not, none is lost
        assert all(at >= dues[body] for body, at in late.items() if body.startswith(b"late"))
    finally:
        clients.close()
        server.stop()
