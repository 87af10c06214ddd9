"""Lite topics (RIP-83) with the official Python SDK 5.1.2 against a real server: lite simple and
push consumers get exactly the lite topics they subscribed (the SDK's just-subscribed name arrives
as single characters and is served at once), acks and retries name the lite topic, the admin
lists lite topics, and subscriptions survive a restart; a RIP-28 light queue is received by a
plain SimpleConsumer.  One server (the subject does not depend on the flush policy)."""

from __future__ import annotations

import json
import threading

from google.protobuf.duration_pb2 import Duration
from rocketmq import (
    ConsumeResult,
    FilterExpression,
    LitePushConsumer,
    LiteSimpleConsumer,
    MessageListener,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.v5.exception import LiteSubscriptionQuotaExceededException

from tidemq.protocol.grpc import admin_call
from tidemq.store import Message, MessageStore

from .server import tidemq, wait_until
from .test_restart import receive, retrying
from .test_sdk import clients, message, unique  # noqa: F401 (fixture)
from .test_validation import stub  # noqa: F401 (fixture)

FLUSH_MODES = ("sync",)


def lite_message(topic: str, lite_topic: str, body: bytes):
    m = message(topic, body)
    m.lite_topic = lite_topic
    return m


def lite_topic_and_group(address: str) -> tuple[str, str]:
    topic, group = unique("Lite"), unique("LG")
    admin_call(address, "CreateTopic", name=topic, message_type="LITE", queue_nums=2)
    admin_call(address, "CreateGroup", name=group, lite_bind_topic=topic, retry_backoff_ms=[1000])
    return topic, group


def lite_simple(clients, topic: str, group: str, *lite_topics: str) -> LiteSimpleConsumer:  # noqa: F811
    consumer = LiteSimpleConsumer(topic, clients.server.config(), group, await_duration=1)
    consumer.startup()
    clients.started.append(consumer)
    for name in lite_topics:
        subscribe(consumer, name)
    return consumer


def subscribe(consumer, name: str) -> None:
    """`subscribe_lite` (5.1.2 sends the name as single characters), once the client has the
    server's settings: its startup does not wait for them, and until they come its quota is 0."""

    def subscribed() -> bool:
        try:
            consumer.subscribe_lite(name)
        except LiteSubscriptionQuotaExceededException:
            return False
        return True

    wait_until(subscribed, what="the client's settings with its lite subscription quota")


def take(consumer, count: int, ack: bool = True) -> list:
    got: list = []
    for _ in range(count * 4 + 10):
        if len(got) >= count:
            break
        for m in receive(consumer, 32, 20):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def send_lite(producer, topic: str, per_lite: dict[str, int]) -> dict[str, set[str]]:
    ids: dict[str, set[str]] = {}
    for name, count in per_lite.items():
        for i in range(count):
            sent = retrying(producer.send, lite_message(topic, name, b"%s-%d" % (name.encode(), i)))
            ids.setdefault(name, set()).add(sent.message_id)
    return ids


def test_lite_simple_consumers_receive_exactly_the_lite_topics_they_subscribed(server, clients):  # noqa: F811
    topic, group = lite_topic_and_group(server.address)
    one = lite_simple(clients, topic, group, "room-1", "room-2")
    two = lite_simple(clients, topic, group, "room-3")
    producer = clients.producer(topic)
    ids = send_lite(producer, topic, {"room-1": 3, "room-2": 2, "room-3": 4, "room-4": 2})
    got_one, got_two = take(one, 5), take(two, 4)
    assert {m.message_id for m in got_one} == ids["room-1"] | ids["room-2"]
    assert {m.message_id for m in got_two} == ids["room-3"]
    assert {(m.message_id in ids["room-1"], m.lite_topic) for m in got_one} == {(True, "room-1"), (False, "room-2")}
    assert {m.topic for m in got_one} == {topic} and {m.message_type for m in got_two} == {pb.LITE}
    assert receive(one) == [] and receive(two) == []  # room-4 is nobody's
    one.unsubscribe_lite("room-2")
    send_lite(producer, topic, {"room-2": 1})
    assert receive(one) == []


def test_a_lite_message_not_acked_comes_back_on_its_lite_topic(server, clients):  # noqa: F811
    topic, group = lite_topic_and_group(server.address)
    consumer = lite_simple(clients, topic, group, "orders-7")
    producer = clients.producer(topic)
    (sent,) = send_lite(producer, topic, {"orders-7": 1})["orders-7"]
    (first,) = take(consumer, 1, ack=False)
    consumer.change_invisible_duration(first, 1)  # carries lite_topic
    (again,) = take(consumer, 1, ack=False)
    assert (again.message_id, again.delivery_attempt, again.lite_topic) == (sent, 2, "orders-7")
    consumer.ack(again)
    assert receive(consumer) == []


def test_a_lite_push_consumer_consumes_its_lite_topic_and_retries_a_failure(server, clients):  # noqa: F811
    topic, group = lite_topic_and_group(server.address)
    consumed, lock, failed = [], threading.Lock(), []

    class Listener(MessageListener):
        def consume(self, m) -> ConsumeResult:
            with lock:
                if not failed:
                    failed.append(m.message_id)
                    return ConsumeResult.FAILURE
                consumed.append((m.message_id, m.lite_topic, m.delivery_attempt))
            return ConsumeResult.SUCCESS

    push = LitePushConsumer(server.config(), group, topic, Listener(), consumption_thread_count=1)
    push.startup()
    clients.started.append(push)
    subscribe(push, "sess-1")
    producer = clients.producer(topic)
    ids = send_lite(producer, topic, {"sess-1": 4, "sess-2": 3})
    wait_until(lambda: len(consumed) >= 4, timeout=60, what="the lite push consumer to consume sess-1")
    assert {message_id for message_id, _, _ in consumed} == ids["sess-1"]
    assert {lite_topic for _, lite_topic, _ in consumed} == {"sess-1"}
    assert [attempt for message_id, _, attempt in consumed if message_id in failed] == [2]


def test_lite_list_and_group_list_report_the_lite_topics(server, clients):  # noqa: F811
    topic, group = lite_topic_and_group(server.address)
    consumer = lite_simple(clients, topic, group, "dev-1")
    producer = clients.producer(topic)
    send_lite(producer, topic, {"dev-1": 3, "dev-2": 1, "other": 1})
    take(consumer, 3)
    out = tidemq("lite", "list", topic, "--prefix", "dev", "--server", server.address, "--json")
    listing = json.loads(out.stdout)
    rows = {t["lite_topic"]: t for t in listing["lite_topics"]}
    assert sorted(rows) == ["dev-1", "dev-2"]
    assert rows["dev-1"]["subscribers"] == 1 and rows["dev-1"]["groups"][0]["backlog"] == 0
    assert rows["dev-2"]["subscribers"] == 0 and rows["dev-2"]["groups"][0]["backlog"] == 1
    (listed,) = [g for g in admin_call(server.address, "ListGroups") if g["name"] == group]
    assert (listed["lite_bind_topic"], listed["light_queues"], listed["topics"]) == (topic, 1, [])  # dev-1 only
    inspect = tidemq("store", "inspect", str(server.store)).stdout
    (line,) = [line for line in inspect.splitlines() if line.startswith("light queues: ")]
    assert int(line.split()[2]) >= 3  # this test's three, and earlier tests'


def test_lite_subscriptions_survive_a_restart_and_a_light_queue_serves_a_simple_consumer(server, clients):  # noqa: F811
    """Runs last: it restarts the module's server."""
    topic, group = lite_topic_and_group(server.address)
    consumer = lite_simple(clients, topic, group, "keep-1")
    producer = clients.producer(topic)
    server.stop()
    with MessageStore(server.store) as store:  # a RIP-28 producer's message, written while stopped
        store.put(Message(topic="Fanout", body=b"to-rooms", queue_id=0,
                          properties={"UNIQ_KEY": "RIP28-1", "INNER_MULTI_DISPATCH": "%LMQ%room-a,%LMQ%room-b"}))
    server.start(same_port=True)
    ids = send_lite(producer, topic, {"keep-1": 2, "keep-2": 2})  # retried while the channel reconnects
    got = take(consumer, 2)  # served before the client's next complete set (30 s)
    assert {m.message_id for m in got} == ids["keep-1"]

    simple = clients.simple(unique("SG"), {"%LMQ%room-a": FilterExpression()}, await_duration=1)
    (first,) = take(simple, 1, ack=False)
    assert (first.body, first.topic) == (b"to-rooms", "%LMQ%room-a")
    simple.change_invisible_duration(first, 1)
    (again,) = take(simple, 1, ack=False)
    assert again.delivery_attempt == 2
    simple.ack(again)
    assert receive(simple) == []


def test_sync_lite_subscription_over_grpc_takes_offset_options_and_refuses_bad_requests(server, clients, stub):  # noqa: F811
    topic, group = lite_topic_and_group(server.address)
    producer = clients.producer(topic)
    ids = [retrying(producer.send, lite_message(topic, "tail", b"t%d" % i)).message_id for i in range(3)]
    meta = (("x-mq-client-id", unique("raw-lite")), ("x-mq-language", "JAVA"))

    def sync(names, **option):
        request = svc.SyncLiteSubscriptionRequest(action=pb.PARTIAL_ADD, lite_topic_set=names)
        request.topic.name, request.group.name = topic, group
        if option:
            request.offset_option.CopyFrom(pb.OffsetOption(**option))
        return stub.SyncLiteSubscription(request, metadata=meta, timeout=5).status.code

    wait_until(lambda: [t["max_offset"] for t in admin_call(server.address, "ListLite", bind_topic=topic)["lite_topics"]] == [3],
               what="the lite topic's three messages dispatched")
    assert sync(["tail"], tail_n=1) == pb.OK
    request = svc.ReceiveMessageRequest(batch_size=32, long_polling_timeout=Duration(seconds=1))
    request.group.name, request.message_queue.topic.name = group, topic
    request.invisible_duration.FromSeconds(30)
    got = [r.message for r in stub.ReceiveMessage(request, metadata=meta, timeout=10) if r.HasField("message")]
    assert [(m.system_properties.message_id, m.system_properties.lite_topic) for m in got] == [(ids[-1], "tail")]
    assert sync(["t"] * 2000) == pb.LITE_SUBSCRIPTION_QUOTA_EXCEEDED  # past the quota + 300 in one request
    assert sync(["a/b"]) == pb.ILLEGAL_LITE_TOPIC
    assert sync(["ok"], tail_n=-1) == pb.ILLEGAL_OFFSET
