"""The commit-log record codec against the spec's byte layout (spec §1)."""

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.store import record
from tidemq.store.format.record import EndOfData, EndOfSegment, Invalid, Record


def hand_built_v1(body, topic, props, queue_id, queue_offset, phys, sysflag, born_ts, store_ts):
    """The record laid out field by field from the spec's table, independently of the codec."""
    born = bytes([10, 0, 0, 7]) + struct.pack(">i", 5555)
    store = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)
    topic_b, props_b = topic.encode(), props.encode()
    fields = b"".join(
        [
            struct.pack(">i", -626843481),  # MAGICCODE v1 (0xDAA320A7)
            struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),
            struct.pack(">i", queue_id),
            struct.pack(">i", 0),  # FLAG
            struct.pack(">q", queue_offset),
            struct.pack(">q", phys),
            struct.pack(">i", sysflag),
            struct.pack(">q", born_ts),
            born,
            struct.pack(">q", store_ts),
            store,
            struct.pack(">i", 2),  # RECONSUMETIMES
            struct.pack(">q", 0),  # PREPARED TRANSACTION OFFSET
            struct.pack(">i", len(body)),
            body,
            bytes([len(topic_b)]),
            topic_b,
            struct.pack(">h", len(props_b)),
            props_b,
        ]
    )
    return struct.pack(">i", 4 + len(fields)) + fields


def test_golden_bytes_v1_ipv4():
    body = b"hello, tidemq"
    props = "TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    expected = hand_built_v1(body, "orders", props, 3, 41, 4096, 0, 1700000000000, 1700000000123)
    assert len(expected) == 91 + len(body) + len("orders") + len(props)
    got = record.encode(
        topic="orders",
        body=body,
        queue_id=3,
        queue_offset=41,
        commit_log_offset=4096,
        store_timestamp=1700000000123,
        properties={"TAGS": "TagA", "KEYS": "k1 k2"},
        store_host=("127.0.0.1", 10911),
        born_host=("10.0.0.7", 5555),
        born_timestamp=1700000000000,
        reconsume_times=2,
    )
    assert got == expected


def test_decode_hand_built_record():
    raw = hand_built_v1(b"abc", "t", "TAGS\x01x\x02", 1, 7, 0, 0, 11, 22)
    rec = record.decode(raw, 0)
    assert isinstance(rec, Record)
    assert (rec.topic, rec.queue_id, rec.queue_offset, rec.born_timestamp, rec.store_timestamp) == ("t", 1, 7, 11, 22)
    assert bytes(rec.body) == b"abc" and rec.tags == "x" and rec.reconsume_times == 2
    assert rec.born_host == ("10.0.0.7", 5555) and rec.store_host == ("127.0.0.1", 10911)


def test_v2_for_topics_over_127_chars_and_ipv6_hosts():
    topic = "t" * 200
    raw = record.encode(topic=topic, body=b"x", store_host=("::1", 10911), born_host=("2001:db8::5", 80))
    assert struct.unpack_from(">i", raw, 4)[0] == record.MESSAGE_MAGIC_CODE_V2
    # v2 adds one byte, each IPv6 host 12
    assert len(raw) == 91 + 1 + 12 + 12 + 1 + len(topic)
    rec = record.decode(raw, 0)
    assert rec.topic == topic and rec.born_host == ("2001:db8::5", 80) and rec.store_host == ("::1", 10911)
    assert rec.sysflag & record.FLAG_BORNHOST_V6 and rec.sysflag & record.FLAG_STOREHOST_V6
    short = record.encode(topic="t" * 127, body=b"x")
    assert struct.unpack_from(">i", short, 4)[0] == record.MESSAGE_MAGIC_CODE


def test_decode_every_prefix_is_reported_not_raised():
    raw = record.encode(topic="topic", body=b"payload" * 10, properties={"a": "bc"})
    for n in range(len(raw)):
        result = record.decode(raw[:n], 0)
        assert isinstance(result, (Invalid, EndOfData)), n
    assert isinstance(record.decode(raw, 0), Record)


def test_decode_byte_by_byte_stream():
    """A reader fed one byte at a time sees nothing until the record is whole."""
    raws = [record.encode(topic="s", body=bytes([i]) * i, queue_offset=i) for i in range(1, 6)]
    stream = b"".join(raws)
    buf = bytearray()
    decoded = []
    pos = 0
    for byte in stream:
        buf.append(byte)
        result = record.decode(buf, pos, check_position=False)
        if isinstance(result, Record):
            decoded.append(result.queue_offset)
            pos += result.total_size
        del result  # a Record's body is a view into buf, which must not be resized under it
    assert decoded == [1, 2, 3, 4, 5]


def test_blank_and_zeros():
    seg = bytearray(64)
    seg[0:8] = record.encode_blank(64)
    assert record.decode(seg, 0, base_offset=1024) == EndOfSegment(1024, 64)
    assert record.decode(bytes(64), 0) == EndOfData(0)
    bad = bytearray(seg)
    struct.pack_into(">i", bad, 0, 60)
    assert isinstance(record.decode(bad, 0), Invalid)


def test_corruption_is_invalid():
    raw = bytearray(record.encode(topic="t", body=b"important"))
    raw[90] ^= 0x01  # a body byte
    result = record.decode(raw, 0)
    assert isinstance(result, Invalid) and "CRC" in result.reason
    raw = bytearray(record.encode(topic="t", body=b"important"))
    raw[5] ^= 0xFF  # the magic code
    assert "magic" in record.decode(raw, 0).reason
    raw = bytearray(record.encode(topic="t", body=b"x", commit_log_offset=100))
    assert "PHYSICALOFFSET" in record.decode(raw, 0).reason


def test_java_string_hash_matches_java():
    assert record.java_string_hash("hello") == 99162322
    assert record.java_string_hash("") == 0
    assert record.java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # UTF-16 surrogate pair
    assert record.java_string_hash("polygenelubricants") == -2147483648  # wraps to Integer.MIN_VALUE
    assert record.tags_code(None) == 0


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=80), st.text(alphabet=st.characters(blacklist_categories=()), max_size=20),
                 st.text(alphabet=st.characters(max_codepoint=127), min_size=4090, max_size=4200)))
def test_java_string_hash_is_the_step_by_step_definition(text):
    """The table of powers and the compiled loop give what h = 31*h + unit gives, for ASCII and
    for other text (lone surrogates included), at any length (past the table too)."""
    raw = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for (unit,) in struct.iter_unpack(">H", raw):
        h = (31 * h + unit) & 0xFFFFFFFF
    expected = h - (1 << 32) if h >= 1 << 31 else h
    assert record.java_string_hash_python(text) == expected
    assert record.java_string_hash.__wrapped__(text) == expected


def test_properties_reject_separators():
    with pytest.raises(record.CodecError):
        record.encode_properties({"a\x01": "b"})
    with pytest.raises(record.CodecError):
        record.encode_properties({"a": "b\x02c"})
    with pytest.raises(record.CodecError):
        record.encode_properties({"": "x"})


def test_message_id_round_trip():
    msg_id = record.message_id(("10.1.2.3", 10911), 123456789)
    assert msg_id == "0A010203" + "00002A9F" + "00000000075BCD15"
    assert record.parse_message_id(msg_id) == (("10.1.2.3", 10911), 123456789)
    assert len(record.message_id(("::1", 1), 5)) == 56
    with pytest.raises(record.CodecError):
        record.parse_message_id("XYZ")


names = st.text(alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=20)
hosts = st.one_of(
    st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.tuples(st.ip_addresses(v=6).map(str), st.integers(0, 65535)),
)


@settings(max_examples=300, deadline=None)
@given(
    topic=st.text(alphabet=st.characters(blacklist_characters="\x00/", blacklist_categories=("Cs",)), min_size=1, max_size=200).filter(
        lambda t: len(t.encode()) <= 255
    ),
    body=st.binary(max_size=2000),
    properties=st.dictionaries(names, names, max_size=8).filter(lambda d: all(len(k) + len(v) >= 2 for k, v in d.items())),
    queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**63 - 1),
    offset=st.integers(0, 2**40),
    born=hosts,
    store=hosts,
    born_ts=st.integers(0, 2**62),
    store_ts=st.integers(0, 2**62),
    flag=st.integers(-(2**31), 2**31 - 1),
    reconsume=st.integers(0, 1000),
)
def test_round_trip(topic, body, properties, queue_id, queue_offset, offset, born, store, born_ts, store_ts, flag, reconsume):
    raw = record.encode(
        topic=topic,
        body=body,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=offset,
        store_timestamp=store_ts,
        properties=properties,
        store_host=store,
        born_host=born,
        born_timestamp=born_ts,
        flag=flag,
        reconsume_times=reconsume,
    )
    rec = record.decode(raw, 0, base_offset=offset)
    assert isinstance(rec, Record), rec
    assert rec.total_size == len(raw)
    assert (rec.topic, bytes(rec.body), rec.properties) == (topic, body, properties)
    assert (rec.queue_id, rec.queue_offset, rec.commit_log_offset) == (queue_id, queue_offset, offset)
    assert (rec.born_timestamp, rec.store_timestamp, rec.flag, rec.reconsume_times) == (born_ts, store_ts, flag, reconsume)
    assert rec.born_host == (str(__import__("ipaddress").ip_address(born[0])), born[1])
    assert rec.store_host == (str(__import__("ipaddress").ip_address(store[0])), store[1])
    v2 = len(topic) > 127 or len(topic.encode()) > 255
    assert rec.magic == (record.MESSAGE_MAGIC_CODE_V2 if v2 else record.MESSAGE_MAGIC_CODE)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 400))
def test_fuzz_decode_never_raises(data, pos):
    result = record.decode(data, min(pos, len(data)))
    assert isinstance(result, (Record, EndOfSegment, EndOfData, Invalid))


@pytest.mark.parametrize("v6_bits", [record.FLAG_BORNHOST_V6, record.FLAG_STOREHOST_V6, record.FLAG_BORNHOST_V6 | record.FLAG_STOREHOST_V6])
def test_a_record_too_short_for_the_ipv6_header_its_sysflag_claims_is_invalid(v6_bits):
    raw = bytearray(record.encode(topic="t", body=b""))  # 92 bytes: room for IPv4 hosts only
    struct.pack_into(">i", raw, record.SYSFLAG_POSITION, v6_bits)
    result = record.decode(bytes(raw), 0)
    assert type(result) is Invalid
    assert "smaller than its" in result.reason and result.size == len(raw)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(0, 7), st.sampled_from([0x01, 0x10, 0x80]))
def test_fuzz_bit_flips_are_detected_or_harmless(index, bit, _):
    raw = bytearray(record.encode(topic="flip", body=b"0123456789" * 5, properties={"TAGS": "a"}, commit_log_offset=0))
    index %= len(raw)
    raw[index] ^= 1 << bit
    result = record.decode(raw, 0)
    # a flip is either caught, or it landed in a field no check covers (ids, times, flags...)
    assert isinstance(result, (Record, Invalid, EndOfData, EndOfSegment))
    if isinstance(result, Record):
        assert bytes(result.body) == b"0123456789" * 5
