"""Transactions over a real store with a virtual clock: half messages invisible until committed,
rollback, check-backs after the immunity time up to transactionCheckMax, RocketMQ's half and op
queues as the only state (a restart rebuilds it)."""

from __future__ import annotations

import asyncio

import pytest

from tidemq.broker import BrokerError, Code, Publish, admin
from tidemq.broker.transactions import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC, TransactionCheck
from tidemq.store import Message

from .conftest import Harness


@pytest.fixture
def tx(tmp_path):
    h = Harness(tmp_path / "store", transaction_timeout_ms=6_000, transaction_check_interval_ms=30_000,
                transaction_check_max=2)
    admin.create_topic(h.broker, "T", 2, "TRANSACTION")
    yield h
    h.close()
    h.loop.close()


def prepare(h: Harness, body: bytes, message_id: str, **kw):
    result = h.run(h.broker.send(Publish(topic="T", body=body, message_id=message_id, message_type="TRANSACTION",
                                         tag="t", keys=["k1"], properties={"p": "v"}, **kw)))
    h.store.wait_dispatched()
    return result


def end(h: Harness, transaction_id: str, resolution: str, message_id: str = ""):
    h.run(h.broker.end_transaction("T", message_id or transaction_id, transaction_id, resolution))
    h.store.wait_dispatched()


def queue(h: Harness, topic: str) -> list:
    return h.store.get(topic, 0, 0, 100).messages


def producer(h: Harness, client_id: str = "p1") -> asyncio.Queue:
    h.broker.client_settings(client_id, "PRODUCER", "", ["T"])
    return h.broker.telemetry_opened(client_id)


def checks(outbox: asyncio.Queue) -> list[TransactionCheck]:
    out = []
    while not outbox.empty():
        out.append(outbox.get_nowait())
    return out


def test_half_message_is_invisible_until_committed(tx):
    result = prepare(tx, b"pay", "TX1")
    assert result.transaction_id == "TX1"
    assert tx.receive("G", "T") == []
    (half,) = queue(tx, HALF_TOPIC)
    assert (half.properties["REAL_TOPIC"], half.properties["TRAN_MSG"], half.properties["PGROUP"]) == ("T", "true", "T")
    assert half.properties["__transactionId__"] == "TX1" and half.transaction_type == 0
    end(tx, "TX1", "COMMIT")
    (got,) = tx.receive("G", "T")
    rec = got.record
    assert (bytes(rec.body), rec.tags, rec.keys, rec.properties["p"]) == (b"pay", "t", ["k1"], "v")
    assert "TRAN_MSG" not in rec.properties and "REAL_TOPIC" not in rec.properties
    assert rec.transaction_type == 8 and rec.prepared_transaction_offset == half.commit_log_offset
    (op,) = queue(tx, OP_TOPIC)
    assert (op.tags, bytes(op.body)) == ("d", b"0,")
    with pytest.raises(BrokerError) as err:
        end(tx, "TX1", "COMMIT")  # ended already
    assert err.value.code == Code.INTERNAL_SERVER_ERROR


def test_rollback_drops_it_and_unknown_leaves_it_open(tx):
    prepare(tx, b"a", "TX1")
    end(tx, "TX1", "")  # an unknown resolution: still open
    end(tx, "TX1", "ROLLBACK")
    assert tx.receive("G", "T") == []
    assert [bytes(op.body) for op in queue(tx, OP_TOPIC)] == [b"0,"]
    with pytest.raises(BrokerError) as err:
        end(tx, " ", "COMMIT")
    assert err.value.code == Code.INVALID_TRANSACTION_ID


def test_orphans_are_checked_after_the_immunity_time_then_every_interval(tx):
    outbox = producer(tx)
    prepare(tx, b"a", "TX1")
    tx.clock.advance(5_999)
    assert tx.run(tx.broker.transactions.check(tx.clock())) == 0  # still immune
    tx.clock.advance(1)
    assert tx.run(tx.broker.transactions.check(tx.clock())) == 1
    (check,) = checks(outbox)
    assert (check.transaction_id, check.record.topic, bytes(check.record.body)) == ("TX1", "T", b"a")
    assert check.record.properties["TRANSACTION_CHECK_TIMES"] == "1"
    tx.clock.advance(29_999)
    assert tx.run(tx.broker.transactions.check(tx.clock())) == 0
    tx.clock.advance(1)
    tx.run(tx.broker.transactions.check(tx.clock()))
    assert [c.record.properties["TRANSACTION_CHECK_TIMES"] for c in checks(outbox)] == ["2"]
    tx.store.wait_dispatched()
    # each check appends a copy and marks the one before done
    assert [h.queue_offset for h in queue(tx, HALF_TOPIC)] == [0, 1, 2]
    assert sorted(bytes(op.body) for op in queue(tx, OP_TOPIC)) == [b"0,", b"1,"]
    end(tx, "TX1", "COMMIT")  # the producer's answer (source SERVER_CHECK)
    assert [bytes(r.record.body) for r in tx.receive("G", "T")] == [b"a"]


def test_an_orphan_past_the_check_limit_is_dropped_to_the_check_max_topic(tx):
    outbox = producer(tx)
    prepare(tx, b"never", "TX1")
    for _ in range(3):
        tx.clock.advance(30_000)
        tx.run(tx.broker.transactions.check(tx.clock()))
    assert len(checks(outbox)) == 2  # transactionCheckMax
    tx.store.wait_dispatched()
    (dropped,) = queue(tx, CHECK_MAX_TOPIC)
    assert bytes(dropped.body) == b"never" and dropped.properties["REAL_TOPIC"] == "T"
    assert tx.broker.transactions.pending == {}
    assert tx.receive("G", "T") == []


def test_own_immunity_time_and_its_limit(tx):
    outbox = producer(tx)
    prepare(tx, b"a", "TX1", transaction_recovery_seconds=60)
    tx.clock.advance(30_000)
    tx.run(tx.broker.transactions.check(tx.clock()))
    assert checks(outbox) == []
    tx.clock.advance(30_000)
    tx.run(tx.broker.transactions.check(tx.clock()))
    assert len(checks(outbox)) == 1
    with pytest.raises(BrokerError) as err:
        prepare(tx, b"b", "TX2", transaction_recovery_seconds=3601)
    assert err.value.code == Code.BAD_REQUEST


def test_a_restart_rebuilds_open_transactions_from_the_half_and_op_queues(tx):
    outbox = producer(tx)
    prepare(tx, b"one", "TX1")
    prepare(tx, b"two", "TX2")
    prepare(tx, b"three", "TX3")
    end(tx, "TX2", "ROLLBACK")
    tx.clock.advance(6_000)
    tx.run(tx.broker.transactions.check(tx.clock()))
    assert sorted(c.transaction_id for c in checks(outbox)) == ["TX1", "TX3"]
    tx.close()
    tx.open()
    pending = tx.broker.transactions.pending
    assert sorted(pending) == ["TX1", "TX3"] and pending["TX1"].checks == 1
    end(tx, "TX1", "COMMIT")
    tx.close()
    tx.open()
    assert sorted(tx.broker.transactions.pending) == ["TX3"]
    assert [bytes(r.record.body) for r in tx.receive("G", "T")] == [b"one"]


def test_op_messages_rocketmq_batches_mark_every_offset_done(tx):
    for i in range(4):
        prepare(tx, b"m%d" % i, f"TX{i}")
    tx.store.put(Message(topic=OP_TOPIC, body=b"0,2,3,", queue_id=0, tags="d"))  # RocketMQ's batched op
    tx.store.wait_dispatched()
    tx.close()
    tx.open()
    assert sorted(tx.broker.transactions.pending) == ["TX1"]
