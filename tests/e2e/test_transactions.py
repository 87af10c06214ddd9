"""Transactions with the official Python SDK's producer and checker against a real server: commit,
rollback, and the check-back of orphaned half messages (answered commit, rollback, or unknown
first and commit on the next check); the official Java 5.2.0 and Go v5.1.4 transaction producers
committing and rolling back."""

from __future__ import annotations

import threading

import pytest
from rocketmq import FilterExpression, Message, Producer, TransactionChecker, TransactionResolution

from .server import running, tidemq, wait_until
from .test_sdk import Clients, unique


@pytest.fixture(scope="module")
def tx_server(tmp_path_factory):
    """A broker that checks open transactions 1 s after their birth, then every 0.3 s."""
    with running(tmp_path_factory.mktemp("broker") / "store", "--transaction-timeout-ms", "1000",
                 "--transaction-check-interval-ms", "300") as server:
        yield server


class Checker(TransactionChecker):
    """Answers by the body: `commit...`, `rollback...`, `late...` (unknown once, then commit)."""

    def __init__(self) -> None:
        self.checked: list[tuple[bytes, str]] = []
        self.lock = threading.Lock()

    def check(self, message) -> TransactionResolution:
        with self.lock:
            times = sum(1 for body, _ in self.checked if body == message.body)
            self.checked.append((message.body, message.topic))
        if message.body.startswith(b"commit") or (message.body.startswith(b"late") and times > 0):
            return TransactionResolution.COMMIT
        if message.body.startswith(b"rollback"):
            return TransactionResolution.ROLLBACK
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


def half(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    m.tag = "tx"
    return m


def test_commit_rollback_and_check_back(tx_server):
    clients = Clients(tx_server)
    try:
        topic = unique("Tx")
        assert tidemq("topic", "create", topic, "--type", "TRANSACTION", "--server", tx_server.address).returncode == 0
        checker = Checker()
        producer = Producer(tx_server.config(), (topic,), checker)
        producer.startup()
        clients.started.append(producer)
        consumer = clients.simple(unique("TxG"), {topic: FilterExpression()}, await_duration=1)

        def send(body: bytes):
            transaction = producer.begin_transaction()
            receipt = producer.send(half(topic, body), transaction)
            assert receipt.transaction_id == receipt.message_id
            return transaction

        send(b"committed").commit()
        send(b"rolled back").rollback()
        for body in (b"commit-orphan", b"rollback-orphan", b"late-orphan"):
            send(body)  # the producer never ends these: the broker asks its checker

        got: dict[bytes, str] = {}

        def receive_all():
            for m in consumer.receive(16, 10):
                got[m.body] = m.tag
                consumer.ack(m)
            return {b"committed", b"commit-orphan", b"late-orphan"} <= set(got)

        wait_until(receive_all, timeout=30, what="committed and checked-back messages")
        assert got == {b"committed": "tx", b"commit-orphan": "tx", b"late-orphan": "tx"}
        with checker.lock:
            checked = list(checker.checked)
        assert {body for body, _ in checked} == {b"commit-orphan", b"rollback-orphan", b"late-orphan"}
        assert all(t == topic for _, t in checked)
        assert sum(1 for body, _ in checked if body == b"late-orphan") >= 2  # unknown, then commit
        assert consumer.receive(16, 10) == []  # the rolled back ones never come
    finally:
        clients.close()


def assert_only_committed(server, topic: str, expected: set[bytes]) -> None:
    """A new consumer group of `topic` receives exactly `expected` (the rolled back never come)."""
    clients = Clients(server)
    try:
        consumer = clients.simple(unique("TxG"), {topic: FilterExpression()}, await_duration=1)
        got = set()

        def committed() -> bool:
            for m in consumer.receive(16, 10):
                got.add(m.body)
                consumer.ack(m)
            return len(got) >= len(expected)

        wait_until(committed, timeout=30, what="the committed messages")
        assert got == expected
        assert consumer.receive(16, 10) == []
    finally:
        clients.close()


@pytest.mark.parametrize("language", ["java", "go"])
def test_official_java_and_go_transaction_producers_commit_and_roll_back(tx_server, request, language):
    client = request.getfixturevalue(f"{language}_client")
    topic = unique(f"Tx{language}")
    assert tidemq("topic", "create", topic, "--type", "TRANSACTION", "--server", tx_server.address).returncode == 0
    for outcome in ("commit", "rollback"):
        sent = client.run("send", tx_server.address, "--topic", topic, "--type", "TRANSACTION", "--count", 2,
                          "--body", f"{outcome}-{{i}}", "--transaction", outcome, "--check", outcome).check()
        assert len(sent.events("sent")) == 2
    assert_only_committed(tx_server, topic, {b"commit-0", b"commit-1"})
