"""FIFO consumer groups: each message group in order, one message at a time; groups in parallel;
retries, dead letters and restarts keep the order (virtual clock, real store)."""

from __future__ import annotations

import pytest

from tidemq.broker import BrokerError, Code, admin
from tidemq.broker import fifo
from tidemq.broker.fifo import consistent_hash, java_string_hash, queue_for_group


@pytest.mark.parametrize("key, buckets, java_hash, bucket", [
    # Java's String.hashCode and Guava 32's Hashing.consistentHash, as RocketMQ's proxy runs them
    ("order-1", 8, -1207111310, 3), ("order-2", 16, -1207111309, 11), ("fifo-group-0", 8, 362194017, 6),
    ("g", 16, 103, 12), ("", 8, 0, 0), ("Ünïcode-群组", 16, -672114493, 6), ("user-42", 4, -147182656, 1),
])
def test_message_group_picks_the_queue_rocketmq_picks(key, buckets, java_hash, bucket):
    assert java_string_hash(key) == java_hash
    assert consistent_hash(java_hash, buckets) == bucket
    assert queue_for_group(key, buckets) == bucket


def fifo_setup(harness, queues: int = 2):
    admin.create_topic(harness.broker, "F", queues, "FIFO")
    admin.create_group(harness.broker, "G", fifo=True)


def send(harness, group: str, body: str):
    return harness.send("F", body.encode(), message_type="FIFO", message_group=group)


def bodies(received) -> list[str]:
    return [bytes(r.record.body).decode() for r in received]


def test_fifo_send_stores_the_group_and_uses_its_queue(harness):
    fifo_setup(harness, queues=8)
    result = send(harness, "order-1", "a")
    assert result.queue_id == queue_for_group("order-1", 8) == 3
    (rec,) = harness.store.get("F", 3, 0).messages
    assert rec.properties["__SHARDINGKEY"] == "order-1"


def test_next_message_of_a_group_waits_for_the_ack_while_other_groups_go_on(harness):
    fifo_setup(harness, queues=1)  # one shared queue: groups interleaved in it
    for i in range(3):
        send(harness, "A", f"a{i}")
        send(harness, "B", f"b{i}")
    first = harness.receive("G", "F", client_id="c1")
    assert bodies(first) == ["a0", "b0"]  # one head per group, never a1 behind a0
    assert harness.receive("G", "F", client_id="c2") == []
    harness.broker.ack("G", "F", first[1].receipt_handle)  # b0 done: b1 released, A still blocked
    assert bodies(harness.receive("G", "F", client_id="c2")) == ["b1"]
    harness.broker.ack("G", "F", first[0].receipt_handle)
    assert bodies(harness.receive("G", "F", client_id="c3")) == ["a1"]


def test_a_late_message_of_a_free_group_is_not_stuck_behind_a_blocked_group(harness):
    fifo_setup(harness, queues=1)
    for i in range(50):
        send(harness, "slow", f"s{i}")
    send(harness, "fast", "f0")
    (head,) = harness.receive("G", "F", batch=1)
    assert bodies([head]) == ["s0"]
    assert bodies(harness.receive("G", "F")) == ["f0"]  # RocketMQ's queue lock would block it


def test_unacked_head_is_redelivered_before_the_rest_of_its_group(harness):
    fifo_setup(harness, queues=1)
    for i in range(3):
        send(harness, "A", f"a{i}")
    (a0,) = harness.receive("G", "F", invisible_ms=10_000)
    harness.clock.advance(10_000)
    (again,) = harness.receive("G", "F", invisible_ms=10_000)
    assert (bodies([again]), again.delivery_attempt) == (["a0"], 2)
    handle = harness.broker.change_invisible("G", "F", again.receipt_handle, 5_000)  # a nack
    assert harness.receive("G", "F") == []
    harness.clock.advance(5_000)
    (third,) = harness.receive("G", "F")
    assert (bodies([third]), third.delivery_attempt) == (["a0"], 3)
    with pytest.raises(BrokerError) as err:
        harness.broker.ack("G", "F", handle)  # superseded
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    harness.broker.ack("G", "F", third.receipt_handle)
    (a1,) = harness.receive("G", "F")
    assert (bodies([a1]), a1.delivery_attempt) == (["a1"], 1)


def test_dead_letters_keep_the_order_and_release_the_next(harness):
    fifo_setup(harness, queues=1)
    admin.update_group(harness.broker, "G", max_attempts=2)
    for i in range(3):
        send(harness, "A", f"a{i}")
    for _ in range(2):
        assert bodies(harness.receive("G", "F", invisible_ms=10_000)) == ["a0"]
        harness.clock.advance(10_000)
    assert harness.receive("G", "F") == []  # a0 moves to the dead-letter queue
    harness.run(harness.broker.settle())
    (a1,) = harness.receive("G", "F")
    assert bodies([a1]) == ["a1"]
    harness.run(harness.broker.forward_to_dead_letter("G", "F", a1.receipt_handle))  # the push consumer's way
    assert bodies(harness.receive("G", "F")) == ["a2"]
    harness.store.wait_dispatched()
    assert bodies(harness.receive("other", "%DLQ%G")) == ["a0", "a1"]


def test_messages_without_a_group_keep_queue_order_for_a_fifo_group(harness):
    admin.create_topic(harness.broker, "N", 1)
    admin.create_group(harness.broker, "G", fifo=True)
    for i in range(3):
        harness.send("N", b"n%d" % i)
    (n0,) = harness.receive("G", "N")
    assert harness.receive("G", "N") == []
    harness.broker.ack("G", "N", n0.receipt_handle)
    assert bodies(harness.receive("G", "N")) == ["n1"]


def test_order_survives_a_restart_with_held_and_released_messages(harness):
    fifo_setup(harness, queues=1)
    for i in range(3):
        send(harness, "A", f"a{i}")
        send(harness, "B", f"b{i}")
    a0, b0 = harness.receive("G", "F", invisible_ms=20_000)
    harness.broker.ack("G", "F", b0.receipt_handle)  # b1 released, not yet delivered
    harness.close()
    harness.open()
    assert bodies(harness.receive("G", "F", invisible_ms=20_000)) == ["b1"]  # a0 still in flight
    harness.clock.advance(20_000)
    got = harness.receive("G", "F", invisible_ms=20_000)
    assert bodies(got) == ["a0", "b1"]  # both heads come due; nothing behind them
    for r in got:
        harness.broker.ack("G", "F", r.receipt_handle)
    assert sorted(bodies(harness.receive("G", "F"))) == ["a1", "b2"]


def test_a_group_turned_non_fifo_gets_its_held_messages(harness):
    fifo_setup(harness, queues=1)
    for i in range(3):
        send(harness, "A", f"a{i}")
    harness.receive("G", "F")
    admin.update_group(harness.broker, "G", fifo=False)
    assert bodies(harness.receive("G", "F")) == ["a1", "a2"]


def test_held_messages_are_bounded_per_queue(harness, monkeypatch):
    monkeypatch.setattr(fifo, "MAX_PENDING_PER_QUEUE", 50)
    fifo_setup(harness, queues=1)
    harness.run(harness.broker.send_batch([_publish(i) for i in range(60)]))
    harness.store.wait_dispatched()
    assert len(harness.receive("G", "F")) == 1
    (progress,) = [t for g in admin.list_groups(harness.broker) if g["name"] == "G" for t in g["topics"]]
    assert progress["queues"][0]["in_flight"] == 50  # the scan stopped there


def _publish(i: int):
    from tidemq.broker import Publish

    return Publish(topic="F", body=b"x%d" % i, message_id=f"B{i:08d}", message_type="FIFO", message_group="one")


def test_fifo_settings_and_client_request(harness):
    fifo_setup(harness)
    assert harness.broker.client_settings("c1", "PUSH_CONSUMER", "G", ["F"]).fifo
    assert not harness.broker.client_settings("c2", "PUSH_CONSUMER", "H", ["F"]).fifo
    assert harness.broker.client_settings("c3", "PUSH_CONSUMER", "H", ["F"], fifo_requested=True).fifo
    assert harness.broker.metadata.groups["H"].fifo
