"""Delay and timer messages at the broker, in virtual time: topic types, the timer topic as
RocketMQ stores it, release at the due millisecond, restarts, recall, 4.x delay levels."""

import asyncio
import base64

import pytest

from tidemq.broker import BrokerError, Code, Publish, admin
from tidemq.broker import timers
from tidemq.store import Message, MessageStore, StoreConfig

from .conftest import Harness


async def _no_background_round(*args) -> None:
    return None


class TimerHarness(Harness):
    """The store stamps records with the same virtual clock (delay levels are due from their
    store time).  The broker's background timer round is stopped unless `background`: the
    test releases with `release()`, so that it knows which round released what."""

    background = False

    def open(self) -> None:
        from tidemq.broker import Broker, BrokerConfig

        self.store = MessageStore(self.directory, StoreConfig(segment_size=1 << 20, clock=self.clock))
        self.broker = Broker(self.store, BrokerConfig(clock=self.clock, **self.config))
        if not self.background:
            self.broker.timers.run = _no_background_round
        self.loop.run_until_complete(self._start())

    def reopen(self) -> None:
        self.close()
        self.open()

    def release(self) -> int:
        n = self.run(self.broker.timers.release_due())
        self.store.wait_dispatched()
        return n

    def delay(self, topic: str, body: bytes, after_ms: int, **kw):
        return self.send(topic, body, message_type="DELAY", delivery_timestamp=self.clock() + after_ms, **kw)

    def delays(self, topic: str, *afters: int) -> None:
        """One delay message per delay in ms, its body the delay."""
        for after in afters:
            self.delay(topic, str(after).encode(), after)

    def topic_bodies(self, topic: str) -> list[bytes]:
        out = []
        for qid in range(8):
            out += [bytes(m.body) for m in self.store.get(topic, qid, 0, 1000).messages]
        return sorted(out)


@pytest.fixture
def th(tmp_path):
    h = TimerHarness(tmp_path / "store")
    admin.create_topic(h.broker, "D", 2, "DELAY")
    yield h
    h.close()
    h.loop.close()


def send_code(h, topic, **kw):
    try:
        h.send(topic, b"x", **kw)
    except BrokerError as exc:
        return exc.code
    return Code.OK


@pytest.mark.parametrize("topic_type, accepted", [
    ("NORMAL", {"NORMAL"}), ("FIFO", {"FIFO"}), ("DELAY", {"DELAY"}), ("TRANSACTION", {"TRANSACTION"}),
])
def test_a_typed_topic_takes_exactly_its_type(harness, topic_type, accepted):
    admin.create_topic(harness.broker, "Typed", 2, topic_type)
    kinds = {
        "NORMAL": dict(),
        "FIFO": dict(message_type="FIFO", message_group="g"),
        "DELAY": dict(message_type="DELAY", delivery_timestamp=harness.clock() + 1000),
        "TRANSACTION": dict(message_type="TRANSACTION"),
    }
    for kind, kw in kinds.items():
        code = send_code(harness, "Typed", **kw)
        if kind in accepted:
            assert code != Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, kind
        else:
            assert code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, kind


def test_the_type_checked_is_the_one_the_message_carries(harness):
    """As RocketMQ's proxy derives it from the stored properties: a delivery time makes a DELAY
    message whatever type the client named."""
    admin.create_topic(harness.broker, "N", 2, "NORMAL")
    code = send_code(harness, "N", message_type="NORMAL", delivery_timestamp=harness.clock() + 1000)
    assert code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert send_code(harness, "N", message_type="DELAY") == Code.OK  # no delivery time: NORMAL


def test_delivery_time_up_to_the_configured_maximum(th):
    assert th.delay("D", b"a", 86_400_000)
    with pytest.raises(BrokerError) as err:
        th.delay("D", b"b", 86_400_001)
    assert err.value.code == Code.ILLEGAL_DELIVERY_TIME


def test_a_delay_message_is_kept_in_the_timer_topic_and_released_at_its_millisecond(th):
    due = th.clock() + 5_000
    result = th.delay("D", b"late", 5_000, tag="t1", keys=["k1"], properties={"p": "1"})
    assert th.store.max_offset(timers.TIMER_TOPIC, 0) == 1
    (kept,) = th.store.get(timers.TIMER_TOPIC, 0, 0).messages
    assert kept.properties["REAL_TOPIC"] == "D" and kept.properties["REAL_QID"] == str(result.queue_id)
    assert kept.properties["TIMER_OUT_MS"] == kept.properties["TIMER_DELIVER_MS"] == str(due)
    assert th.receive("G", "D") == []
    th.clock.advance(4_999)
    assert th.release() == 0 and th.receive("G", "D") == []
    th.clock.advance(1)
    assert th.release() == 1
    (got,) = th.receive("G", "D")
    rec = got.record
    assert rec.body == b"late" and rec.tags == "t1" and rec.keys == ["k1"] and rec.properties["p"] == "1"
    assert rec.queue_id == result.queue_id and rec.unique_key == result.message_id
    assert "REAL_TOPIC" not in rec.properties and rec.properties["TIMER_DEQUEUE_MS"] == str(due)
    assert th.release() == 0


def test_a_delivery_time_already_past_is_stored_in_the_topic_itself(th):
    th.delay("D", b"now", 0)
    assert th.store.max_offset(timers.TIMER_TOPIC, 0) == 0
    assert [r.record.body for r in th.receive("G", "D")] == [b"now"]


def test_timers_release_in_due_order_whatever_the_send_order(th):
    th.delays("D", 3_000, 1_000, 2_000, 1_000)
    th.clock.advance(1_000)
    assert th.release() == 2
    th.clock.advance(1_000)
    assert th.release() == 1
    th.clock.advance(5_000)
    assert th.release() == 1
    assert th.topic_bodies("D") == [b"1000", b"1000", b"2000", b"3000"]


def test_pending_timers_survive_a_restart_and_none_is_released_twice(th):
    th.delays("D", 1_000, 2_000, 3_000)
    th.clock.advance(1_000)
    assert th.release() == 1
    th.reopen()
    assert th.release() == 0
    th.clock.advance(2_000)
    assert th.release() == 2
    th.reopen()
    th.clock.advance(10_000)
    assert th.release() == 0
    assert th.topic_bodies("D") == [b"1000", b"2000", b"3000"]


def test_without_a_checkpoint_a_restart_releases_again_but_loses_nothing(th):
    """What a crash leaves: releases since the last checkpoint go out again, none is lost."""
    th.broker.timers.checkpoint = lambda: None  # the process dies before writing one
    th.delays("D", 1_000, 2_000)
    th.clock.advance(1_000)
    assert th.release() == 1
    th.reopen()
    th.clock.advance(1_000)
    assert th.release() == 2
    assert th.topic_bodies("D") == [b"1000", b"1000", b"2000"]


def test_a_timer_read_after_its_due_time_does_not_make_a_restart_repeat_others(th):
    """An entry loaded late with an earlier key than one already released: the checkpoint
    names the out-of-order release, so a clean restart repeats nothing."""
    th.delay("D", b"b", 2_000)
    th.clock.advance(2_000)
    assert th.release() == 1
    late = Message(topic="D", body=b"a", queue_id=0, properties={"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "A"})
    th.run(th.broker.publisher.put([timers.timer_message(late, th.clock() - 1_500)]))
    th.store.wait_dispatched()
    th.broker.timers._load()  # read, not yet released
    th.broker.timers.checkpoint()
    th.reopen()
    assert th.release() == 1
    th.reopen()
    assert th.release() == 0
    assert th.topic_bodies("D") == [b"a", b"b"]


def test_a_record_rocketmq_wrote_to_the_timer_topic_is_released(th):
    """RocketMQ 5.5.0's layout: TIMER_OUT_MS floored to its precision, REAL_TOPIC, REAL_QID."""
    due = th.clock() + 3_000
    properties = {"TIMER_DELIVER_MS": str(due + 500), "TIMER_OUT_MS": str(due), "REAL_TOPIC": "D",
                  "REAL_QID": "1", "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "RMQ1", "WAIT": "true"}
    th.run(th.broker.publisher.put([Message(topic=timers.TIMER_TOPIC, body=b"from rocketmq", queue_id=0,
                                            tags="tg", properties=properties)]))
    th.store.wait_dispatched()
    th.clock.advance(2_999)
    assert th.release() == 0
    th.clock.advance(1)
    assert th.release() == 1
    (m,) = th.store.get("D", 1, 0).messages
    assert bytes(m.body) == b"from rocketmq" and m.tags == "tg" and "REAL_QID" not in m.properties


def test_rocketmq_timer_checkpoint_is_honoured_on_a_store_it_wrote(tmp_path):
    """No timers.json but RocketMQ's config/timercheck: entries below its queue offset that
    were due before its read time already went out; the others are pending."""
    h = TimerHarness(tmp_path / "store")
    try:
        now = h.clock()
        for body, due in ((b"fired", now - 10_000), (b"pending", now + 1_000)):
            props = {"TIMER_OUT_MS": str(due), "REAL_TOPIC": "D", "REAL_QID": "0"}
            h.run(h.broker.publisher.put([Message(topic=timers.TIMER_TOPIC, body=body, properties=props)]))
        h.store.wait_dispatched()
        h.close()
        (tmp_path / "store" / "config" / "timers.json").unlink()
        import struct
        (tmp_path / "store" / "config" / "timercheck").write_bytes(struct.pack(">qqqq", now - 5_000, 0, 2, 2) + bytes(4064))
        h.open()
        h.clock.advance(1_000)
        assert h.release() == 1
        assert [bytes(m.body) for m in h.store.get("D", 0, 0).messages] == [b"pending"]
    finally:
        h.close()
        h.loop.close()


def test_recall_before_the_due_time_cancels_for_good(th):
    result = th.delay("D", b"recalled", 5_000)
    th.delay("D", b"kept", 5_000)
    assert result.recall_handle
    assert th.run(th.broker.recall("D", result.recall_handle)) == result.message_id
    th.store.wait_dispatched()
    assert th.store.max_offset(timers.TIMER_TOPIC, 0) == 3  # two timers and the marker
    th.reopen()  # the marker is durable
    th.clock.advance(5_000)
    assert th.release() == 1
    assert th.topic_bodies("D") == [b"kept"]


def test_recall_refusals_are_those_of_rocketmq(th):
    result = th.delay("D", b"x", 1_000)
    admin.create_topic(th.broker, "N", 2, "NORMAL")
    cases = [
        ("N", result.recall_handle, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ("Missing", result.recall_handle, Code.TOPIC_NOT_FOUND),
        ("D", "not a handle!", Code.INTERNAL_SERVER_ERROR),
        ("D", base64.urlsafe_b64encode(b"v1 Other tidemq 1 X").decode(), Code.INTERNAL_SERVER_ERROR),
    ]
    for topic, handle, code in cases:
        with pytest.raises(BrokerError) as err:
            th.run(th.broker.recall(topic, handle))
        assert err.value.code == code, (topic, handle)
    th.clock.advance(1_000)
    th.release()
    th.clock.advance(1)
    with pytest.raises(BrokerError) as err:  # delivered: its time has passed
        th.run(th.broker.recall("D", result.recall_handle))
    assert err.value.code == Code.INTERNAL_SERVER_ERROR and "timestamp invalid" in err.value.message
    assert th.topic_bodies("D") == [b"x"]


def test_delay_levels_go_through_the_schedule_topic_and_are_due_from_their_store_time(th):
    th.send("D", b"level2", delay_level=2)  # 5 s
    th.send("D", b"level1", delay_level=1)  # 1 s
    assert th.store.max_offset(timers.SCHEDULE_TOPIC, 1) == 1 and th.store.max_offset(timers.SCHEDULE_TOPIC, 0) == 1
    (kept,) = th.store.get(timers.SCHEDULE_TOPIC, 1, 0).messages
    assert kept.properties["DELAY"] == "2" and kept.properties["REAL_TOPIC"] == "D"
    th.clock.advance(999)
    assert th.release() == 0
    th.clock.advance(1)
    assert th.release() == 1
    th.clock.advance(4_000)
    assert th.release() == 1
    assert th.topic_bodies("D") == [b"level1", b"level2"]
    (m,) = [m for q in range(2) for m in th.store.get("D", q, 0).messages if bytes(m.body) == b"level2"]
    assert "DELAY" not in m.properties
    th.reopen()
    th.clock.advance(10_000)
    assert th.release() == 0


def test_the_background_service_releases_without_being_asked(tmp_path):
    th = TimerHarness.__new__(TimerHarness)
    th.background = True
    TimerHarness.__init__(th, tmp_path / "store")
    admin.create_topic(th.broker, "D", 2, "DELAY")
    th.delay("D", b"soon", 1)

    async def wait_for_release():
        for _ in range(200):
            if th.store.max_offset("D", 0) + th.store.max_offset("D", 1):
                return True
            await asyncio.sleep(0.01)
        return False

    th.clock.advance(1)
    th.broker.timers.wake()
    try:
        assert th.run(wait_for_release())
    finally:
        th.close()
        th.loop.close()


def test_rocketmq_checkpoints_are_written_for_rocketmq_to_go_on_from(th):
    import json
    import struct

    th.delay("D", b"first", 1_000)
    th.delay("D", b"second", 5_000)
    th.send("D", b"level", delay_level=1)
    th.clock.advance(1_000)
    assert th.release() == 2
    th.close()
    config = th.directory / "config"
    page = (config / "timercheck").read_bytes()
    assert len(page) == 4096
    read_time, flush_pos, queue_offset, master_offset = struct.unpack_from(">qqqq", page)
    assert (read_time, queue_offset, master_offset) == (th.clock(), 1, 1)  # "second" is pending
    assert json.loads((config / "delayOffset.json").read_text())["offsetTable"] == {"1": 1}
    th.open()


def test_rocketmq_delay_offsets_are_read_when_rocketmq_wrote_them(th):
    th.send("D", b"released by rocketmq", delay_level=1)
    th.send("D", b"pending", delay_level=1)
    th.close()
    # RocketMQ ran on the store since and released the first (its JSON leaves the key unquoted)
    (th.directory / "config" / "delayOffset.json").write_text('{"offsetTable":{1:1},"dataVersion":{"counter":3}}')
    th.open()
    th.clock.advance(1_000)
    assert th.release() == 1
    assert th.topic_bodies("D") == [b"pending"]


def test_a_checkpoint_written_before_the_timer_queue_is_read_again_keeps_what_went_out(th):
    th.delays("D", 1_000, 2_000, 3_000)
    th.clock.advance(1_000)
    assert th.release() == 1
    th.reopen()
    th.broker.timers.checkpoint()  # nothing read since the open yet
    th.reopen()
    th.clock.advance(5_000)
    assert th.release() == 2
    assert th.topic_bodies("D") == [b"1000", b"2000", b"3000"]
