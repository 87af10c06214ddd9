"""`tidemq topic ...` and `tidemq group ...` against a running broker (--server) and a stopped
broker's store (--store)."""

from __future__ import annotations

import json

from rocketmq import FilterExpression, Producer, SimpleConsumer

from .server import ServerProcess, tidemq
from .test_sdk import message, unique

FLUSH_MODES = ("async",)  # the admin commands and snippets do not depend on the flush policy


def test_topic_and_group_commands_against_a_running_broker(server):
    out = tidemq("topic", "create", "AdminOrders", "--queues", "4", "--type", "FIFO", "--server", server.address)
    assert out.returncode == 0, out.stderr
    assert "AdminOrders: 4 queues, FIFO" in out.stdout
    listed = json.loads(tidemq("topic", "list", "--server", server.address, "--json").stdout)
    (orders,) = [t for t in listed if t["name"] == "AdminOrders"]
    assert orders["message_type"] == "FIFO" and len(orders["queues"]) == 4
    assert "AdminOrders/3  min 0  max 0" in tidemq("topic", "list", "--server", server.address).stdout

    out = tidemq("group", "create", "AdminGroup", "--max-attempts", "5", "--server", server.address)
    assert out.returncode == 0 and "max attempts 5" in out.stdout
    bad = tidemq("topic", "create", "bad name", "--server", server.address)
    assert bad.returncode == 2 and "ILLEGAL_TOPIC" in bad.stderr
    shrink = tidemq("topic", "create", "AdminOrders", "--queues", "2", "--server", server.address)
    assert shrink.returncode == 2 and "BAD_REQUEST" in shrink.stderr
    nobody = tidemq("topic", "list", "--server", "127.0.0.1:1")
    assert nobody.returncode == 1 and "cannot reach a broker at 127.0.0.1:1" in nobody.stderr


def test_group_list_shows_exact_backlog_per_queue(server):
    topic, group = unique("Backlog"), unique("G")
    assert tidemq("topic", "create", topic, "--queues", "2", "--server", server.address).returncode == 0
    producer = Producer(server.config(), (topic,))
    consumer = SimpleConsumer(server.config(), group, {topic: FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        for i in range(6):
            producer.send(message(topic, b"m%d" % i))
        got = []
        while len(got) < 6:
            got += consumer.receive(32, 30)
        for m in got[:4]:
            consumer.ack(m)
    finally:
        consumer.shutdown()
        producer.shutdown()
    groups = json.loads(tidemq("group", "list", "--server", server.address, "--json").stdout)
    (g,) = [g for g in groups if g["name"] == group]
    (t,) = g["topics"]
    assert sum(q["in_flight"] for q in t["queues"]) == 2
    assert sum(q["max_offset"] for q in t["queues"]) == 6
    assert t["backlog"] == sum(q["max_offset"] - q["consumed_offset"] for q in t["queues"])
    assert 2 <= t["backlog"] <= 4  # the two unacked, plus acked ones above them in their queue
    text = tidemq("group", "list", "--server", server.address).stdout
    assert f"{topic}/0  consumed" in text


def test_admin_commands_on_a_stopped_brokers_store(tmp_path):
    s = ServerProcess(tmp_path / "store").start()
    topic, group = unique("Offline"), unique("G")
    producer = Producer(s.config(), (topic,))
    consumer = SimpleConsumer(s.config(), group, {topic: FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        for i in range(3):
            producer.send(message(topic, b"m%d" % i))
        got = []
        while len(got) < 3:
            got += consumer.receive(32, 30)
        for m in got:
            consumer.ack(m)
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert s.stop() == 0
    store = str(tmp_path / "store")
    groups = json.loads(tidemq("group", "list", "--store", store, "--json").stdout)
    (g,) = [g for g in groups if g["name"] == group]
    assert g["topics"][0]["backlog"] == 0
    assert sum(q["consumed_offset"] for q in g["topics"][0]["queues"]) == 3
    assert tidemq("topic", "create", "MadeOffline", "--queues", "3", "--store", store).returncode == 0
    assert tidemq("group", "create", "OfflineGroup", "--store", store).returncode == 0
    s.start()
    from tidemq.protocol.grpc import admin_call

    try:
        assert [t["queue_nums"] for t in admin_call(s.address, "ListTopics") if t["name"] == "MadeOffline"] == [3]
        assert "OfflineGroup" in {g["name"] for g in admin_call(s.address, "ListGroups")}
    finally:
        assert s.stop() == 0


def test_a_poison_message_is_dead_lettered_after_its_consumers_left(server):
    from tidemq.protocol.grpc import admin_call

    from .server import wait_until

    topic, group = unique("Poison"), unique("G")
    assert tidemq("group", "create", group, "--max-attempts", "1", "--server", server.address).returncode == 0
    producer = Producer(server.config(), (topic,))
    consumer = SimpleConsumer(server.config(), group, {topic: FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        producer.send(message(topic, b"poison"))
        got = []
        while not got:
            got = consumer.receive(1, 30)
        consumer.change_invisible_duration(got[0], 1)  # its last attempt ends in a second, unacked
    finally:
        consumer.shutdown()  # nobody of the group receives again
        producer.shutdown()

    def dead_letters():
        (g,) = [g for g in admin_call(server.address, "ListGroups") if g["name"] == group]
        return g["dead_letters"]

    wait_until(lambda: dead_letters() == 1, what="the message in the dead-letter queue")
    text = tidemq("group", "list", "--server", server.address).stdout
    assert f"{group}  max attempts 1  dead letters 1" in text
    assert f"{topic}  backlog 0" in text

