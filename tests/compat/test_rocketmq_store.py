"""Round trips with the real Apache RocketMQ 5.5.0 on the same store directories.

- RocketMQ writes (normal messages with non-BMP tags, several keys, user properties, bodies it
  compresses; a batch; delay levels; LMQ multi-dispatch; a 256-queue topic): tidemq checks the
  store sound, rebuilds every ConsumeQueue and the index byte for byte, and delivers every
  message with RocketMQ's message id.
- tidemq writes (topics, groups, messages, a group's consumption): RocketMQ recovers to the same
  log end, lists the topics and groups, finds messages by unique key and by key, and continues
  the group from tidemq's consumed offsets; tidemq then continues from RocketMQ's.
"""

from __future__ import annotations

import asyncio
import subprocess
import zlib
from pathlib import Path

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from tidemq.broker import Broker, BrokerConfig, Publish, ReceiveRequest
from tidemq.broker.metadata import GroupConfig, TopicConfig
from tidemq.pipeline.rebuild import rebuild
from tidemq.protocol.grpc.convert import fill_delivered_message
from tidemq.store import Message, MessageStore, StoreConfig
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


def copy_store(source: Path, target: Path) -> Path:
    subprocess.run(["cp", "-r", "--sparse=always", str(source), str(target)], check=True)
    return target


def test_tidemq_checks_rocketmqs_store_sound(rocketmq_store):
    store, sent = rocketmq_store
    report = check.check(store)
    assert report.problems == []
    assert report.records == len(sent) == 40 + 10 + 5 + 6 + 260
    assert report.units == len(sent) + LMQ_UNITS


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
    for relative in theirs_files:  # files are preallocated: their meaningful prefix is compared
        assert (ours / relative).read_bytes().rstrip(b"\0") == (store / relative).read_bytes().rstrip(b"\0"), relative
    # index files are named after when each was created, which the log does not say: same bytes
    theirs_index = sorted((store / "index").iterdir())
    ours_index = sorted((ours / "index").iterdir())
    assert len(ours_index) == len(theirs_index) == 1
    assert ours_index[0].read_bytes() == theirs_index[0].read_bytes()


class InProcessBroker:
    """tidemq's broker on a store, on a private event loop."""

    def __init__(self, store: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = MessageStore(store, StoreConfig())
        self.broker = Broker(self.store, BrokerConfig())
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        self.broker.start(asyncio.get_running_loop())

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def receive_all(self, group: str, topic: str, expected: int) -> list:
        got: list = []
        for _ in range(expected // 16 + 20):
            batch = self.run(self.broker.receive(ReceiveRequest(group=group, topic=topic, batch_size=32)))
            got.extend(batch)
            if not batch and len(got) >= expected:
                break
        return got

    def close(self) -> None:
        self.run(self.broker.close())
        self.store.close()
        self.loop.close()


def delivered_id(received) -> pb.Message:
    m = pb.Message()
    fill_delivered_message(m, received.record, "", received.receipt_handle, received.delivery_attempt, 30_000)
    return m


def test_tidemq_delivers_rocketmqs_messages_with_their_ids(rocketmq_store, tmp_path):
    source, sent = rocketmq_store
    served = InProcessBroker(copy_store(source, tmp_path / "store"))
    try:
        for topic in ("CompatTopic", "CompatWide", "CompatParent"):
            expected = {line["msgId"]: line for line in sent if line["topic"] == topic and line["kind"] != "delay"}
            got = served.receive_all("compat_readers", topic, len(expected))
            messages = {delivered_id(r).system_properties.message_id: (r, delivered_id(r)) for r in got}
            assert sorted(messages) == sorted(expected), topic
            for message_id, (received, message) in messages.items():
                line = expected[message_id]
                body = bytes(received.record.body)
                if received.record.sysflag & 0x1:  # RocketMQ compressed it (zlib)
                    body = zlib.decompress(body)
                assert body.decode() == line["body"]
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


# ---------------------------------------------------------------------------------------------
# tidemq writes, RocketMQ reads


@pytest.fixture(scope="module")
def tidemq_store(tmp_path_factory):
    """A store tidemq's broker wrote: two topics, a group that consumed part of one."""
    store = tmp_path_factory.mktemp("written-by-tidemq") / "store"
    served = InProcessBroker(store)
    try:
        served.broker.metadata.put_topic(TopicConfig("TideTopic", queue_nums=4))
        served.broker.metadata.put_topic(TopicConfig("TideFifo", queue_nums=2, message_type="FIFO"))
        served.broker.metadata.put_group(GroupConfig("tide_group", retry_max_times=7))
        sent = []
        for i in range(40):
            message_id = f"01{i:030X}"
            publish = Publish(topic="TideTopic", body=b"tide %d" % i, message_id=message_id,
                              tag=["x", "y"][i % 2], keys=[f"tk{i}", "tide-all"], properties={"n": str(i)})
            sent.append((message_id, served.run(served.broker.send(publish))))
        assert served.store.wait_dispatched()
        consumed = served.run(served.broker.receive(ReceiveRequest(group="tide_group", topic="TideTopic", batch_size=15)))
        assert len(consumed) == 15
        for received in consumed:
            served.broker.ack("tide_group", "TideTopic", received.receipt_handle)
        log_end = served.store.commit_log.write_position
        max_offsets = {q: served.store.max_offset("TideTopic", q) for q in range(4)}
    finally:
        served.close()
    consumed_ids = {r.record.unique_key for r in consumed}
    return store, sent, consumed_ids, log_end, max_offsets


def test_rocketmq_opens_tidemqs_store_and_continues_its_group(rocketmq, tidemq_store):
    store, sent, consumed_ids, log_end, max_offsets = tidemq_store
    rocketmq.start_broker(store)
    try:
        first_id, _ = sent[3]
        summary, fifo, topic, by_id, by_key = rocketmq.tool(
            "admin", rocketmq.namesrv_addr, rocketmq.broker_addr,
            "topic:TideFifo", "topic:TideTopic", f"uniq:TideTopic:{first_id}", "key:TideTopic:tk5",
        )
        assert {"TideTopic", "TideFifo"} <= set(summary["topics"])
        assert "tide_group" in summary["groups"]
        assert int(summary["runtime"]["commitLogMaxOffset"]) == log_end
        assert fifo["attributes"] == {"message.type": "FIFO"} and fifo["readQueueNums"] == 2
        assert {int(q): offset for q, offset in topic["maxOffsets"].items()} == max_offsets
        assert by_id["found"] == ["tide 3"]
        assert by_key["found"] == ["tide 5"]
        received = rocketmq.tool("consume", rocketmq.namesrv_addr, "tide_group", "TideTopic", "25")
    finally:
        rocketmq.stop_broker()
    # the rest of the messages, each once, with the producer's ids
    assert sorted(line["msgId"] for line in received) == sorted(i for i, _ in sent if i not in consumed_ids)
    by_id = {i: result for i, result in sent}
    for line in received:
        assert (line["queueId"], line["queueOffset"]) == (by_id[line["msgId"]].queue_id, by_id[line["msgId"]].queue_offset)
    # back in tidemq: the store is sound, and the group continues from RocketMQ's offsets
    assert check.check(store).problems == []
    served = InProcessBroker(store)
    try:
        assert served.run(served.broker.receive(ReceiveRequest(group="tide_group", topic="TideTopic"))) == []
    finally:
        served.close()
