"""Compressed bodies by RocketMQ's sysflag semantics: what a client is given for a body RocketMQ's
clients compressed (zlib), for one a gRPC client sent gzip-encoded, and what a copy keeps."""

import gzip
import zlib

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from tidemq.broker import bodies, lookups
from tidemq.protocol.grpc.convert import fill_delivered_message
from tidemq.store import Message, record

PLAIN = ("compressible body " * 400).encode()
ZLIB_TYPE = bodies.COMPRESSION_ZLIB << bodies.COMPRESSION_SHIFT
LZ4_TYPE = bodies.COMPRESSION_LZ4 << bodies.COMPRESSION_SHIFT


def stored(harness, body: bytes, sysflag: int):
    harness.store.put(Message(topic="Z", body=body, sysflag=sysflag, properties={record.PROPERTY_UNIQ_KEY: "Z1"}))
    assert harness.store.wait_dispatched()
    (received,) = harness.receive("G", "Z")
    return received


def given(received) -> pb.Message:
    m = pb.Message()
    fill_delivered_message(m, received.record, "", received.receipt_handle, received.delivery_attempt, 30_000)
    return m


@pytest.mark.parametrize("sysflag", [record.FLAG_COMPRESSED | ZLIB_TYPE, record.FLAG_COMPRESSED],
                         ids=["zlib-type", "no-type-bits"])
def test_a_zlib_body_is_given_inflated(harness, sysflag):
    received = stored(harness, zlib.compress(PLAIN), sysflag)
    m = given(received)
    assert m.system_properties.body_encoding == pb.IDENTITY
    assert m.body == PLAIN
    assert lookups.describe(received.record)["body_text"] == PLAIN.decode()


def test_a_gzip_body_is_given_as_it_came(harness):
    body = gzip.compress(PLAIN)
    m = given(stored(harness, body, record.FLAG_COMPRESSED))
    assert m.system_properties.body_encoding == pb.GZIP
    assert m.body == body


def test_a_body_of_an_unknown_compression_is_given_as_stored(harness):
    m = given(stored(harness, b"\x04\x22\x4d\x18 lz4 frame", record.FLAG_COMPRESSED | LZ4_TYPE))
    assert m.system_properties.body_encoding == pb.IDENTITY
    assert m.body == b"\x04\x22\x4d\x18 lz4 frame"


def test_a_dead_letter_keeps_how_its_body_is_compressed(harness):
    received = stored(harness, b"\x04\x22\x4d\x18 lz4 frame", record.FLAG_COMPRESSED | LZ4_TYPE)
    harness.run(harness.broker.forward_to_dead_letter("G", "Z", received.receipt_handle))
    assert harness.store.wait_dispatched()
    (dead,) = harness.store.get("%DLQ%G", 0, 0, 10).messages
    assert dead.sysflag & bodies.BODY_FLAGS == record.FLAG_COMPRESSED | LZ4_TYPE


def test_a_body_that_inflates_past_the_bound_is_given_as_stored(harness, monkeypatch):
    monkeypatch.setattr(bodies, "MAX_INFLATED", 1 << 20)
    bomb = zlib.compress(b"\0" * ((1 << 20) + 1))
    received = stored(harness, bomb, record.FLAG_COMPRESSED | ZLIB_TYPE)
    m = given(received)
    assert m.system_properties.body_encoding == pb.IDENTITY
    assert m.body == bomb
    assert lookups.describe(received.record)["body_text"] is None
