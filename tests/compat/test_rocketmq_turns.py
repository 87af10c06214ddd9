"""tidemq and RocketMQ 5.5.0 append to one store in turns (`test_rocketmq_store.py` reads a store
RocketMQ wrote).  The tests run in order, each taking the store where the previous left it:

1. tidemq writes topics, a group that consumes part of a topic, timer messages (some due seconds
   from now, some in an hour), a 4.x delay-level message, committed, rolled-back and open
   transactions, FIFO message groups.  tidemq's clock stands a minute behind the wall clock, so
   the near timers are still pending when it closes the store.
2. RocketMQ opens it: recovers to tidemq's log end, lists the topics and groups, finds messages by
   unique key and by key, continues the group from tidemq's offsets, fires the near timers and
   the delay level (not the far ones), delivers the committed transaction and commits the open
   one through its producer's check-back, delivers each message group in order; then appends.
3. tidemq opens it: sound, continues the group from RocketMQ's offsets (RocketMQ's messages with
   their ids), fires the far timers at their time and nothing twice; then appends.
4. RocketMQ opens it again: recovers to tidemq's new log end and delivers what tidemq appended.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from tidemq_side import Clock, InProcessBroker, delivered, move_to

from tidemq.broker import Publish, ReceiveRequest, fifo
from tidemq.broker.metadata import GroupConfig, TopicConfig
from tidemq.broker.transactions import COMMIT, ROLLBACK
from tidemq.store.recovery import check

BEHIND_MS = 60_000  # tidemq's clock, behind the wall clock while it writes
HOUR_MS = 3_600_000
MESSAGE_GROUPS = ("order-a", "order-b", "order-c")


@pytest.fixture(scope="module")
def turns(tmp_path_factory):
    """The store, and what each turn wrote and saw (filled in by the tests, in order)."""
    return {"store": tmp_path_factory.mktemp("turns") / "store"}


def send(served: InProcessBroker, publish: Publish):
    return served.run(served.broker.send(publish))


def test_1_tidemq_writes(turns):
    wall = Clock().now
    served = InProcessBroker(turns["store"], Clock(wall - BEHIND_MS))
    try:
        metadata = served.broker.metadata
        metadata.put_topic(TopicConfig("TideTopic", queue_nums=4))
        metadata.put_topic(TopicConfig("TideFifo", queue_nums=2, message_type="FIFO"))
        metadata.put_topic(TopicConfig("TideTimer", queue_nums=2, message_type="DELAY"))
        metadata.put_topic(TopicConfig("TideTx", queue_nums=2, message_type="TRANSACTION"))
        metadata.put_group(GroupConfig("tide_group", retry_max_times=7))
        sent = []
        for i in range(40):
            message_id = f"01{i:030X}"
            publish = Publish(topic="TideTopic", body=b"tide %d" % i, message_id=message_id,
                              tag=["x", "y"][i % 2], keys=[f"tk{i}", "tide-all"], properties={"n": str(i)})
            sent.append((message_id, send(served, publish)))
        near = {f"02{i:030X}": wall + 1000 * (i + 1) for i in range(3)}
        far = {f"03{i:030X}": wall + HOUR_MS + 1000 * i for i in range(2)}
        for message_id, due in {**near, **far}.items():
            send(served, Publish(topic="TideTimer", body=message_id.encode(), message_id=message_id,
                                 message_type="DELAY", delivery_timestamp=due, tag="timer"))
        level = f"04{0:030X}"  # level 2: 5 s after its store time, which is a minute ago
        send(served, Publish(topic="TideTimer", body=b"level", message_id=level, message_type="DELAY", delay_level=2))
        transactions = {}
        for i, outcome in enumerate((COMMIT, ROLLBACK, "open")):
            message_id = f"05{i:030X}"
            result = send(served, Publish(topic="TideTx", body=outcome.encode(), message_id=message_id,
                                          message_type="TRANSACTION", tag="tx"))
            transactions[outcome] = message_id
            if outcome != "open":
                served.run(served.broker.end_transaction("TideTx", message_id, result.transaction_id, outcome))
        fifo_sent = []
        for i in range(9):
            message_group, message_id = MESSAGE_GROUPS[i % 3], f"06{i:030X}"
            result = send(served, Publish(topic="TideFifo", body=b"fifo %d" % i, message_id=message_id,
                                          message_type="FIFO", message_group=message_group))
            assert result.queue_id == fifo.queue_for_group(message_group, 2)
            fifo_sent.append((message_group, message_id))
        assert served.store.wait_dispatched()
        served.release_timers()
        assert served.broker.timers.pending() == len(near) + len(far)  # nothing is due on tidemq's clock
        consumed = served.run(served.broker.receive(ReceiveRequest(group="tide_group", topic="TideTopic", batch_size=15)))
        assert len(consumed) == 15
        for received in consumed:
            served.broker.ack("tide_group", "TideTopic", received.receipt_handle)
        turns.update(
            sent=sent, consumed={r.record.unique_key for r in consumed}, near=near, far=far, level=level,
            transactions=transactions, fifo=fifo_sent,
            log_end=served.store.commit_log.write_position, max_offsets=served.max_offsets("TideTopic", 4),
        )
    finally:
        served.close()


def test_2_rocketmq_continues_tidemqs_store(rocketmq, turns):
    store, sent = turns["store"], turns["sent"]
    # check-backs every 3 s, until the checker is there; op messages written within 100 ms, so
    # that a transaction the checker committed is not checked (and committed) again
    rocketmq.start_broker(store, "transactionCheckInterval=3000", "transactionTimeOut=1000", "transactionCheckMax=1000",
                          "transactionOpBatchInterval=100")
    try:
        first_id, _ = sent[3]
        summary, fifo_topic, topic, by_id, by_key = rocketmq.tool(
            "admin", rocketmq.namesrv_addr, rocketmq.broker_addr,
            "topic:TideFifo", "topic:TideTopic", f"uniq:TideTopic:{first_id}", "key:TideTopic:tk5",
        )
        assert {"TideTopic", "TideFifo", "TideTimer", "TideTx"} <= set(summary["topics"])
        assert "tide_group" in summary["groups"]
        # (RocketMQ appends from the start: the due timers, transaction checks)
        assert int(summary["runtime"]["commitLogMaxOffset"]) >= turns["log_end"]
        assert fifo_topic["attributes"] == {"message.type": "FIFO"} and fifo_topic["readQueueNums"] == 2
        assert {int(q): offset for q, offset in topic["maxOffsets"].items()} == turns["max_offsets"]
        assert by_id["found"] == ["tide 3"]
        assert by_key["found"] == ["tide 5"]
        received = rocketmq.tool("consume", rocketmq.namesrv_addr, "tide_group", "TideTopic", "25")
        fired = rocketmq.tool("consume", rocketmq.namesrv_addr, "tide_timer_readers", "TideTimer",
                              str(len(turns["near"]) + 1))
        tx_lines = rocketmq.tool("txconsume", rocketmq.namesrv_addr, "TideTx", "tide_tx_readers", "TideTx", "2")
        fifo_lines = rocketmq.tool("consume", rocketmq.namesrv_addr, "tide_fifo_readers", "TideFifo", "9")
        appended = rocketmq.tool("append", rocketmq.namesrv_addr, "TideTopic", "6")
    finally:
        rocketmq.stop_broker()
    # the rest of the group's messages, each once, with the producer's ids and places
    assert sorted(line["msgId"] for line in received) == sorted(i for i, _ in sent if i not in turns["consumed"])
    by_id = {i: result for i, result in sent}
    for line in received:
        assert (line["queueId"], line["queueOffset"]) == (by_id[line["msgId"]].queue_id, by_id[line["msgId"]].queue_offset)
    # the near timers and the delay level fired, the far timers did not
    assert sorted(line["msgId"] for line in fired) == sorted([*turns["near"], turns["level"]])
    for line in fired:
        if line["msgId"] in turns["near"]:
            assert line["body"] == line["msgId"]
            # released when due, not before (RocketMQ's wheel: in the 1 s slot of the due time)
            assert line["storeTimestamp"] >= turns["near"][line["msgId"]] // 1000 * 1000
    # the committed transaction, and the open one once RocketMQ checked it back and was told COMMIT
    tx = turns["transactions"]
    assert sorted(line["msgId"] for line in tx_lines if "msgId" in line) == sorted([tx[COMMIT], tx["open"]])
    assert {line["checked"] for line in tx_lines if "checked" in line} == {tx["open"]}
    # each message group in order, on its queue
    order: dict[str, list[str]] = defaultdict(list)
    for line in sorted(fifo_lines, key=lambda line: (line["queueId"], line["queueOffset"])):
        group = line["properties"]["__SHARDINGKEY"]
        assert line["queueId"] == fifo.queue_for_group(group, 2)
        order[group].append(line["msgId"])
    expected: dict[str, list[str]] = defaultdict(list)
    for group, message_id in turns["fifo"]:
        expected[group].append(message_id)
    assert order == expected
    turns["appended_by_rocketmq"] = appended


def test_3_tidemq_continues_rocketmqs_turn(turns):
    store = turns["store"]
    assert check.check(store).problems == []
    clock = Clock()
    served = InProcessBroker(store, clock)
    try:
        # RocketMQ recovered to tidemq's log end: its first record starts there
        first = served.store.read_record(turns["log_end"])
        assert first is not None and first.commit_log_offset == turns["log_end"]
        # the group continues from RocketMQ's offsets: RocketMQ's messages, with their ids
        got = served.receive_all("tide_group", "TideTopic", 6)
        assert sorted(delivered(r).system_properties.message_id for r in got) == sorted(
            line["msgId"] for line in turns["appended_by_rocketmq"])
        for received in got:
            served.broker.ack("tide_group", "TideTopic", received.receipt_handle)
        # RocketMQ committed the open transaction
        assert served.broker.transactions.pending == {}
        # the far timers fire at their time; nothing RocketMQ fired goes out again
        start = served.max_offsets("TideTimer", 2)
        for message_id, due in sorted(turns["far"].items(), key=lambda item: item[1]):
            move_to(clock, due - 1)
            served.release_timers()
            out = [r.unique_key for r in served.queue_records("TideTimer", 2, start)]
            assert message_id not in out
            move_to(clock, due)
            served.release_timers()
            out = [r.unique_key for r in served.queue_records("TideTimer", 2, start)]
            assert message_id in out
        assert sorted(out) == sorted(turns["far"])
        assert served.broker.timers.pending() == 0
        # tidemq's turn to append
        more = []
        for i in range(5):
            message_id = f"07{i:030X}"
            send(served, Publish(topic="TideTopic", body=b"tide again %d" % i, message_id=message_id, keys=[f"ta{i}"]))
            more.append(message_id)
        assert served.store.wait_dispatched()
        turns.update(more=more, log_end=served.store.commit_log.write_position)
    finally:
        served.close()
    assert check.check(store).problems == []


def test_4_rocketmq_recovers_tidemqs_second_turn(rocketmq, turns):
    store = turns["store"]
    rocketmq.start_broker(store)
    try:
        (summary,) = rocketmq.tool("admin", rocketmq.namesrv_addr, rocketmq.broker_addr)
        assert int(summary["runtime"]["commitLogMaxOffset"]) == turns["log_end"]
        received = rocketmq.tool("consume", rocketmq.namesrv_addr, "tide_group", "TideTopic", "5")
    finally:
        rocketmq.stop_broker()
    assert sorted(line["msgId"] for line in received) == sorted(turns["more"])
