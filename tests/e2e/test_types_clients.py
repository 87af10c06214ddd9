"""FIFO, transactions and delay messages with the official Java 5.2.0 and Go v5.1.4 clients
(tests/e2e/clients.py) against one real server: a FIFO group's Simple and Push consumers get each
message group strictly in order while every third message fails its first delivery, and a Push
consumer forwards a message that always fails to the dead-letter queue, in order; transaction
producers' orphaned half messages are resolved by their checkers through the check-back (commit:
delivered, rollback: never); delay messages arrive no earlier than their delivery time.  (Commit
and rollback by the producer itself: test_transactions.py.)"""

from __future__ import annotations

import itertools

import pytest
from rocketmq import FilterExpression

from tidemq.protocol.grpc import admin_call

from .server import running, tidemq
from .test_sdk import Clients, receive_all, unique
from .test_transactions import assert_only_committed

GROUPS, PER_GROUP = 3, 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker that checks open transactions 1 s after their birth, then every 0.3 s, and tells
    push consumers to poll for 2 s (a closing push consumer waits for its polls to end)."""
    with running(tmp_path_factory.mktemp("broker") / "store", "--transaction-timeout-ms", "1000",
                 "--transaction-check-interval-ms", "300", "--long-polling-timeout-ms", "2000") as server:
        yield server


def create_topic(server, kind: str) -> str:
    topic = unique(kind.title())
    assert tidemq("topic", "create", topic, "--type", kind, "--queues", "2", "--server", server.address).returncode == 0
    return topic


def check_group_order(received: list[dict]) -> None:
    """Per message group, deliveries go 0, 1, ... (message i of group i mod GROUPS is its
    i // GROUPS-th), repeating only the latest one (a retry) and ending with every message consumed."""
    by_group: dict[str, list[int]] = {}
    for line in received:
        index = int(line["body"])
        assert line["message_group"] == f"group-{index % GROUPS}"
        by_group.setdefault(line["message_group"], []).append(index // GROUPS)
    assert len(by_group) == GROUPS
    for group, seqs in by_group.items():
        for before, after in itertools.pairwise(seqs):
            assert after in (before, before + 1), f"{group}: {before} then {after} in {seqs}"
        assert seqs[0] == 0 and seqs[-1] == PER_GROUP - 1, seqs


def fifo_group(server, name: str, max_attempts: int) -> str:
    group = unique(name)
    admin_call(server.address, "CreateGroup", name=group, max_attempts=max_attempts, retry_backoff_ms=[10, 10],
               fifo=True)
    return group


@pytest.mark.parametrize("language", ["java", "go"])
def test_fifo_simple_and_push_consumers_get_each_message_group_in_order_through_retries(broker, request, language):
    client = request.getfixturevalue(f"{language}_client")
    topic, count = create_topic(broker, "FIFO"), GROUPS * PER_GROUP
    receiving = {}
    for consumer in ("simple", "push"):  # a FIFO group each, receiving while the producer sends
        receiving[consumer] = client.start("receive", broker.address, "--topic", topic, "--group",
                                           fifo_group(broker, f"Fifo{consumer.title()}G", 5), "--count", count,
                                           f"--{consumer}", "--fail-every", 3, "--await-ms", 1000, "--timeout-ms", 90_000)
    # and a push consumer for which message 4 (the second of group-1) always fails: after its two
    # local attempts it goes to the dead-letter queue and its group goes on
    poisoned = fifo_group(broker, "FifoPoisonG", 2)
    receiving["poisoned"] = client.start("receive", broker.address, "--topic", topic, "--group", poisoned,
                                         "--count", count - 1, "--push", "--poison", 4, "--timeout-ms", 90_000)
    sent = client.run("send", broker.address, "--topic", topic, "--type", "FIFO", "--groups", GROUPS,
                      "--count", count, "--body", "{i}").check().events("sent")
    assert len(sent) == count
    for consumer, run in receiving.items():
        received = run.wait().check().events("received")
        check_group_order(received)
        assert {line["message_id"] for line in received} == {line["message_id"] for line in sent}
        failed = [line for line in received if line["failed"]]
        if consumer == "poisoned":
            assert [line["body"] for line in failed] == ["4", "4"]
        else:
            assert len(failed) == count // 3
        if consumer == "simple":  # a failed message comes back from the broker as its next attempt
            assert all(line["delivery_attempt"] == 1 for line in failed)
            assert sum(1 for line in received if line["delivery_attempt"] == 2) == len(failed)
    clients = Clients(broker)
    try:
        dlq = clients.simple(unique("DLQReader"), {f"%DLQ%{poisoned}": FilterExpression()}, await_duration=1)
        (dead,) = receive_all(dlq, 1)
        assert dead.body == b"4" and dead.message_group == "group-1"
    finally:
        clients.close()


@pytest.mark.parametrize("language", ["java", "go"])
def test_transaction_checkers_resolve_orphaned_half_messages(broker, request, language):
    client = request.getfixturevalue(f"{language}_client")
    topic = create_topic(broker, "TRANSACTION")
    checked = {}
    for answer in ("commit", "rollback"):  # the producer never ends these: the broker asks its checker
        run = client.run("send", broker.address, "--topic", topic, "--type", "TRANSACTION", "--count", 2,
                         "--body", f"{answer}-{{i}}", "--transaction", "none", "--check", answer,
                         "--await-checks", 2, "--timeout-ms", 30_000).check()
        checked[answer] = {(line["topic"], line["body"]) for line in run.events("checked")}
    assert checked == {answer: {(topic, f"{answer}-0"), (topic, f"{answer}-1")} for answer in ("commit", "rollback")}
    assert_only_committed(broker, topic, {b"commit-0", b"commit-1"})


@pytest.mark.parametrize("language", ["java", "go"])
def test_delay_messages_arrive_no_earlier_than_their_time(broker, request, language):
    client = request.getfixturevalue(f"{language}_client")
    topic = create_topic(broker, "DELAY")
    receiving = client.start("receive", broker.address, "--topic", topic, "--group", unique("DelayG"), "--count", 3,
                             "--simple", "--await-ms", 1000, "--timeout-ms", 90_000)
    sent = client.run("send", broker.address, "--topic", topic, "--type", "DELAY", "--delay-ms", 1500,
                      "--count", 3).check().events("sent")
    received = receiving.wait().check().events("received")
    assert sorted(line["message_id"] for line in received) == sorted(line["message_id"] for line in sent)
    for line in received:
        assert line["delivery_timestamp"] is not None
        assert line["received_at"] >= line["delivery_timestamp"]
