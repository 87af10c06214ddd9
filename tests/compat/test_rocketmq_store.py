"""RocketMQ 5.5.0 writes a store, tidemq reads it (`test_rocketmq_turns.py` goes the other way).

RocketMQ writes normal messages with non-BMP tags, several keys, user properties and bodies it
compresses; a batch; delay levels; timer messages; committed, rolled-back and open transactions;
FIFO message groups; LMQ multi-dispatch; a 256-queue topic.  tidemq checks the store sound,
rebuilds every ConsumeQueue and the index byte for byte, delivers every message with RocketMQ's
message id and plain body, fires the delay and timer messages at their time, delivers the
committed transactions only and resolves the open ones, and keeps each message group in order.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from rocketmq import FilterExpression, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from tidemq_side import Clock, InProcessBroker, copy_store, delivered, move_to, serving

from tidemq.broker import ReceiveRequest, fifo
from tidemq.broker.metadata import GroupConfig
from tidemq.broker.timers import PROPERTY_TIMER_DEQUEUE_MS, PROPERTY_TIMER_OUT_MS, SCHEDULE_TOPIC, TIMER_TOPIC
from tidemq.broker.transactions import COMMIT, HALF_TOPIC, OP_TOPIC
from tidemq.pipeline.rebuild import rebuild
from tidemq.store import Message, MessageStore, StoreConfig
from tidemq.store.format.special_queues import deliver_timestamp
from tidemq.store.recovery import check

MULTI = "INNER_MULTI_DISPATCH"
LMQ_UNITS = 3 * 2 + 3 * 1  # CompatTool's six LMQ messages: three go to two light queues, three to one


# ---------------------------------------------------------------------------------------------
# RocketMQ writes, tidemq reads


@pytest.fixture(scope="module")
def rocketmq_store(rocketmq, tmp_path_factory):
    """A store RocketMQ wrote (and shut down cleanly), and what CompatTool sent."""
    store = tmp_path_factory.mktemp("written-by-rocketmq") / "store"
    rocketmq.start_broker(store)
    try:
        sent = rocketmq.tool("produce", rocketmq.namesrv_addr, rocketmq.broker_addr)
    finally:
        rocketmq.stop_broker()
    assert not (store / "abort").exists()
    return store, sent


def of_kind(sent: list[dict], *kinds: str) -> list[dict]:
    return [line for line in sent if line["kind"] in kinds]


def test_tidemq_checks_rocketmqs_store_sound(rocketmq_store):
    store, sent = rocketmq_store
    report = check.check(store)
    assert report.problems == []
    plain = [line for line in sent if not line["kind"].startswith("tx-")]
    assert len(plain) == 40 + 10 + 5 + 6 + 260 + 4 + 12 + 1
    # the pop's checkpoint record; six half messages, the two committed messages, op messages
    # (RocketMQ batches them), and a copy of an open one for each check
    assert report.records >= len(plain) + 1 + 6 + 2 + 1
    assert report.units == report.records + LMQ_UNITS  # RocketMQ writes no PREPARED record


def test_rebuild_gives_rocketmqs_consume_queues_and_index_byte_for_byte(rocketmq_store, spark, tmp_path):
    store, _ = rocketmq_store
    rebuild(spark, store, tmp_path / "out")
    ours = tmp_path / "out"
    theirs_files = sorted(p.relative_to(store) for p in (store / "consumequeue").rglob("*") if p.is_file())
    ours_files = sorted(p.relative_to(ours) for p in (ours / "consumequeue").rglob("*") if p.is_file())
    assert ours_files == theirs_files
    topics = {p.parts[1] for p in theirs_files}
    assert {"CompatTopic", "CompatWide", "SCHEDULE_TOPIC_XXXX", "%LMQ%compat_a", "%LMQ%compat_b"} <= topics
    assert len([p for p in theirs_files if p.parts[1] == "CompatWide"]) == 256
    (retry,) = of_kind(rocketmq_store[1], "retry")
    assert len(retry["topic"]) > 127 and retry["topic"] in topics  # v2 records
    assert {"rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "CompatTx"} <= topics
    for relative in theirs_files:  # files are preallocated: their meaningful prefix is compared
        assert (ours / relative).read_bytes().rstrip(b"\0") == (store / relative).read_bytes().rstrip(b"\0"), relative
    # index files are named after when each was created, which the log does not say: same bytes
    theirs_index = sorted((store / "index").iterdir())
    ours_index = sorted((ours / "index").iterdir())
    assert len(ours_index) == len(theirs_index) == 1
    assert ours_index[0].read_bytes() == theirs_index[0].read_bytes()


def test_tidemq_delivers_rocketmqs_messages_with_their_ids(rocketmq_store, tmp_path):
    source, sent = rocketmq_store
    served = InProcessBroker(copy_store(source, tmp_path / "store"))
    try:
        for topic in ("CompatTopic", "CompatWide", "CompatParent"):
            expected = {line["msgId"]: line for line in sent if line["topic"] == topic and line["kind"] != "delay"}
            got = served.receive_all("compat_readers", topic, len(expected))
            messages = {delivered(r).system_properties.message_id: (r, delivered(r)) for r in got}
            assert sorted(messages) == sorted(expected), topic
            if topic == "CompatTopic":
                assert sum(r.record.sysflag & 0x1 for r in got) == 8
            for message_id, (received, message) in messages.items():
                line = expected[message_id]
                # RocketMQ compressed the large bodies with zlib: a client gets them plain
                assert message.system_properties.body_encoding == pb.IDENTITY
                assert message.body.decode() == line["body"]
                assert message.system_properties.tag == line.get("tags", "")
                assert list(message.system_properties.keys) == (line.get("keys") or "").split()
                assert (received.record.queue_id, received.record.queue_offset) == (line["queueId"], line["queueOffset"])
    finally:
        served.close()


def test_tidemq_serves_rocketmqs_light_queues_and_adds_to_them(rocketmq_store, tmp_path):
    source, sent = rocketmq_store
    path = copy_store(source, tmp_path / "store")
    lmq_sent = [line for line in sent if line["kind"] == "lmq"]
    expected = {"%LMQ%compat_a": [line["body"] for line in lmq_sent[0::2]], "%LMQ%compat_b": [line["body"] for line in lmq_sent]}
    with MessageStore(path, StoreConfig()) as store:
        for name, bodies in expected.items():
            got = store.get(name, 0, 0, 32)
            assert [bytes(m.body).decode() for m in got.messages] == bodies
            assert (got.min_offset, got.max_offset) == (0, len(bodies))
            assert store.offset_for_timestamp(name, 0, 0) == 0
        # RocketMQ's file queue goes on in its files; a new light queue goes to the key-value tables
        result = store.put(Message(topic="CompatParent", body=b"more", properties={MULTI: "%LMQ%compat_b,%LMQ%compat_new"}))
        assert store.wait_dispatched()
        assert store.get("%LMQ%compat_b", 0, 6).messages[0].commit_log_offset == result.commit_log_offset
        assert store.get("%LMQ%compat_new", 0, 0).messages[0].commit_log_offset == result.commit_log_offset
    assert (path / "consumequeue" / "%LMQ%compat_b" / "0").is_dir()
    assert not (path / "consumequeue" / "%LMQ%compat_new").exists()
    assert check.check(path).problems == []


def test_rebuild_keeps_rocketmqs_light_file_queues_and_tidemqs_tables(rocketmq_store, spark, tmp_path):
    """A RocketMQ store with LMQs that tidemq then added a light queue to: the rebuild gives
    RocketMQ's light file queues byte for byte and tidemq's light queue in the tables, as the
    store holds them."""
    from tidemq.store.light.kv import KvLightQueues

    path = copy_store(rocketmq_store[0], tmp_path / "store")
    with MessageStore(path, StoreConfig()) as store:
        store.put(Message(topic="CompatParent", body=b"more", properties={MULTI: "%LMQ%compat_b,%LMQ%compat_new"}))
        assert store.wait_dispatched()
    out = tmp_path / "out"

    report = rebuild(spark, path, out, key_index=False)

    assert report.light_queue_store == "kv" and report.light_queues == 1
    for name in ("%LMQ%compat_a", "%LMQ%compat_b"):
        theirs = sorted((path / "consumequeue" / name / "0").iterdir())
        ours = sorted((out / "consumequeue" / name / "0").iterdir())
        assert [p.name for p in ours] == [p.name for p in theirs]
        for mine, rocketmqs in zip(ours, theirs):  # preallocated: the meaningful prefix is compared
            assert mine.read_bytes().rstrip(b"\0") == rocketmqs.read_bytes().rstrip(b"\0")
    assert not (out / "consumequeue" / "%LMQ%compat_new").exists()
    built, kept = KvLightQueues(out / "lightqueue"), KvLightQueues(path / "lightqueue")
    try:
        assert list(built.names_from("%LMQ%")) == ["%LMQ%compat_new"]
        assert built.read_from("%LMQ%compat_new", 0, 10, -1) == kept.read_from("%LMQ%compat_new", 0, 10, -1)
        assert built.read_from("%LMQ%compat_new", 0, 10, -1)[1] == 1
    finally:
        built.close()
        kept.close()


def test_rocketmqs_delay_and_timer_messages_fire_at_their_time_in_tidemq(rocketmq_store, tmp_path):
    source, sent = rocketmq_store
    clock = Clock()
    served = InProcessBroker(copy_store(source, tmp_path / "store"), clock)
    try:
        # when each is due: a timer message at its TIMER_OUT_MS (RocketMQ's wheel has 1 s slots:
        # it stores the delivery time rounded down to one), a delay-level message at its store
        # time plus its level's delay
        timers = {line["msgId"] for line in of_kind(sent, "timer")}
        due = {rec.unique_key: int(rec.properties[PROPERTY_TIMER_OUT_MS])
               for rec in served.store.get(TIMER_TOPIC, 0, 0, 100).messages if rec.unique_key in timers}
        for line in of_kind(sent, "timer"):
            assert line["deliverMs"] - 1000 <= due[line["msgId"]] <= line["deliverMs"]
        delayed = {line["msgId"] for line in of_kind(sent, "delay")}
        for qid in range(18):
            for rec in served.store.get(SCHEDULE_TOPIC, qid, 0, 100).messages:
                if rec.unique_key in delayed:
                    due[rec.unique_key] = deliver_timestamp(int(rec.properties["DELAY"]), rec.store_timestamp)
        assert delayed <= set(due) and len(due) == 4 + 5
        topics = {"CompatTimer": 2, "CompatTopic": 4}
        start = {topic: served.max_offsets(topic, queues) for topic, queues in topics.items()}
        released: dict[str, object] = {}
        for message_id, at in sorted(due.items(), key=lambda item: item[1]):
            if message_id in released:
                continue
            move_to(clock, at - 1)
            assert served.release_timers() == 0, message_id
            move_to(clock, at)
            assert served.release_timers() >= 1
            for topic, queues in topics.items():
                for rec in served.queue_records(topic, queues, start[topic]):
                    released.setdefault(rec.unique_key, rec)
            assert message_id in released
        assert sorted(released) == sorted(due)  # each once, with the producer's id
        for line in of_kind(sent, "timer", "delay"):
            rec = released[line["msgId"]]
            assert (rec.topic, bytes(rec.body).decode(), rec.keys) == (line["topic"], line["body"], [line["keys"]])
            assert rec.tags == line["tags"]
            if line["kind"] == "timer":
                assert int(rec.properties[PROPERTY_TIMER_DEQUEUE_MS]) == due[line["msgId"]]
    finally:
        served.close()


def test_rocketmqs_transactions_in_tidemq(rocketmq_store, tmp_path):
    source, sent = rocketmq_store
    served = InProcessBroker(copy_store(source, tmp_path / "store"))
    try:
        committed = {line["msgId"]: line for line in of_kind(sent, "tx-commit")}
        open_ones = {line["msgId"]: line for line in of_kind(sent, "tx-open")}
        assert len(committed) == len(open_ones) == 2
        assert served.store.max_offset(HALF_TOPIC, 0) >= 6 and served.store.max_offset(OP_TOPIC, 0) >= 1
        got = served.receive_all("compat_tx_readers", "CompatTx", len(committed))
        assert sorted(delivered(r).system_properties.message_id for r in got) == sorted(committed)
        assert sorted(bytes(r.record.body).decode() for r in got) == sorted(line["body"] for line in committed.values())
        # the open transactions are open in tidemq too; committing one delivers it
        assert set(served.broker.transactions.pending) == set(open_ones)
        first, second = sorted(open_ones)
        served.run(served.broker.end_transaction("CompatTx", first, open_ones[first]["transactionId"], COMMIT))
        assert served.store.wait_dispatched()
        (late,) = served.receive_all("compat_tx_readers", "CompatTx", 1)
        assert delivered(late).system_properties.message_id == first
        assert bytes(late.record.body).decode() == open_ones[first]["body"]
        assert set(served.broker.transactions.pending) == {second}
    finally:
        served.close()


def test_rocketmqs_fifo_message_groups_in_tidemq(rocketmq_store, tmp_path):
    source, sent = rocketmq_store
    lines = of_kind(sent, "fifo")
    # tidemq puts a message group on the queue RocketMQ's proxy picks for it
    assert all(line["queueId"] == fifo.queue_for_group(line["messageGroup"], 2) for line in lines)
    assert len({line["queueId"] for line in lines}) == 2
    served = InProcessBroker(copy_store(source, tmp_path / "store"))
    try:
        served.broker.metadata.put_group(GroupConfig("compat_fifo_readers", fifo=True))
        order: dict[str, list[str]] = defaultdict(list)
        for _ in range(len(lines) + 1):
            batch = served.run(served.broker.receive(ReceiveRequest(group="compat_fifo_readers", topic="CompatFifo",
                                                                    batch_size=32)))
            if not batch:
                break
            groups = [delivered(r).system_properties.message_group for r in batch]
            assert len(groups) == len(set(groups))  # one in flight per message group
            for received, group in zip(batch, groups):
                order[group].append(delivered(received).system_properties.message_id)
                served.broker.ack("compat_fifo_readers", "CompatFifo", received.receipt_handle)
        expected: dict[str, list[str]] = defaultdict(list)
        for line in lines:
            expected[line["messageGroup"]].append(line["msgId"])
        assert order == expected
    finally:
        served.close()


def test_serve_gives_the_official_sdk_rocketmqs_messages(rocketmq_store, tmp_path):
    """`tidemq serve` on RocketMQ's store, the Python SDK over a socket: RocketMQ's ids, plain
    bodies (the SDK inflates a body marked GZIP), tags, keys and user properties."""
    source, sent = rocketmq_store
    expected = {line["msgId"]: line for line in of_kind(sent, "normal", "batch")}
    with serving(copy_store(source, tmp_path / "store")) as server:
        consumer = SimpleConsumer(server.config(), "compat_sdk_readers", {"CompatTopic": FilterExpression()},
                                  await_duration=1)
        consumer.startup()
        try:
            got: dict = {}
            for _ in range(len(expected)):
                for message in consumer.receive(32, 30):
                    got[message.message_id] = message
                    consumer.ack(message)
                if len(got) >= len(expected):
                    break
        finally:
            consumer.shutdown()
    assert sorted(got) == sorted(expected)
    for message_id, message in got.items():
        line = expected[message_id]
        assert message.body.decode() == line["body"]
        assert message.tag == line["tags"]
        assert sorted(message.keys) == sorted(line["keys"].split())
        if line["kind"] == "normal":
            assert message.properties["color"] in ("blue", "red")
