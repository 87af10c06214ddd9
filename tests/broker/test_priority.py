"""Priority topics at the broker level, in virtual time: one queue per level, pops served highest
level first across batches and consumers, redeliveries that keep their level (and the option that
ranks them against fresh messages of their level), tag filters, dead letters, restart."""

import random

import pytest

from tidemq.broker import BrokerError, Code, admin, dead_letter_topic
from tidemq.broker.priority import PROPERTY_PRIORITY, PriorityPop, parse

from .conftest import Harness


def send(harness, topic, priority, body=None, tag=None):
    return harness.send(topic, body or b"p%d" % priority, tag=tag, message_type="PRIORITY", priority=priority)


def levels_of(received):
    return [int(r.record.properties[PROPERTY_PRIORITY]) for r in received]


def priority_topic(harness, name="P", levels=10):
    admin.create_topic(harness.broker, name, message_type="PRIORITY", priorities=levels)


def test_a_backlog_comes_out_highest_level_first_within_and_across_batches_and_consumers(harness):
    priority_topic(harness)
    rng = random.Random(7)
    sent = [rng.randrange(12) for _ in range(300)]  # 10 and 11 count as the top level, 9
    for p in sent:
        result = send(harness, "P", p)
        assert result.queue_id == min(p, 9)
    got = []
    while True:
        batch = harness.receive("G", "P", batch=7, client_id=rng.choice(("c1", "c2", "c3")))
        if not batch:
            break
        got.extend(batch)
    levels = [min(p, 9) for p in levels_of(got)]
    assert levels == sorted(levels, reverse=True)
    assert sorted(levels_of(got)) == sorted(sent)  # the stored priority is the one sent
    # within a level, the order sent
    tens = [r.record.body for r in got if r.record.queue_id == 9]
    assert tens == [b"p%d" % p for p in sent if p >= 9]


def test_a_high_message_sent_while_a_low_backlog_drains_is_delivered_next(harness):
    priority_topic(harness)
    for _ in range(20):
        send(harness, "P", 1)
    assert levels_of(harness.receive("G", "P", batch=5)) == [1] * 5
    send(harness, "P", 8)
    first, *rest = harness.receive("G", "P", batch=5)
    assert levels_of([first]) == [8] and levels_of(rest) == [1] * 4


def test_a_failed_high_message_comes_back_before_any_lower_one_once_its_deadline_passes(harness):
    priority_topic(harness)
    send(harness, "P", 7, b"high")
    for i in range(10):
        send(harness, "P", 2, b"low%d" % i)
    (high,) = harness.receive("G", "P", batch=1, invisible_ms=10_000)
    assert high.record.body == b"high"
    assert [r.record.body for r in harness.receive("G", "P", batch=2)] == [b"low0", b"low1"]
    harness.clock.advance(10_000)
    again = harness.receive("G", "P", batch=3)
    assert [r.record.body for r in again] == [b"high", b"low2", b"low3"]
    assert again[0].delivery_attempt == 2


def test_by_default_a_redelivery_ranks_just_below_fresh_messages_of_its_level(harness):
    priority_topic(harness)
    send(harness, "P", 5, b"first")
    (r,) = harness.receive("G", "P", batch=1, invisible_ms=10_000)
    send(harness, "P", 5, b"fresh")
    send(harness, "P", 4, b"lower")
    harness.clock.advance(10_000)
    assert [x.record.body for x in harness.receive("G", "P", batch=3)] == [b"fresh", b"first", b"lower"]


def test_the_retry_first_option_ranks_a_redelivery_just_above_fresh_messages_of_its_level(tmp_path):
    h = Harness(tmp_path / "store", priority_retry_first_percent=100)
    try:
        priority_topic(h)
        send(h, "P", 5, b"first")
        h.receive("G", "P", batch=1, invisible_ms=10_000)
        send(h, "P", 5, b"fresh")
        send(h, "P", 6, b"higher")
        send(h, "P", 4, b"lower")
        h.clock.advance(10_000)
        assert [x.record.body for x in h.receive("G", "P", batch=4)] == [b"higher", b"first", b"fresh", b"lower"]
    finally:
        h.close()
        h.loop.close()


def test_redeliveries_of_several_levels_keep_their_order_among_fresh_ones(harness):
    priority_topic(harness, levels=4)
    for p in (0, 3, 1, 2):
        send(harness, "P", p, b"old%d" % p)
    assert levels_of(harness.receive("G", "P", batch=4, invisible_ms=10_000)) == [3, 2, 1, 0]
    for p in (0, 1, 2, 3):
        send(harness, "P", p, b"new%d" % p)
    harness.clock.advance(10_000)
    got = harness.receive("G", "P", batch=8)
    assert [r.record.body for r in got] == [b"new3", b"old3", b"new2", b"old2", b"new1", b"old1", b"new0", b"old0"]
    assert [r.delivery_attempt for r in got] == [1, 2] * 4


def test_a_tag_filter_keeps_the_order_even_past_the_scan_limit_of_a_level(harness):
    priority_topic(harness, levels=3)
    for _ in range(1500):  # more than one pop examines in a queue
        send(harness, "P", 2, tag="other")
    send(harness, "P", 2, b"wanted-high", tag="want")
    send(harness, "P", 0, b"wanted-low", tag="want")
    got = []
    for _ in range(10):
        got.extend(harness.receive("G", "P", expression="want"))
    assert [r.record.body for r in got] == [b"wanted-high", b"wanted-low"]


def test_a_priority_message_past_max_attempts_goes_to_the_dead_letter_queue_with_its_priority(harness):
    priority_topic(harness)
    admin.create_group(harness.broker, "G", max_attempts=2)
    send(harness, "P", 6, b"poison")
    for _ in range(2):
        assert harness.receive("G", "P", invisible_ms=10_000)
        harness.clock.advance(10_000)
    assert harness.receive("G", "P") == []
    harness.run(harness.broker.settle())
    harness.store.wait_dispatched()
    (dead,) = harness.receive("D", dead_letter_topic("G"))
    assert dead.record.body == b"poison" and dead.record.properties[PROPERTY_PRIORITY] == "6"


def test_levels_and_in_flight_redeliveries_survive_a_restart(harness):
    priority_topic(harness)
    send(harness, "P", 9, b"top")
    for p in (3, 0, 5):
        send(harness, "P", p)
    (top,) = harness.receive("G", "P", batch=1, invisible_ms=10_000)
    harness.close()
    harness.open()
    assert harness.broker.metadata.topics["P"].priority_levels == 10
    harness.clock.advance(10_000)
    got = harness.receive("G", "P")
    assert levels_of(got) == [9, 5, 3, 0] and got[0].record.body == b"top" and got[0].delivery_attempt == 2


def test_held_redeliveries_return_to_the_subscription_when_the_topic_stops_being_a_priority_topic(harness):
    priority_topic(harness, levels=8)
    for p in range(8):
        send(harness, "P", p)
    harness.receive("G", "P", batch=8, invisible_ms=10_000)
    harness.clock.advance(10_000)
    assert len(harness.receive("G", "P", batch=2)) == 2  # the other six are held, due, by level
    assert harness.broker.priority.held_count() >= 6
    admin.create_topic(harness.broker, "P", queue_nums=8, message_type="NORMAL")
    again = harness.receive("G", "P", batch=32)
    assert sorted(levels_of(again)) == [0, 1, 2, 3, 4, 5]
    assert harness.broker.priority.held_count() == 0


def test_message_types_must_match_the_topic_type(harness):
    priority_topic(harness)
    with pytest.raises(BrokerError) as err:
        harness.send("P", b"plain")
    assert err.value.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    with pytest.raises(BrokerError) as err:
        send(harness, "Plain", 3)
    assert err.value.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    for bad in (None, -1):
        with pytest.raises(BrokerError) as err:
            harness.send("P", b"x", message_type="PRIORITY", priority=bad)
        assert err.value.code == Code.BAD_REQUEST


def test_admin_sets_the_levels_of_a_priority_topic(harness):
    broker = harness.broker
    assert admin.create_topic(broker, "Default", message_type="PRIORITY")["priorities"] == 10
    assert admin.create_topic(broker, "Three", message_type="priority", priorities=3)["queue_nums"] == 3
    assert admin.create_topic(broker, "Four", queue_nums=4, message_type="PRIORITY")["priorities"] == 4
    assert "priorities" not in admin.create_topic(broker, "Plain")
    for kw in (dict(message_type="PRIORITY", priorities=3, queue_nums=4), dict(message_type="NORMAL", priorities=3),
               dict(message_type="PRIORITY", priorities=0), dict(message_type="PRIORITY", priorities=1025)):
        with pytest.raises(BrokerError) as err:
            admin.create_topic(broker, "Bad", **kw)
        assert err.value.code == Code.BAD_REQUEST
    with pytest.raises(BrokerError):  # levels can be added, not removed
        admin.create_topic(broker, "Three", message_type="PRIORITY", priorities=2)
    assert [t["priorities"] for t in admin.list_topics(broker) if t["name"] == "Three"] == [3]


def test_stored_priorities_parse_as_rocketmq_reads_them():
    assert [parse(v) for v in ("0", "9", "2147483647")] == [0, 9, 2**31 - 1]
    assert [parse(v) for v in (None, "", "-1", " 5", "2147483648", "five", "٣")] == [None] * 7
    with pytest.raises(ValueError):
        PriorityPop(101)
