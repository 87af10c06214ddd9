"""`tidemq message show|query` and `tidemq dlq resend` against a running broker, with the
official Python SDK producing and consuming."""

from __future__ import annotations

import json
import threading

from rocketmq import ConsumeResult, FilterExpression

from tidemq.broker import BrokerError, Code
from tidemq.protocol.grpc import admin_call

from .server import ServerProcess, tidemq, wait_until
from .test_sdk import Clients, Listener, clients, message, receive_all, unique  # noqa: F401 (fixture)


def _admin(server, method: str, **arguments):
    return admin_call(server.address, method, **arguments)


def _found(server, msg_id, topic=None):
    try:
        return _admin(server, "FindMessages", msg_id=msg_id, topic=topic)
    except BrokerError as exc:
        assert exc.code == Code.MESSAGE_NOT_FOUND
        return None


def test_message_show_by_client_id_and_offset_id(server, clients):
    topic = unique("Show")
    producer = clients.producer(topic)
    receipt = producer.send(message(topic, b"hello lookups", tag="TagA", keys=("order-1", "order-2"), color="red"))
    producer.send(message(topic, b"\x00\xff binary", tag="TagB"))

    (m,) = wait_until(lambda: _found(server, receipt.message_id), what="the message indexed")
    assert (m["topic"], m["message_id"], m["tags"]) == (topic, receipt.message_id, "TagA")
    assert sorted(m["keys"]) == ["order-1", "order-2"] and m["properties"]["color"] == "red"
    assert m["body_size"] == 13 and m["body_text"] == "hello lookups"

    text = tidemq("message", "show", m["offset_msg_id"], "--server", server.address)
    assert text.returncode == 0, text.stderr
    assert f"topic {topic}  queue {m['queue_id']}  queue offset {m['queue_offset']}" in text.stdout
    assert f"message {receipt.message_id}  offset id {m['offset_msg_id']}" in text.stdout
    assert "body 13 bytes: hello lookups" in text.stdout and "tags TagA" in text.stdout

    missing = tidemq("message", "show", "0" * 32, "--server", server.address)
    assert missing.returncode == 2 and "MESSAGE_NOT_FOUND" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    nobody = tidemq("message", "show", receipt.message_id, "--server", "127.0.0.1:1")
    assert nobody.returncode == 1 and "cannot reach a broker at 127.0.0.1:1" in nobody.stderr


def test_message_query_by_key_time_range_and_tag(server, clients):
    topic = unique("Query")
    producer = clients.producer(topic)
    sent = [producer.send(message(topic, b"m%d" % i, tag="Even" if i % 2 == 0 else "Odd", keys=(f"k{i % 3}",)))
            for i in range(9)]
    wait_until(lambda: _found(server, sent[-1].message_id), what="the messages indexed")

    answer = _admin(server, "QueryMessages", topic=topic, key="k1")
    assert sorted(m["message_id"] for m in answer["messages"]) == sorted(
        sent[i].message_id for i in (1, 4, 7))
    assert answer["complete"]
    stored = [m["store_timestamp"] for m in answer["messages"]]
    assert stored == sorted(stored, reverse=True)
    assert _admin(server, "QueryMessages", topic=topic, key="k1", begin=max(stored) + 1)["messages"] == []
    assert len(_admin(server, "QueryMessages", topic=topic, key="k1", end=max(stored))["messages"]) >= 1

    odd = tidemq("message", "query", "--topic", topic, "--tag", "Odd", "--server", server.address, "--json")
    assert odd.returncode == 0, odd.stderr
    assert sorted(m["body_text"] for m in json.loads(odd.stdout)["messages"]) == ["m1", "m3", "m5", "m7"]
    limited = _admin(server, "QueryMessages", topic=topic, tag="Even", max_num=2)
    assert len(limited["messages"]) == 2 and not limited["complete"]
    both = _admin(server, "QueryMessages", topic=topic, key="k0", tag="Odd")["messages"]
    assert sorted(m["body_text"] for m in both) == ["m3"]
    assert _admin(server, "QueryMessages", topic=topic, tag="Neither")["messages"] == []

    nokey = tidemq("message", "query", "--topic", topic, "--server", server.address)
    assert nokey.returncode == 2 and "BAD_REQUEST" in nokey.stderr
    try:
        _admin(server, "QueryMessages", topic=unique("Nothing"), tag="x")
        raise AssertionError("a query of a missing topic answered")
    except BrokerError as exc:
        assert exc.code == Code.TOPIC_NOT_FOUND


class FailFirstDelivery(Listener):
    """Fails each body the first time it sees it, succeeds afterwards: with max attempts 1, each
    message goes to the dead-letter queue once and is consumed once resent."""

    def __init__(self) -> None:
        self.seen = set()
        self.guard = threading.Lock()
        super().__init__(self._decide)

    def _decide(self, m):
        with self.guard:
            first = m.body not in self.seen
            self.seen.add(m.body)
        return ConsumeResult.FAILURE if first else ConsumeResult.SUCCESS


def test_dlq_resend_sends_each_dead_letter_back_once(server, clients):
    topic, group = unique("Dead"), unique("DG")
    _admin(server, "CreateGroup", name=group, max_attempts=1)
    listener = FailFirstDelivery()
    clients.push(group, {topic: FilterExpression()}, listener)
    producer = clients.producer(topic)
    first = producer.send(message(topic, b"poison-1", tag="P", keys=("pk1",), origin="yes"))
    second = producer.send(message(topic, b"poison-2", tag="P"))
    dlq = clients.simple(unique("DLQPeek"), {f"%DLQ%{group}": FilterExpression()}, await_duration=1)
    assert sorted(m.body for m in receive_all(dlq, 2)) == [b"poison-1", b"poison-2"]
    assert sorted(listener.calls) == [(b"poison-1", 1), (b"poison-2", 1)]

    one = _admin(server, "ResendDeadLetters", group=group, id=first.message_id)
    assert [r["message_id"] for r in one["resent"]] == [first.message_id] and one["failed"] == []
    wait_until(lambda: (b"poison-1", 1) in listener.calls[2:], what="the resent message consumed")
    (copy,) = [m for m in _found(server, first.message_id, topic)
               if m["offset_msg_id"] == one["resent"][0]["new_offset_msg_id"]]
    assert (copy["body_text"], copy["tags"], copy["keys"], copy["properties"]["origin"]) == ("poison-1", "P", ["pk1"], "yes")
    assert copy["properties"]["DLQ_RESENT_FROM"] == one["resent"][0]["offset_msg_id"]

    rest = tidemq("dlq", "resend", "--group", group, "--server", server.address)
    assert rest.returncode == 0, rest.stderr
    assert f"%DLQ%{group}: 1 resent, 1 resent before, 0 failed" in rest.stdout
    assert f"(message {second.message_id}) to {topic}/" in rest.stdout
    wait_until(lambda: (b"poison-2", 1) in listener.calls[2:], what="the second resent message consumed")

    again = _admin(server, "ResendDeadLetters", group=group)
    assert again["resent"] == [] and len(again["already_resent"]) == 2
    assert sorted(listener.calls) == [(b"poison-1", 1), (b"poison-1", 1), (b"poison-2", 1), (b"poison-2", 1)]

    try:
        _admin(server, "ResendDeadLetters", group=group, id="0" * 32)
        raise AssertionError("a resend of a missing dead letter answered")
    except BrokerError as exc:
        assert exc.code == Code.MESSAGE_NOT_FOUND
    try:
        _admin(server, "ResendDeadLetters", group=unique("NoGroup"))
        raise AssertionError("a resend for a missing group answered")
    except BrokerError as exc:
        assert exc.code == Code.CONSUMER_GROUP_NOT_FOUND


def test_dlq_resend_after_a_sigkill_does_not_resend_again(tmp_path):
    s = ServerProcess(tmp_path / "store").start()
    topic, group = unique("DeadKill"), unique("DG")
    c = Clients(s)
    try:
        _admin(s, "CreateGroup", name=group, max_attempts=1)
        listener = Listener(lambda m: ConsumeResult.FAILURE)
        c.push(group, {topic: FilterExpression()}, listener)
        sent = c.producer(topic).send(message(topic, b"poison"))
        wait_until(lambda: _found(s, sent.message_id, f"%DLQ%{group}"), what="the dead letter")
    finally:
        c.close()
    (resent,) = _admin(s, "ResendDeadLetters", group=group)["resent"]
    s.kill()
    s.start()
    try:
        again = _admin(s, "ResendDeadLetters", group=group)
        assert again["resent"] == [] and again["already_resent"] == [resent["offset_msg_id"]]
        copies = [m for m in _found(s, sent.message_id, topic) if "DLQ_RESENT_FROM" in m["properties"]]
        assert [m["offset_msg_id"] for m in copies] == [resent["new_offset_msg_id"]]
    finally:
        assert s.stop() == 0, s.log_text()
