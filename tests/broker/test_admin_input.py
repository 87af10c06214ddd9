"""Bad input to the admin and in the config files: every field's type and range is checked, a
bad persisted entry is left out without breaking the others, an invalid file is named, and an
existing group is updated explicitly, never overwritten by a create."""

import json
import logging

import pytest

from tidemq.broker import BrokerError, Code, admin


@pytest.mark.parametrize("queue_nums", [5.5, "8", True, 0, 1025, -1])
def test_a_topic_with_a_bad_queue_count_is_refused_and_not_persisted(harness, queue_nums):
    with pytest.raises(BrokerError) as refused:
        admin.create_topic(harness.broker, "Bad", queue_nums)
    assert refused.value.code == Code.BAD_REQUEST and "queue count" in refused.value.message
    assert "Bad" not in harness.broker.metadata.topics
    harness.close()
    harness.open()
    assert "Bad" not in harness.broker.metadata.topics


@pytest.mark.parametrize("arguments, field", [
    (dict(name=5, queue_nums=8), "topic name"),
    (dict(name="T", queue_nums=8, message_type=3), "topic type"),
    (dict(name="T", queue_nums=8, message_type="PUSHY"), "topic type"),
])
def test_other_bad_topic_fields_are_refused(harness, arguments, field):
    with pytest.raises(BrokerError) as refused:
        admin.create_topic(harness.broker, **arguments)
    assert refused.value.code == Code.BAD_REQUEST and field in refused.value.message


@pytest.mark.parametrize("arguments, field", [
    (dict(max_attempts=2.5), "max attempts"),
    (dict(max_attempts="3"), "max attempts"),
    (dict(max_attempts=0), "max attempts"),
    (dict(retry_backoff_ms=[1000, "5s"]), "retry backoff"),
    (dict(retry_backoff_ms=[-1]), "retry backoff"),
    (dict(retry_backoff_ms="1000"), "retry backoff"),
    (dict(retry_backoff_ms=[]), "retry backoff"),
])
def test_bad_group_fields_are_refused_and_change_nothing(harness, arguments, field):
    admin.create_group(harness.broker, "G", max_attempts=4)
    with pytest.raises(BrokerError) as refused:
        admin.update_group(harness.broker, "G", **arguments)
    assert refused.value.code == Code.BAD_REQUEST and field in refused.value.message
    group = harness.broker.metadata.groups["G"]
    assert group.max_delivery_attempts == 4 and group.retry_backoff_ms[0] == 1000


def test_creating_an_existing_group_is_refused_and_update_changes_it(harness):
    admin.create_group(harness.broker, "G", max_attempts=4)
    with pytest.raises(BrokerError) as refused:
        admin.create_group(harness.broker, "G", max_attempts=9)
    assert refused.value.code == Code.BAD_REQUEST and "exists" in refused.value.message
    assert harness.broker.metadata.groups["G"].max_delivery_attempts == 4
    updated = admin.update_group(harness.broker, "G", retry_backoff_ms=[2000])
    assert updated["max_attempts"] == 4 and updated["retry_backoff_ms"] == [2000]
    with pytest.raises(BrokerError) as missing:
        admin.update_group(harness.broker, "Nobody", max_attempts=2)
    assert missing.value.code == Code.CONSUMER_GROUP_NOT_FOUND


def test_a_bad_persisted_entry_is_left_out_and_the_others_work(harness, caplog):
    admin.create_topic(harness.broker, "Good", 2)
    admin.create_group(harness.broker, "G", max_attempts=3)
    harness.close()
    config = harness.directory / "config"
    topics = json.loads((config / "topics.json").read_text())
    table = topics["topicConfigTable"]
    table["Broken"] = {**table["Good"], "topicName": "Broken", "attributes": {"message.type": "BOGUS"}}
    table["Odd"] = ["not", "an", "object"]
    (config / "topics.json").write_text(json.dumps(topics))
    groups = json.loads((config / "subscriptionGroup.json").read_text())
    table = groups["subscriptionGroupTable"]
    table["Bad"] = {**table["G"], "groupName": "Bad", "retryMaxTimes": "many"}
    (config / "subscriptionGroup.json").write_text(json.dumps(groups))
    with caplog.at_level(logging.ERROR):
        harness.open()
    assert "topics.json" in caplog.text and "'Broken' left out" in caplog.text and "'Odd' left out" in caplog.text
    assert "subscriptionGroup.json" in caplog.text and "'Bad' left out" in caplog.text
    names = {t["name"] for t in admin.list_topics(harness.broker)}
    assert "Good" in names and "Broken" not in names
    assert harness.broker.route("Good").queue_nums == 2
    assert [g["name"] for g in admin.list_groups(harness.broker)] == ["G"]
    harness.send("Good", b"still works")


@pytest.mark.parametrize("name, text", [("topics.json", '{"a": '), ("subscriptionGroup.json", "[1, 2]")])
def test_an_invalid_config_file_stops_the_broker_naming_the_file(harness, name, text):
    harness.close()
    (harness.directory / "config").mkdir(exist_ok=True)
    (harness.directory / "config" / name).write_text(text)
    with pytest.raises(ValueError, match=f"config file .*{name}"):
        harness.open()
    harness.store.close()
    (harness.directory / "config" / name).unlink()
    harness.open()  # for the fixture's close
