"""Priority messages (RIP-80) with the official Python SDK against a real server: a random-priority
backlog received highest first within and across batches, a high message overtaking a draining
low backlog, a failed high message redelivered before every lower one, push consumers, tag
filters, type checks, and priorities that survive a restart and a SIGKILL."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid

from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from tidemq.protocol.grpc import admin_call

from .server import ServerProcess, tidemq, wait_until
from .test_restart import receive, retrying, visible
from .test_sdk import Clients, clients, message, unique  # noqa: F401 (fixture)
from .test_validation import META, send_request, stub  # noqa: F401 (fixture)


def priority_message(topic: str, priority: int, body: bytes | None = None, tag: str | None = None):
    m = message(topic, body or b"p%d" % priority, tag=tag)
    m.priority = priority
    return m


def create_priority_topic(address: str, levels: int = 10) -> str:
    topic = unique("Prio")
    admin_call(address, "CreateTopic", name=topic, message_type="PRIORITY", priorities=levels)
    return topic


def send_all(producer, messages) -> list[str]:
    """Send concurrently (the SDK's own futures); the message ids in the order given."""
    futures = [producer.send_async(m) for m in messages]
    return [f.result(timeout=60).message_id for f in futures]


def send_batched(stub, topic: str, priorities: list[int], per_request: int = 500) -> list[str]:  # noqa: F811
    """Send priority messages (body: their index) many to a SendMessage call, as the SDK encodes
    one: the SDK sends one message a call, which takes minutes for a large backlog on a busy
    machine.  The message ids in order."""
    ids = []
    for start in range(0, len(priorities), per_request):
        request = svc.SendMessageRequest()
        for i in range(start, min(start + per_request, len(priorities))):
            one = send_request(topic=topic, body=b"%d" % i, message_id=f"01{uuid.uuid4().hex.upper()}",
                               message_type=pb.PRIORITY, priority=priorities[i])
            request.messages.extend(one.messages)
        response = stub.SendMessage(request, metadata=META, timeout=30)
        assert response.status.code == pb.OK, response.status
        ids.extend(entry.message_id for entry in response.entries)
    return ids


def test_a_random_priority_backlog_is_received_highest_first_within_and_across_batches(server, clients, stub):  # noqa: F811
    topic = create_priority_topic(server.address)
    rng = random.Random(43)
    priorities = [rng.randrange(10) for _ in range(10_000)]
    ids = send_batched(stub, topic, priorities)
    wait_until(lambda: visible(server.address, topic) == len(ids), timeout=60, what="the backlog to be visible")

    consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=1)
    batches = []
    while sum(len(b) for b in batches) < len(ids):
        batch = consumer.receive(32, 300)  # held invisible for the test's life: no acks needed
        assert batch, "the backlog ran dry early"
        batches.append(batch)
    received = [m for batch in batches for m in batch]
    assert sorted(m.message_id for m in received) == sorted(ids)
    assert all(m.priority == priorities[int(m.body)] for m in received)  # every delivery carries it
    order = [m.priority for m in received]
    assert order == sorted(order, reverse=True)  # within and across batches
    assert all(m.message_type == pb.PRIORITY for m in received[:10])
    by_level = {}
    for m in received:  # a level keeps the order it was sent in
        by_level.setdefault(m.priority, []).append(int(m.body))
    assert all(bodies == sorted(bodies) for bodies in by_level.values())


def test_a_high_message_sent_while_a_low_backlog_drains_is_delivered_next(server, clients):
    topic = create_priority_topic(server.address)
    producer = clients.producer(topic)
    send_all(producer, [priority_message(topic, 2) for _ in range(200)])
    wait_until(lambda: visible(server.address, topic) == 200, what="the backlog to be visible")
    consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=1)
    drained = 0
    for round_ in range(3):
        batch = consumer.receive(16, 60)
        assert [m.priority for m in batch] == [2] * 16
        for m in batch:
            consumer.ack(m)
        drained += len(batch)
        high_id = producer.send(priority_message(topic, 9, b"urgent%d" % round_)).message_id
        wait_until(lambda: visible(server.address, topic) == 201 + round_, what="the high message to be visible")
        first = consumer.receive(1, 60)
        assert [(m.message_id, m.priority) for m in first] == [(high_id, 9)]
        consumer.ack(first[0])


def test_a_failed_high_message_is_redelivered_before_any_lower_one_once_its_deadline_passes(server, clients):
    topic = create_priority_topic(server.address)
    producer = clients.producer(topic)
    high_id = producer.send(priority_message(topic, 8, b"high")).message_id
    send_all(producer, [priority_message(topic, 3, b"low%d" % i) for i in range(40)])
    wait_until(lambda: visible(server.address, topic) == 41, what="the backlog to be visible")
    consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=1)
    (high,) = consumer.receive(1, 30)
    assert high.message_id == high_id
    consumer.change_invisible_duration(high, 2)  # fails: back in 2 s
    deadline = time.monotonic() + 2
    batch = consumer.receive(4, 60)  # lower messages go while it is invisible
    if high_id not in {m.message_id for m in batch}:  # (unless the receive came after its deadline)
        assert [m.priority for m in batch] == [3] * 4
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.2)  # until its deadline has passed
        batch = consumer.receive(8, 60)
    assert batch[0].message_id == high_id and batch[0].priority == 8 and batch[0].delivery_attempt == 2
    assert [m.priority for m in batch[1:]] == [3] * (len(batch) - 1)


def test_push_consumers_get_the_highest_level_first_and_a_failed_message_keeps_its_level(server, clients):
    topic = create_priority_topic(server.address, levels=5)
    group = unique("G")
    admin_call(server.address, "CreateGroup", name=group, retry_backoff_ms=[1000])
    producer = clients.producer(topic)
    rng = random.Random(5)
    priorities = [rng.randrange(1, 5) for _ in range(300)]
    send_all(producer, [priority_message(topic, p, b"%d" % i) for i, p in enumerate(priorities)])
    wait_until(lambda: visible(server.address, topic) == 300, what="the backlog to be visible")

    consumed, lock, failed_once = [], threading.Lock(), []

    class Listener(MessageListener):
        def consume(self, m) -> ConsumeResult:
            with lock:
                if m.priority == 4 and not failed_once:
                    failed_once.append(m.message_id)
                    return ConsumeResult.FAILURE
                consumed.append((m.priority, m.message_id, m.delivery_attempt))
            return ConsumeResult.SUCCESS

    push = PushConsumer(server.config(), group, Listener(), {topic: FilterExpression()}, consumption_thread_count=1)
    push.startup()
    clients.started.append(push)
    wait_until(lambda: len(consumed) >= 300, timeout=60, what="all 300 consumed")
    # first deliveries come highest level first (one consumption thread keeps the delivered order)
    firsts = [p for p, message_id, _ in consumed if message_id not in failed_once]
    assert firsts == sorted(firsts, reverse=True)
    retried = [(p, attempt) for p, message_id, attempt in consumed if message_id in failed_once]
    assert retried == [(4, 2)]


def test_tag_filters_keep_the_priority_order(server, clients):
    topic = create_priority_topic(server.address)
    producer = clients.producer(topic)
    rng = random.Random(11)
    sent = [(rng.randrange(10), rng.choice(("red", "blue"))) for _ in range(400)]
    send_all(producer, [priority_message(topic, p, tag=tag) for p, tag in sent])
    wait_until(lambda: visible(server.address, topic) == 400, what="the backlog to be visible")
    consumer = clients.simple(unique("G"), {topic: FilterExpression("red")}, await_duration=1)
    want = sum(1 for _, tag in sent if tag == "red")
    got = []
    while len(got) < want:
        batch = consumer.receive(32, 300)
        assert batch
        got.extend(batch)
    assert {m.tag for m in got} == {"red"}
    order = [m.priority for m in got]
    assert order == sorted(order, reverse=True) and len(got) == want


def test_message_types_that_do_not_match_the_topic_get_the_proxy_codes(server, stub):  # noqa: F811
    topic = create_priority_topic(server.address, levels=3)
    plain = unique("Plain")
    admin_call(server.address, "CreateTopic", name=plain)

    def code(**kw):
        response = stub.SendMessage(send_request(**kw), metadata=META, timeout=5)
        return response.status.code

    assert code(topic=topic, message_type=pb.PRIORITY, priority=1) == pb.OK
    assert code(topic=topic, message_type=pb.PRIORITY, priority=99) == pb.OK  # counts as the top level
    assert code(topic=topic) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert code(topic=topic, message_type=pb.PRIORITY) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE  # no priority
    assert code(topic=plain, message_type=pb.PRIORITY, priority=1) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert code(topic=topic, message_type=pb.PRIORITY, priority=-1) == pb.BAD_REQUEST

    req = svc.QueryRouteRequest()
    req.topic.name = topic
    req.endpoints.scheme = pb.IPv4
    req.endpoints.addresses.add(host="127.0.0.1", port=server.port)
    route = stub.QueryRoute(req, metadata=META, timeout=5)
    assert [q.id for q in route.message_queues] == [0, 1, 2]
    assert all(list(q.accept_message_types) == [pb.PRIORITY] for q in route.message_queues)


def test_priorities_survive_a_restart_and_a_sigkill(tmp_path):
    server = ServerProcess(tmp_path / "store", "--flush", "sync", "--grace-seconds", "1").start()
    clients = Clients(server)  # noqa: F811
    try:
        topic = create_priority_topic(server.address)
        producer = clients.producer(topic)
        rng = random.Random(3)
        priorities = [rng.randrange(10) for _ in range(60)]
        ids = [producer.send(priority_message(topic, p, b"%d" % i)).message_id for i, p in enumerate(priorities)]
        consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=1)
        wait_until(lambda: visible(server.address, topic) == 60, what="the backlog to be visible")
        held = receive(consumer, 5, 60)  # the five highest, in flight across both stops
        assert [m.priority for m in held] == sorted(priorities, reverse=True)[:5]

        assert server.stop() == 0
        server.start(same_port=True)
        more_ids = [retrying(producer.send, priority_message(topic, 9, b"late%d" % i)).message_id for i in range(3)]
        server.kill()
        server.start(same_port=True)

        for m in held:  # failed: due again in a second (their handles survived both stops)
            retrying(consumer.change_invisible_duration, m, 1)
        time.sleep(1.5)  # past that deadline
        expected = {i: p for i, p in zip(ids, priorities)} | {i: 9 for i in more_ids}
        got = []
        while len(got) < len(expected):
            got.extend(m for m in receive(consumer, 32, 60) if m.message_id not in {x.message_id for x in got})
        assert {m.message_id: m.priority for m in got} == expected
        order = [m.priority for m in got]
        assert order == sorted(order, reverse=True)  # the held five came back at their levels
        assert {m.message_id for m in got if m.delivery_attempt == 2} == {m.message_id for m in held}
    finally:
        clients.close()
        server.stop()


def test_the_cli_creates_a_priority_topic_with_its_levels(server):
    name = unique("CliPrio")
    created = tidemq("topic", "create", name, "--type", "PRIORITY", "--priorities", "4", "--server", server.address)
    assert created.returncode == 0, created.stderr
    assert f"topic {name}: 4 queues, PRIORITY (4 priority levels)" in created.stdout
    listed = tidemq("topic", "list", "--server", server.address, "--json")
    (topic,) = [t for t in json.loads(listed.stdout) if t["name"] == name]
    assert topic["priorities"] == 4 and len(topic["queues"]) == 4
    refused = tidemq("topic", "create", unique("CliPrio"), "--type", "NORMAL", "--priorities", "4", "--server", server.address)
    assert refused.returncode != 0 and "PRIORITY topics" in refused.stderr
