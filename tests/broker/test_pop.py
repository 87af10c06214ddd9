"""Pop semantics at the broker level, in virtual time: invisibility, ack, change invisible time,
redelivery with delivery_attempt + 1, dead letters, consumed offsets, auto-renew."""

import asyncio

import pytest

from tidemq.broker import BrokerError, Code, admin, dead_letter_topic
from tidemq.broker.broker import REVIVE_INTERVAL_MS


def bodies(received):
    return sorted(r.record.body for r in received)


def test_received_message_is_invisible_until_its_deadline_then_redelivered(harness):
    harness.send("T", b"m1")
    first = harness.receive("G", "T", invisible_ms=30_000)
    assert bodies(first) == [b"m1"] and first[0].delivery_attempt == 1
    assert harness.receive("G", "T") == []
    harness.clock.advance(29_999)
    assert harness.receive("G", "T") == []
    harness.clock.advance(1)
    again = harness.receive("G", "T")
    assert bodies(again) == [b"m1"] and again[0].delivery_attempt == 2
    assert again[0].receipt_handle != first[0].receipt_handle


def test_ack_removes_for_good_and_expired_or_superseded_handles_are_refused(harness):
    harness.send("T", b"m1")
    (r,) = harness.receive("G", "T", invisible_ms=10_000)
    harness.broker.ack("G", "T", r.receipt_handle)
    harness.clock.advance(3_600_000)
    assert harness.receive("G", "T") == []
    with pytest.raises(BrokerError) as err:
        harness.broker.ack("G", "T", r.receipt_handle)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    harness.send("T", b"m2")
    (r2,) = harness.receive("G", "T", invisible_ms=10_000)
    harness.clock.advance(10_000)  # expired
    with pytest.raises(BrokerError) as err:
        harness.broker.ack("G", "T", r2.receipt_handle)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    (r3,) = harness.receive("G", "T", invisible_ms=10_000)
    with pytest.raises(BrokerError):  # the first delivery's handle no longer names it
        harness.broker.ack("G", "T", r2.receipt_handle)
    harness.broker.ack("G", "T", r3.receipt_handle)
    for bad in ("", "garbage", "1.2", "0.0.0.0"):
        with pytest.raises(BrokerError) as err:
            harness.broker.ack("G", "T", bad)
        assert err.value.code == Code.INVALID_RECEIPT_HANDLE


def test_change_invisible_duration_moves_the_deadline_and_replaces_the_handle(harness):
    harness.send("T", b"m1")
    (r,) = harness.receive("G", "T", invisible_ms=10_000)
    new_handle = harness.broker.change_invisible("G", "T", r.receipt_handle, 60_000)
    assert new_handle != r.receipt_handle
    with pytest.raises(BrokerError) as err:
        harness.broker.change_invisible("G", "T", r.receipt_handle, 1_000)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    harness.clock.advance(59_000)
    assert harness.receive("G", "T") == []
    harness.clock.advance(1_000)
    again = harness.receive("G", "T")
    assert again[0].delivery_attempt == 2
    with pytest.raises(BrokerError) as err:
        harness.broker.change_invisible("G", "T", again[0].receipt_handle, -1)
    assert err.value.code == Code.ILLEGAL_INVISIBLE_TIME
    assert harness.broker.change_invisible("G", "T", again[0].receipt_handle, 0)
    assert harness.receive("G", "T")[0].delivery_attempt == 3


def test_past_max_attempts_the_message_goes_to_the_dead_letter_queue(harness):
    admin.create_group(harness.broker, "G", max_attempts=3)
    harness.send("T", b"poison", tag="x")
    for attempt in (1, 2, 3):
        (r,) = harness.receive("G", "T", invisible_ms=10_000)
        assert r.delivery_attempt == attempt
        harness.clock.advance(10_000)
    assert harness.receive("G", "T") == []  # moved, not delivered a 4th time
    harness.run(harness.broker.settle())
    harness.store.wait_dispatched()
    dlq = dead_letter_topic("G")
    assert harness.broker.metadata.topics[dlq].queue_nums == 1
    (dead,) = harness.receive("other", dlq, invisible_ms=10_000)
    assert dead.record.body == b"poison" and dead.record.tags == "x"
    assert dead.record.properties["RETRY_TOPIC"] == "T"
    assert dead.record.reconsume_times == 3
    harness.clock.advance(10_000)
    assert harness.receive("G", "T") == []
    (progress,) = [t for g in admin.list_groups(harness.broker) if g["name"] == "G" for t in g["topics"]]
    assert progress["backlog"] == 0


def test_consumed_offset_advances_over_contiguous_acks_only(harness):
    for i in range(4):
        harness.send("T", b"m%d" % i)
    admin.create_topic(harness.broker, "T", 8)
    got = harness.receive("G", "T", invisible_ms=10_000)
    assert len(got) == 4
    by_queue = {}
    for r in got:
        by_queue.setdefault(r.record.queue_id, []).append(r)
    # round-robin send: one message in each of queues 0..3
    assert sorted(by_queue) == [0, 1, 2, 3]
    harness.broker.ack("G", "T", by_queue[1][0].receipt_handle)
    progress = _group_topic(harness, "G", "T")
    assert progress["backlog"] == 3
    assert {q["queue_id"]: q["consumed_offset"] for q in progress["queues"]}[1] == 1
    assert {q["queue_id"]: q["consumed_offset"] for q in progress["queues"]}[0] == 0


def test_consumed_offset_waits_for_the_oldest_unacked_entry(harness):
    admin.create_topic(harness.broker, "One", 1)
    for i in range(3):
        harness.send("One", b"m%d" % i)
    got = sorted(harness.receive("G", "One", invisible_ms=10_000), key=lambda r: r.record.queue_offset)
    harness.broker.ack("G", "One", got[1].receipt_handle)
    harness.broker.ack("G", "One", got[2].receipt_handle)
    q = _group_topic(harness, "G", "One")["queues"][0]
    assert (q["consumed_offset"], q["backlog"], q["in_flight"]) == (0, 3, 1)
    harness.broker.ack("G", "One", got[0].receipt_handle)
    q = _group_topic(harness, "G", "One")["queues"][0]
    assert (q["consumed_offset"], q["backlog"], q["in_flight"]) == (3, 0, 0)


def _group_topic(harness, group, topic):
    (found,) = [t for g in admin.list_groups(harness.broker) if g["name"] == group for t in g["topics"] if t["topic"] == topic]
    return found


def test_each_group_gets_every_message_and_a_group_shares_them(harness):
    for i in range(10):
        harness.send("T", b"m%d" % i)
    a = harness.receive("A", "T", batch=4, client_id="a1") + harness.receive("A", "T", batch=32, client_id="a2")
    b = harness.receive("B", "T", batch=32)
    assert bodies(a) == bodies(b) == sorted(b"m%d" % i for i in range(10))
    assert harness.receive("A", "T") == []


def test_batch_size_is_honoured_across_queues(harness):
    for i in range(20):
        harness.send("T", b"m%d" % i)
    assert len(harness.receive("G", "T", batch=7)) == 7
    assert len(harness.receive("G", "T", batch=100)) == 13


def test_tag_filters_deliver_only_matching_messages_and_skip_the_rest(harness):
    for tag in ("A", "B", "C", None, "A"):
        harness.send("T", tag.encode() if tag else b"none", tag=tag)
    got = harness.receive("G", "T", expression="A || C")
    assert sorted(r.record.tags for r in got) == ["A", "A", "C"]
    assert harness.receive("G", "T", expression="A || C") == []
    assert _group_topic(harness, "G", "T")["backlog"] == 3  # in flight
    for r in got:
        harness.broker.ack("G", "T", r.receipt_handle)
    assert _group_topic(harness, "G", "T")["backlog"] == 0  # skipped ones count as consumed
    with pytest.raises(BrokerError) as err:
        harness.receive("G", "T", expression="A ||")
    assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION


def test_in_flight_state_survives_a_restart(harness):
    for i in range(3):
        harness.send("T", b"m%d" % i)
    got = harness.receive("G", "T", invisible_ms=20_000)
    acked = [r for r in got if r.record.body == b"m1"][0]
    harness.broker.ack("G", "T", acked.receipt_handle)
    harness.send("T", b"m3")  # sent but never delivered
    harness.close()
    harness.open()
    fresh = harness.receive("G", "T", invisible_ms=20_000)
    assert bodies(fresh) == [b"m3"]  # the others are still invisible
    harness.broker.ack("G", "T", fresh[0].receipt_handle)
    harness.clock.advance(20_000)
    again = harness.receive("G", "T", invisible_ms=20_000)
    assert bodies(again) == [b"m0", b"m2"]
    assert {r.delivery_attempt for r in again} == {2}


def test_a_torn_last_journal_line_is_dropped(harness):
    harness.send("T", b"m0")
    (r,) = harness.receive("G", "T", invisible_ms=20_000)
    harness.close()
    with open(harness.directory / "pop" / "journal", "ab") as f:
        f.write(b'["f","G","T",0,')
    harness.open()
    harness.clock.advance(20_000)
    assert bodies(harness.receive("G", "T")) == [b"m0"]


def test_auto_renew_extends_while_the_client_lives_and_the_first_handle_stays_valid(harness):
    broker = harness.broker
    broker.heartbeat("push-1", "PUSH_CONSUMER", "G")
    harness.send("T", b"m0")
    (r,) = harness.receive("G", "T", auto_renew=True, client_id="push-1")
    assert r.invisible_until == harness.clock.now + broker.config.auto_renew_invisible_time_ms
    for _ in range(5):
        harness.clock.advance(55_000)
        broker.heartbeat("push-1", "PUSH_CONSUMER", "G")
        assert broker.renew(harness.clock.now) == 1
        assert harness.receive("G", "T") == []
    broker.ack("G", "T", r.receipt_handle)


def test_auto_renewed_messages_come_back_soon_after_the_client_leaves(harness):
    broker = harness.broker
    broker.heartbeat("push-1", "PUSH_CONSUMER", "G")
    harness.send("T", b"m0")
    harness.receive("G", "T", auto_renew=True, client_id="push-1")
    broker.client_terminated("push-1")
    harness.clock.advance(broker.config.offline_invisible_time_ms)
    (again,) = harness.receive("G", "T", client_id="simple")
    assert again.delivery_attempt == 2


def test_a_silent_client_stops_being_renewed(harness):
    broker = harness.broker
    broker.heartbeat("push-1", "PUSH_CONSUMER", "G")
    harness.send("T", b"m0")
    harness.receive("G", "T", auto_renew=True, client_id="push-1")
    harness.clock.advance(broker.config.client_expire_ms)
    broker.renew(harness.clock.now)
    harness.clock.advance(broker.config.offline_invisible_time_ms)
    assert bodies(harness.receive("G", "T")) == [b"m0"]


def test_a_new_group_starts_from_the_beginning_of_the_topic(harness):
    for i in range(3):
        harness.send("T", b"m%d" % i)
    got = harness.receive("G1", "T")
    for r in got:
        harness.broker.ack("G1", "T", r.receipt_handle)
    assert len(harness.receive("Late", "T")) == 3


def _waiting(harness, topic: str, poll_ms: int, client_id: str = "c") -> asyncio.Future:
    """A receive of group G on `topic` (a client's long poll), started and waiting."""
    from tidemq.broker import ReceiveRequest

    async def start():
        harness.broker.route(topic)
        req = ReceiveRequest(group="G", topic=topic, client_id=client_id, invisible_ms=10_000, poll_ms=poll_ms)
        waiter = asyncio.ensure_future(harness.broker.receive(req))
        while harness.broker.long_polling.waiting(topic) == 0:
            await asyncio.sleep(0)
        return waiter

    return harness.run(start())


def _spin(harness) -> None:
    """Let the broker's loop run what is ready (tasks woken by timers the clock fired)."""
    for _ in range(3):
        harness.run(asyncio.sleep(0))


def _settled(harness, waiter: asyncio.Future) -> bool:
    """Whether `waiter` is done once the loop has run what is ready."""
    _spin(harness)
    return waiter.done()


def test_long_polling_is_woken_by_dispatch_not_by_its_timeout(harness):
    from tidemq.broker import Publish

    waiter = _waiting(harness, "Idle", poll_ms=20_000)
    harness.run(harness.broker.send(Publish(topic="Idle", body=b"wake", message_id="W1")))
    got = harness.run(asyncio.wait_for(waiter, 10))  # virtual time stands still: no timeout ended it
    assert bodies(got) == [b"wake"]


def test_a_long_poll_with_nothing_to_get_ends_when_its_time_is_up(harness):
    waiter = _waiting(harness, "Idle", poll_ms=20_000)
    harness.clock.advance(19_999)
    assert not _settled(harness, waiter)
    harness.clock.advance(1)
    assert _settled(harness, waiter) and waiter.result() == []
    assert harness.broker.long_polling.waiting("Idle") == 0


def test_a_long_poll_gets_a_redelivery_when_its_invisible_time_ends(harness):
    harness.send("T", b"m0")
    assert len(harness.receive("G", "T", invisible_ms=10_000)) == 1
    waiter = _waiting(harness, "T", poll_ms=30_000)
    harness.clock.advance(9_999)
    assert not _settled(harness, waiter)
    harness.clock.advance(1)  # the wake timer for the due redelivery fires
    assert _settled(harness, waiter)
    (again,) = waiter.result()
    assert again.record.body == b"m0" and again.delivery_attempt == 2


def test_ack_many_settles_each_handle_and_survives_a_restart(harness):
    admin.create_topic(harness.broker, "Batch", 2)
    for i in range(6):
        harness.send("Batch", b"m%d" % i)
    got = harness.receive("G", "Batch", invisible_ms=10_000)
    results = harness.broker.ack_many("G", "Batch", [r.receipt_handle for r in got[:4]] + ["bogus"])
    assert results[:4] == [None] * 4 and results[4].code == Code.INVALID_RECEIPT_HANDLE
    harness.close()
    harness.open()
    harness.clock.advance(10_000)
    assert bodies(harness.receive("G", "Batch")) == bodies(got[4:])


def test_renewals_do_not_grow_the_deadline_heap_without_bound(harness):
    broker = harness.broker
    broker.heartbeat("push-1", "PUSH_CONSUMER", "G")
    harness.send("T", b"m0")
    harness.receive("G", "T", auto_renew=True, client_id="push-1")
    sub = broker.subscriptions[("G", "T")]
    for _ in range(10_000):
        (d,) = [d for q in sub.queues.values() for d in q.in_flight.values()]
        # ownerless from here: no background renewal round keeps it in flight past its deadline
        sub.set_invisible(d.queue_id, d.queue_offset, d.invisible_until + 1, d.generation, "")
    assert len(sub._due) <= 4097
    harness.clock.advance(broker.config.auto_renew_invisible_time_ms + 10_001)
    assert bodies(harness.receive("G", "T")) == [b"m0"]


def test_forward_to_dead_letter_moves_the_message_at_once(harness):
    harness.send("T", b"give up", tag="t")
    (r,) = harness.receive("G", "T", invisible_ms=10_000)
    harness.run(harness.broker.forward_to_dead_letter("G", "T", r.receipt_handle))
    harness.store.wait_dispatched()
    harness.clock.advance(10_000)
    assert harness.receive("G", "T") == []
    (dead,) = harness.receive("Reader", dead_letter_topic("G"))
    assert dead.record.body == b"give up"
    with pytest.raises(BrokerError) as err:
        harness.run(harness.broker.forward_to_dead_letter("G", "T", r.receipt_handle))
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE


def test_a_terminating_client_gets_its_waiting_receive_answered(harness):
    waiter = _waiting(harness, "Quiet", poll_ms=60_000, client_id="leaving")
    harness.broker.client_terminated("leaving")
    assert harness.run(asyncio.wait_for(waiter, 10)) == []


def test_a_long_run_of_filtered_out_entries_does_not_hide_a_match_behind_it(harness):
    admin.create_topic(harness.broker, "Sparse", 1)
    for i in range(1500):
        harness.send("Sparse", b"noise", tag="noise")
    harness.send("Sparse", b"wanted", tag="wanted")
    got = harness.receive("G", "Sparse", expression="wanted", poll_ms=5_000)
    assert bodies(got) == [b"wanted"]


def test_a_receive_that_may_not_wait_returns_while_skipping_and_the_next_goes_on(harness):
    from tidemq.broker.broker import _SCAN_LIMIT
    from tidemq.store import Message

    admin.create_topic(harness.broker, "Sparse", 1)
    noise = 2 * _SCAN_LIMIT + 10
    harness.store.put_batch([Message(topic="Sparse", body=b"noise", tags="noise") for _ in range(noise)])
    harness.send("Sparse", b"wanted", tag="wanted")
    receives = []
    while not receives or not receives[-1]:
        receives.append(harness.receive("G", "Sparse", expression="wanted", poll_ms=0))
        assert len(receives) <= noise // _SCAN_LIMIT + 1, "receives must make progress"
    # the first did not scan the whole run past its deadline; each one skipped its share
    assert len(receives) > 1 and bodies(receives[-1]) == [b"wanted"]


def test_an_open_telemetry_stream_keeps_a_client_alive_without_heartbeats(harness):
    broker = harness.broker
    broker.telemetry_opened("push-1")
    harness.send("T", b"m0")
    harness.receive("G", "T", auto_renew=True, client_id="push-1")
    harness.clock.advance(broker.config.client_expire_ms + 55_000)
    assert broker.renew(harness.clock.now) == 1  # renewed, not released
    assert harness.receive("G", "T") == []
    broker.telemetry_closed("push-1")
    harness.clock.advance(broker.config.auto_renew_invisible_time_ms - broker.config.renew_ahead_ms + 1)
    broker.renew(harness.clock.now)  # the client is gone now: visible in a second
    harness.clock.advance(broker.config.offline_invisible_time_ms)
    assert bodies(harness.receive("G", "T")) == [b"m0"]


def test_released_deliveries_come_back_after_a_second(harness):
    harness.send("T", b"m0")
    harness.send("T", b"m1")
    got = harness.receive("G", "T", invisible_ms=60_000)
    harness.broker.release("G", "T", [got[0].receipt_handle, "nonsense"])
    harness.clock.advance(harness.broker.config.offline_invisible_time_ms)
    again = harness.receive("G", "T")
    assert bodies(again) == [got[0].record.body] and again[0].delivery_attempt == 2


def test_a_message_the_store_refuses_fails_alone_in_its_batch(harness):
    from tidemq.broker import Publish

    harness.store.config.max_message_size = 1000  # the store refuses what the broker let through
    batch = [Publish(topic="T", body=body, message_id=f"ID{i}") for i, body in enumerate([b"a", b"x" * 2000, b"c"])]
    first, refused, last = harness.run(harness.broker.send_batch(batch))
    assert isinstance(refused, BrokerError) and refused.code == Code.BAD_REQUEST
    assert (first.message_id, last.message_id) == ("ID0", "ID2")
    harness.store.wait_dispatched()
    assert bodies(harness.receive("G", "T")) == [b"a", b"c"]


def test_a_batch_the_disk_refuses_part_way_keeps_what_was_stored(harness):
    from tidemq.broker import Publish

    reserve = harness.store.commit_log.reserve
    calls = []

    def disk_fills_after_two(size):
        calls.append(size)
        if len(calls) > 2:
            raise OSError(28, "No space left on device")
        return reserve(size)

    # the environment: the disk fills mid-batch.  No warm pages ahead, so that every record needs
    # `reserve` (where a full disk shows: a new segment, or pages that cannot be allocated).
    harness.store.commit_log.reserve = disk_fills_after_two
    harness.store.commit_log.warm_region = lambda: None
    batch = [Publish(topic="T", body=b"m%d" % i, message_id=f"ID{i}") for i in range(4)]
    try:
        outcomes = harness.run(harness.broker.send_batch(batch))
    finally:
        del harness.store.commit_log.reserve
        del harness.store.commit_log.warm_region
    assert [o.message_id for o in outcomes[:2]] == ["ID0", "ID1"]
    for refused in outcomes[2:]:
        assert isinstance(refused, BrokerError) and refused.code == Code.TOO_MANY_REQUESTS  # the disk is full
        assert "No space left on device" in refused.message
    harness.store.wait_dispatched()
    assert bodies(harness.receive("G", "T")) == [b"m0", b"m1"]
    # the disk has room again: the next send is stored and delivered
    harness.send("T", b"later")
    assert bodies(harness.receive("G", "T")) == [b"later"]


def _group(broker, name):
    (g,) = [g for g in admin.list_groups(broker) if g["name"] == name]
    return g


def test_a_last_attempt_past_its_deadline_is_dead_lettered_without_a_receive(harness):
    admin.create_group(harness.broker, "G", max_attempts=2)
    harness.send("T", b"poison")
    for attempt in (1, 2):
        harness.clock.advance(10_000)
        (r,) = harness.receive("G", "T", invisible_ms=10_000)
        assert r.delivery_attempt == attempt
    harness.clock.advance(9_999)
    assert harness.broker.revive(harness.clock()) == 0  # not due yet
    harness.clock.advance(1)
    assert harness.broker.revive(harness.clock()) == 1  # nobody receives: moved all the same
    harness.run(harness.broker.settle())
    harness.store.wait_dispatched()
    g = _group(harness.broker, "G")
    assert g["dead_letters"] == 1
    assert g["topics"][0]["backlog"] == 0 and sum(q["in_flight"] for q in g["topics"][0]["queues"]) == 0
    (dead,) = harness.receive("other", dead_letter_topic("G"))
    assert dead.record.body == b"poison" and dead.record.reconsume_times == 2
    harness.clock.advance(100_000)
    assert harness.broker.revive(harness.clock()) == 0 and harness.receive("G", "T") == []


def test_the_background_revive_moves_due_last_attempts_after_a_restart(harness):
    admin.create_group(harness.broker, "G", max_attempts=1)
    harness.send("T", b"poison")
    (r,) = harness.receive("G", "T", invisible_ms=10_000)
    harness.close()
    harness.open()  # the in-flight delivery comes back from the journal
    # past the deadline, then one revive interval more: a background round runs after the
    # deadline whenever the reopened broker's round first set its timer
    for ms in (10_000, REVIVE_INTERVAL_MS):
        harness.clock.advance(ms)
        _spin(harness)
    harness.run(harness.broker.settle())  # its move to the dead-letter queue ends
    harness.store.wait_dispatched()
    assert _group(harness.broker, "G")["dead_letters"] == 1
    assert _group(harness.broker, "G")["topics"][0]["backlog"] == 0


def test_a_lowered_max_attempts_applies_to_deliveries_already_in_flight(harness):
    admin.create_group(harness.broker, "G", max_attempts=5)
    harness.send("T", b"m")
    harness.receive("G", "T", invisible_ms=10_000)
    harness.clock.advance(10_000)
    assert harness.broker.revive(harness.clock()) == 0  # 4 attempts left: a receive redelivers it
    admin.update_group(harness.broker, "G", max_attempts=1)
    assert harness.broker.revive(harness.clock()) == 1
