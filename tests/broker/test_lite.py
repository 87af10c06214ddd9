"""Lite topics at the broker level, in virtual time: per-client subscription sets, pops from the
light queues of a client's set only, acks, retries and dead letters on a lite queue, quotas,
offset options, lite groups, restart, and RIP-28 light queues served to ordinary consumers."""

import asyncio

import pytest

from tidemq.broker import (
    Broker,
    BrokerConfig,
    BrokerError,
    Code,
    Publish,
    ReceiveRequest,
    admin,
    dead_letter_topic,
    lite,
)
from tidemq.broker.lite import (
    COMPLETE_ADD,
    COMPLETE_REMOVE,
    PARTIAL_ADD,
    PARTIAL_REMOVE,
    OffsetOption,
)
from tidemq.store import Message, MessageStore, StoreConfig

from .conftest import Harness


def lite_setup(harness, topic="B", group="G"):
    admin.create_topic(harness.broker, topic, queue_nums=2, message_type="LITE")
    admin.create_group(harness.broker, group, lite_bind_topic=topic, max_attempts=3)


def send(harness, lite_topic, body, topic="B"):
    return harness.send(topic, body, message_type="LITE", lite_topic=lite_topic)


def sync(harness, client, action, names, group="G", topic="B", **kw):
    harness.broker.lite.sync(client, group, topic, action, names, **kw)


def bodies(received):
    return sorted(r.record.body for r in received)


def drain(harness, client, group="G", topic="B"):
    got = []
    while batch := harness.receive(group, topic, client_id=client):
        got.extend(batch)
    return got


def test_each_client_receives_the_lite_topics_it_subscribed_and_no_others(harness):
    lite_setup(harness)
    sync(harness, "c1", PARTIAL_ADD, ["a"])
    sync(harness, "c1", PARTIAL_ADD, ["b"])
    sync(harness, "c2", PARTIAL_ADD, ["c"])
    for name in "abcd":
        for i in range(3):
            send(harness, name, f"{name}{i}".encode())
    one = drain(harness, "c1")
    assert bodies(one) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
    assert {r.record.properties[lite.PROPERTY_LITE_TOPIC] for r in one} == {"a", "b"}
    assert {r.queue_topic for r in one} == {"%LMQ%$B$a", "%LMQ%$B$b"}
    assert bodies(drain(harness, "c2")) == [b"c0", b"c1", b"c2"]
    assert drain(harness, "c3") == []  # subscribed nothing
    # each message is stored once: the light queue's unit points at the bind topic's record
    store = harness.store
    (unit,) = store.read_units("%LMQ%$B$d", 0, 0, 1)
    assert store.read_unit(unit).topic == "B"
    assert store.max_offset("%LMQ%$B$d", 0) == 3
    assert sum(store.max_offset("B", q) for q in range(2)) == 12


def test_removing_a_lite_topic_stops_its_delivery_and_a_complete_add_replaces_the_set(harness):
    lite_setup(harness)
    sync(harness, "c1", COMPLETE_ADD, ["a", "b"])
    sync(harness, "c1", PARTIAL_REMOVE, ["a"])
    send(harness, "a", b"a0")
    send(harness, "b", b"b0")
    assert bodies(drain(harness, "c1")) == [b"b0"]
    sync(harness, "c1", COMPLETE_ADD, ["a"])
    send(harness, "b", b"b1")
    assert bodies(drain(harness, "c1")) == [b"a0"]  # b1 is not its any more
    sync(harness, "c1", COMPLETE_REMOVE, [])
    send(harness, "a", b"a1")
    assert drain(harness, "c1") == []
    assert harness.broker.lite.topics_of("c1") == []


def test_an_older_version_of_the_set_does_not_replace_a_newer_one(harness):
    lite_setup(harness)
    sync(harness, "c1", COMPLETE_ADD, ["a", "b"], version=5)
    sync(harness, "c1", COMPLETE_ADD, ["x"], version=4)
    assert harness.broker.lite.topics_of("c1") == ["a", "b"]
    sync(harness, "c1", COMPLETE_ADD, ["x"], version=6)
    assert harness.broker.lite.topics_of("c1") == ["x"]


def test_ack_change_invisible_and_retries_work_on_the_lite_topics_queue(harness):
    lite_setup(harness)
    sync(harness, "c1", PARTIAL_ADD, ["a"])
    send(harness, "a", b"m0")
    send(harness, "a", b"m1")
    first, second = harness.receive("G", "B", client_id="c1", invisible_ms=10_000)
    queue = lite.queue_of("B", "a")
    harness.broker.ack("G", queue, first.receipt_handle)
    with pytest.raises(BrokerError) as refused:  # the bind topic itself holds no delivery of it
        harness.broker.ack("G", "B", second.receipt_handle)
    assert refused.value.code == Code.INVALID_RECEIPT_HANDLE
    handle = harness.broker.change_invisible("G", queue, second.receipt_handle, 20_000)
    harness.clock.advance(15_000)
    assert harness.receive("G", "B", client_id="c1") == []
    harness.clock.advance(6_000)
    (again,) = harness.receive("G", "B", client_id="c1")
    assert again.record.body == b"m1" and again.delivery_attempt == 2
    with pytest.raises(BrokerError):
        harness.broker.ack("G", queue, handle)  # superseded by the redelivery
    harness.broker.ack("G", queue, again.receipt_handle)
    harness.clock.advance(60_000)
    assert harness.receive("G", "B", client_id="c1") == []


def test_a_lite_message_past_its_attempts_goes_to_the_dead_letter_queue_once(harness):
    lite_setup(harness)
    sync(harness, "c1", PARTIAL_ADD, ["a"])
    send(harness, "a", b"doomed")
    for attempt in (1, 2, 3):
        (got,) = harness.receive("G", "B", client_id="c1", invisible_ms=10_000)
        assert got.delivery_attempt == attempt
        harness.clock.advance(11_000)
    harness.broker.revive(harness.clock())
    harness.run(harness.broker.settle())
    harness.store.wait_dispatched()
    dlq = dead_letter_topic("G")
    (unit,) = harness.store.read_units(dlq, 0, 0, 10)
    dead = harness.store.read_unit(unit)
    assert dead.body == b"doomed" and dead.properties[lite.PROPERTY_LITE_TOPIC] == "a"
    assert harness.store.max_offset(lite.queue_of("B", "a"), 0) == 1  # not dispatched into it again
    assert harness.receive("G", "B", client_id="c1") == []
    send(harness, "a", b"forwarded")  # a FIFO push consumer forwards it after its local retries
    (got,) = harness.receive("G", "B", client_id="c1")
    harness.run(harness.broker.forward_to_dead_letter("G", lite.queue_of("B", "a"), got.receipt_handle))
    harness.store.wait_dispatched()
    assert [harness.store.read_unit(u).body for u in harness.store.read_units(dlq, 0, 0, 10)] == [b"doomed", b"forwarded"]
    assert harness.receive("G", "B", client_id="c1") == []


def test_the_subscription_quota_refuses_a_set_past_it_and_changes_nothing(tmp_path):
    h = Harness(tmp_path / "store", lite_subscription_quota=2)
    try:
        lite_setup(h)
        sync(h, "c1", PARTIAL_ADD, ["a", "b"])
        with pytest.raises(BrokerError) as refused:
            sync(h, "c1", PARTIAL_ADD, ["c"])
        assert refused.value.code == Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED == 42902
        with pytest.raises(BrokerError):
            sync(h, "c1", COMPLETE_ADD, ["x", "y", "z"])
        assert h.broker.lite.topics_of("c1") == ["a", "b"]
        sync(h, "c1", COMPLETE_ADD, ["x", "y"])  # a replacement within the quota
        assert h.broker.lite.topics_of("c1") == ["x", "y"]
        with pytest.raises(BrokerError) as illegal:
            sync(h, "c1", PARTIAL_REMOVE, ["bad name"])
        assert illegal.value.code == Code.ILLEGAL_LITE_TOPIC
    finally:
        h.close()
        h.loop.close()


def test_the_lite_topic_quota_refuses_a_new_lite_topic_at_send_not_an_existing_one(tmp_path):
    h = Harness(tmp_path / "store", lite_topic_quota=2)
    try:
        lite_setup(h)
        send(h, "a", b"a0")
        send(h, "b", b"b0")
        with pytest.raises(BrokerError) as refused:
            send(h, "c", b"c0")
        assert refused.value.code == Code.LITE_TOPIC_QUOTA_EXCEEDED == 42901
        send(h, "a", b"a1")
        assert h.store.max_offset(lite.queue_of("B", "a"), 0) == 2
        assert h.store.max_offset(lite.queue_of("B", "c"), 0) == 0
    finally:
        h.close()
        h.loop.close()


def test_offset_options_place_a_new_subscription(harness):
    lite_setup(harness)
    for i in range(5):
        send(harness, "a", b"a%d" % i)
        send(harness, "b", b"b%d" % i)
        send(harness, "c", b"c%d" % i)
    sync(harness, "c1", PARTIAL_ADD, ["a"], offset=OffsetOption("MAX"))
    sync(harness, "c2", PARTIAL_ADD, ["b"], offset=OffsetOption(tail_n=2))
    sync(harness, "c3", PARTIAL_ADD, ["c"])  # LAST, never read: from the start
    assert drain(harness, "c1") == []
    assert bodies(drain(harness, "c2")) == [b"b3", b"b4"]
    assert bodies(drain(harness, "c3")) == [b"c%d" % i for i in range(5)]
    send(harness, "a", b"a5")
    assert bodies(drain(harness, "c1")) == [b"a5"]


def test_a_waiting_receive_is_woken_by_a_message_of_its_lite_topic(harness):
    lite_setup(harness)
    sync(harness, "c1", PARTIAL_ADD, ["a"])

    async def scenario():
        waiting = asyncio.ensure_future(harness.broker.receive(ReceiveRequest("G", "B", client_id="c1", poll_ms=60_000)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await harness.broker.send(Publish(topic="B", body=b"late", message_id="L1", message_type="LITE", lite_topic="a"))
        return await asyncio.wait_for(waiting, 30)

    got = harness.run(scenario())
    assert bodies(got) == [b"late"]


def test_subscriptions_survive_a_restart_and_go_when_the_client_does_not_return(tmp_path):
    h = Harness(tmp_path / "store", client_expire_ms=120_000)
    try:
        lite_setup(h)
        sync(h, "c1", PARTIAL_ADD, ["a"])
        sync(h, "c2", PARTIAL_ADD, ["b"])
        send(h, "a", b"a0")
        (got,) = h.receive("G", "B", client_id="c1")  # in flight across the restart
        h.close()
        h.open()
        send(h, "a", b"a1")
        send(h, "b", b"b1")
        assert bodies(h.receive("G", "B", client_id="c1")) == [b"a1"]
        h.broker.ack("G", lite.queue_of("B", "a"), got.receipt_handle)  # its handle outlived the restart
        h.broker.heartbeat("c1", "LITE_SIMPLE_CONSUMER", "G")
        h.clock.advance(130_000)
        h.broker.heartbeat("c1", "LITE_SIMPLE_CONSUMER", "G")
        h.broker.lite.expire(h.clock())
        assert h.broker.lite.topics_of("c1") == ["a"]
        assert h.broker.lite.topics_of("c2") == []  # never came back
        h.broker.client_terminated("c1")
        assert h.broker.lite.topics_of("c1") == []
    finally:
        h.close()
        h.loop.close()


def test_a_lite_consumers_settings_make_its_group_a_lite_group_and_mismatches_are_refused(harness):
    broker = harness.broker
    broker.client_settings("c1", "LITE_SIMPLE_CONSUMER", "LG", ["B2"])
    assert broker.metadata.groups["LG"].lite_bind_topic == "B2"
    assert broker.metadata.topics["B2"].message_type == "LITE"  # auto-created, still empty
    with pytest.raises(BrokerError) as other_topic:
        broker.lite.sync("c1", "LG", "OTHER", PARTIAL_ADD, ["a"])
    assert other_topic.value.code == Code.ILLEGAL_TOPIC
    harness.send("N", b"x")  # a normal topic with a message
    harness.receive("NG", "N")
    with pytest.raises(BrokerError) as normal_group:
        broker.client_settings("c2", "LITE_PUSH_CONSUMER", "NG", ["B2"])
    assert normal_group.value.code == Code.ILLEGAL_CONSUMER_GROUP
    with pytest.raises(BrokerError) as not_lite_group:
        harness.receive("NG", "B2")
    assert not_lite_group.value.code == Code.ILLEGAL_CONSUMER_GROUP
    with pytest.raises(BrokerError) as not_its_topic:
        harness.receive("LG", "N")
    assert not_its_topic.value.code == Code.ILLEGAL_TOPIC
    with pytest.raises(BrokerError) as not_lite_topic:
        broker.lite.sync("c3", "LG3", "N", PARTIAL_ADD, ["a"])
    assert not_lite_topic.value.code == Code.ILLEGAL_TOPIC


def test_the_server_dropping_a_lite_topic_tells_its_subscribers(harness):
    lite_setup(harness)
    outbox = harness.broker.telemetry_opened("c1")
    sync(harness, "c1", PARTIAL_ADD, ["a", "b"])
    sync(harness, "c2", PARTIAL_ADD, ["b"])
    assert sorted(harness.broker.lite.drop("B", "b")) == ["c1", "c2"]
    assert outbox.get_nowait() == lite.UnsubscribeLite("b")
    assert harness.broker.lite.topics_of("c1") == ["a"] and harness.broker.lite.topics_of("c2") == []


def test_python_sdk_single_characters_are_joined():
    assert lite.python_partial_add(["l", "t", "-", "1"]) == ["lt-1"]
    assert lite.python_partial_add(["x"]) == ["x"]
    assert lite.python_partial_add(["ab", "c"]) == ["ab", "c"]


def test_lite_list_reports_backlog_and_subscribers_per_lite_topic(harness):
    lite_setup(harness)
    sync(harness, "c1", PARTIAL_ADD, ["room-1"])
    sync(harness, "c2", PARTIAL_ADD, ["room-1"])
    for i in range(3):
        send(harness, "room-1", b"r%d" % i)
    send(harness, "other", b"o")
    harness.receive("G", "B", client_id="c1", batch=1)
    listing = admin.list_lite(harness.broker, "B", prefix="room")
    (entry,) = listing["lite_topics"]
    assert entry["lite_topic"] == "room-1" and entry["max_offset"] == 3 and entry["subscribers"] == 2
    assert entry["groups"] == [{"group": "G", "consumed_offset": 0, "backlog": 3, "in_flight": 1}]
    assert len(admin.list_lite(harness.broker, "B")["lite_topics"]) == 2
    (group,) = [g for g in admin.list_groups(harness.broker) if g["name"] == "G"]
    assert group["light_queues"] == 1 and group["topics"] == []


def test_a_rip28_light_queue_is_served_to_an_ordinary_consumer_with_pop_ack_and_retries(harness):
    store = harness.store
    store.put(Message(topic="T", body=b"to-rooms", queue_id=0,
                      properties={"UNIQ_KEY": "U1", lite.PROPERTY_MULTI_DISPATCH: "%LMQ%room1,%LMQ%room2"}))
    store.wait_dispatched()
    assert harness.broker.route("%LMQ%room1").queue_nums == 1
    (got,) = harness.receive("SG", "%LMQ%room1", invisible_ms=10_000)
    assert got.record.body == b"to-rooms" and got.queue_topic == "%LMQ%room1"
    assert lite.delivered_topic(got, "T") == "%LMQ%room1"
    harness.clock.advance(11_000)
    (again,) = harness.receive("SG", "%LMQ%room1")
    assert again.delivery_attempt == 2
    harness.broker.ack("SG", "%LMQ%room1", again.receipt_handle)
    harness.clock.advance(60_000)
    assert harness.receive("SG", "%LMQ%room1") == []
    (other,) = harness.receive("SG", "%LMQ%room2")  # its own progress
    assert other.record.body == b"to-rooms"
    with pytest.raises(BrokerError) as bad:
        harness.receive("SG", "%LMQ%")
    assert bad.value.code == Code.ILLEGAL_TOPIC


class ExpiringHarness(Harness):
    """Light queues idle for a minute expire; the store keeps the broker's virtual time."""

    def open(self) -> None:
        self.store = MessageStore(self.directory, StoreConfig(segment_size=1 << 20, clock=self.clock,
                                                              light_queue_idle_expiry_ms=60_000))
        self.broker = Broker(self.store, BrokerConfig(clock=self.clock, **self.config))
        self.loop.run_until_complete(self._start())


def test_an_idle_consumed_lite_queue_expires_with_its_progress_and_its_subscribers_are_told(tmp_path):
    h = ExpiringHarness(tmp_path / "store")
    try:
        lite_setup(h)
        outbox = h.broker.telemetry_opened("c1")
        sync(h, "c1", PARTIAL_ADD, ["done", "busy"])
        send(h, "done", b"d0")
        send(h, "busy", b"b0")
        for r in h.receive("G", "B", client_id="c1"):
            if r.record.body == b"d0":
                h.broker.ack("G", lite.queue_of("B", "done"), r.receipt_handle)  # b0 stays in flight
        h.broker.lite.maintain(h.clock())
        assert h.store.max_offset(lite.queue_of("B", "done"), 0) == 1  # not idle yet
        h.clock.advance(61_000)
        h.store.run_maintenance()  # the broker's round runs expiry, not the store's
        assert h.store.max_offset(lite.queue_of("B", "done"), 0) == 1
        h.broker.lite.maintain(h.clock())
        assert h.store.max_offset(lite.queue_of("B", "done"), 0) == 0
        assert h.store.max_offset(lite.queue_of("B", "busy"), 0) == 1
        assert outbox.get_nowait() == lite.UnsubscribeLite("done")
        assert h.broker.lite.topics_of("c1") == ["busy"]  # in flight: live
        assert ("G", lite.queue_of("B", "done")) not in h.broker.subscriptions
        h.close()
        h.open()  # the forgotten progress stays forgotten: the queue starts again at 0
        sync(h, "c1", PARTIAL_ADD, ["done"])
        send(h, "done", b"d1")
        assert bodies(drain(h, "c1")) == [b"b0", b"d1"]  # b0 is due again
    finally:
        h.close()
        h.loop.close()
