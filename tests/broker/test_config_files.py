"""Topics, groups and consumed offsets in RocketMQ 5.5.0's config files (config/topics.json,
subscriptionGroup.json, consumerOffset.json): read, written back with unknown fields intact,
tidemq's earlier files read too."""

from __future__ import annotations

import json

from tidemq.broker.metadata import GroupConfig, Metadata, TopicConfig

from .conftest import Harness

ROCKETMQ_TOPICS = {
    "dataVersion": {"counter": 4, "stateVersion": 0, "timestamp": 1795895015937},
    "topicConfigTable": {
        "CompatFifo": {"attributes": {"message.type": "FIFO"}, "order": False, "perm": 6, "readQueueNums": 2,
                       "topicFilterType": "SINGLE_TAG", "topicName": "CompatFifo", "topicSysFlag": 0,
                       "writeQueueNums": 2, "futureField": [1, 2]},
        "SCHEDULE_TOPIC_XXXX": {"attributes": {}, "order": False, "perm": 6, "readQueueNums": 18,
                                "topicFilterType": "SINGLE_TAG", "topicName": "SCHEDULE_TOPIC_XXXX",
                                "topicSysFlag": 0, "writeQueueNums": 18},
    },
    "topicQueueMappingInfoMap": {},
}
ROCKETMQ_GROUPS = {
    "dataVersion": {"counter": 2, "stateVersion": 0, "timestamp": 1795895015937},
    "forbiddenTable": {},
    "subscriptionGroupTable": {
        "compat_group": {"attributes": {}, "brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True,
                         "consumeFromMinEnable": True, "consumeMessageOrderly": False, "consumeTimeoutMinute": 15,
                         "groupName": "compat_group", "groupRetryPolicy": {"type": "CUSTOMIZED"}, "groupSysFlag": 0,
                         "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 5, "retryQueueNums": 1,
                         "whichBrokerWhenConsumeSlowly": 1},
    },
}


def test_rocketmq_topics_and_groups_are_read_and_written_back_whole(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json").write_text(json.dumps(ROCKETMQ_TOPICS, indent=1))
    (config / "subscriptionGroup.json").write_text(json.dumps(ROCKETMQ_GROUPS, indent=1))
    metadata = Metadata(config)
    assert metadata.topics["CompatFifo"] == TopicConfig("CompatFifo", queue_nums=2, message_type="FIFO", perm=6)
    assert metadata.topics["SCHEDULE_TOPIC_XXXX"].queue_nums == 18
    assert metadata.groups["compat_group"].retry_max_times == 5

    metadata.put_topic(TopicConfig("orders", queue_nums=4, message_type="TRANSACTION"))
    metadata.put_group(GroupConfig("billing", retry_max_times=3, retry_backoff_ms=[1000, 2000]))
    topics = json.loads((config / "topics.json").read_text())
    assert topics["dataVersion"]["counter"] == 5
    assert topics["topicQueueMappingInfoMap"] == {}
    assert topics["topicConfigTable"]["CompatFifo"] == ROCKETMQ_TOPICS["topicConfigTable"]["CompatFifo"]
    assert topics["topicConfigTable"]["orders"] == {
        "topicName": "orders", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0, "order": False, "attributes": {"message.type": "TRANSACTION"},
    }
    assert json.loads((config / "topics.json.bak").read_text()) == ROCKETMQ_TOPICS
    groups = json.loads((config / "subscriptionGroup.json").read_text())
    assert groups["forbiddenTable"] == {}
    assert groups["subscriptionGroupTable"]["compat_group"] == ROCKETMQ_GROUPS["subscriptionGroupTable"]["compat_group"]
    billing = groups["subscriptionGroupTable"]["billing"]
    assert billing["retryMaxTimes"] == 3 and billing["groupName"] == "billing"
    assert billing["groupRetryPolicy"] == {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 2000]}}
    again = Metadata(config)
    assert again.groups["billing"] == GroupConfig("billing", retry_max_times=3, retry_backoff_ms=[1000, 2000])
    assert again.topics == metadata.topics


def test_tidemqs_earlier_files_are_read_and_rewritten_in_rocketmqs_schema(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json").write_text(json.dumps(
        {"orders": {"name": "orders", "queue_nums": 3, "message_type": "FIFO", "perm": 6}}))
    (config / "subscriptionGroups.json").write_text(json.dumps(
        {"billing": {"name": "billing", "retry_max_times": 2, "retry_backoff_ms": [500]}}))
    metadata = Metadata(config)
    assert metadata.topics["orders"] == TopicConfig("orders", queue_nums=3, message_type="FIFO")
    assert metadata.groups["billing"] == GroupConfig("billing", retry_max_times=2, retry_backoff_ms=[500])
    metadata.put_topic(TopicConfig("audit"))
    metadata.put_group(GroupConfig("audit-readers"))
    topics = json.loads((config / "topics.json").read_text())["topicConfigTable"]
    assert topics["orders"]["attributes"] == {"message.type": "FIFO"} and topics["orders"]["readQueueNums"] == 3
    groups = json.loads((config / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]
    assert groups["billing"]["retryMaxTimes"] == 2 and "audit-readers" in groups


def test_a_group_continues_from_the_consumed_offsets_rocketmq_left(tmp_path):
    h = Harness(tmp_path / "store")
    try:
        for i in range(10):
            h.send("orders", b"m%d" % i)
        # all but the last message of each queue consumed elsewhere
        offsets = {qid: h.store.max_offset("orders", qid) - 1 for qid in range(8) if h.store.max_offset("orders", qid)}
        assert sum(offsets.values()) == 2
        h.run(h.broker.close())
        h.store.close()
        # as a RocketMQ 5.5.0 broker with enableLmq leaves them: in lmqConsumerOffset.json,
        # fastjson's bare integer keys
        table = ",".join(f"{qid}:{offset}" for qid, offset in offsets.items())
        (h.directory / "config" / "lmqConsumerOffset.json").write_text(
            '{"dataVersion":{"counter":1,"stateVersion":0},"groupTopicMap":{"billing":["orders"]},'
            '"lmqOffsetTable":{},"offsetTable":{"orders@billing":{' + table + '}},"pullOffsetTable":{}}')
        h.open()
        got = h.receive("billing", "orders", batch=32)
        assert sorted(bytes(r.record.body) for r in got) == sorted(
            b"m%d" % i for i in range(10) if i in _last_of_each_queue(h, offsets))
        for r in got:
            h.broker.ack("billing", "orders", r.receipt_handle)
        h.run(h.broker.close())
        expected = {str(qid): offset + 1 for qid, offset in offsets.items()}
        saved = json.loads((h.directory / "config" / "consumerOffset.json").read_text())
        assert saved["offsetTable"]["orders@billing"] == expected
        saved = json.loads((h.directory / "config" / "lmqConsumerOffset.json").read_text())
        assert saved["offsetTable"]["orders@billing"] == expected
        assert saved["dataVersion"]["counter"] == 2 and saved["groupTopicMap"] == {"billing": ["orders"]}
    finally:
        h.store.close()
        h.loop.close()


def _last_of_each_queue(h, offsets) -> set[int]:
    """Which of the messages m0..m9 are the last of their queue (by body)."""
    last = set()
    for qid, offset in offsets.items():
        (rec,) = h.store.get("orders", qid, offset, 1).messages
        last.add(int(bytes(rec.body)[1:]))
    return last
