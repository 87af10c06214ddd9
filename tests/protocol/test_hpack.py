"""The HPACK codec against RFC 7541's examples (Appendix C), an independent encoder and decoder
(python-hyper's `hpack`), and malformed blocks."""

import hpack as reference
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.protocol.http2.hpack import Decoder, HpackError, encode_indexed_name, encode_integer, encode_literal


def block(hex_dump: str) -> bytes:
    return bytes.fromhex(hex_dump)


# RFC 7541 Appendix C.1: integer representation examples.


def test_integer_examples():
    assert encode_integer(10, 5) == block("0a")  # C.1.1
    assert encode_integer(1337, 5) == block("1f 9a 0a")  # C.1.2
    assert encode_integer(42, 8) == block("2a")  # C.1.3
    assert encode_integer(30, 5, 0x20) == block("3e")
    assert encode_integer(31, 5, 0x20) == block("3f 00")
    assert encode_integer(127 + 128, 7, 0x80) == block("ff 80 01")


def test_integer_with_a_continuation():
    # a size update (001, 5-bit prefix) to 1337, encoded as in C.1.2
    decoder = Decoder(max_table_size=4096)
    assert decoder.decode(block("3f 9a 0a") + block("40 01 61 01 62")) == [("a", "b")]
    assert decoder.table_size == 34


# RFC 7541 Appendix C.2: header field representations, each decoded by a fresh decoder.


@pytest.mark.parametrize(
    ("hex_dump", "headers", "table"),
    [
        # C.2.1 literal with indexing
        ("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
         [("custom-key", "custom-header")], [("custom-key", "custom-header")]),
        # C.2.2 literal without indexing
        ("040c 2f73 616d 706c 652f 7061 7468", [(":path", "/sample/path")], []),
        # C.2.3 literal never indexed
        ("1008 7061 7373 776f 7264 0673 6563 7265 74", [("password", "secret")], []),
        # C.2.4 indexed
        ("82", [(":method", "GET")], []),
    ],
)
def test_representation_examples(hex_dump, headers, table):
    decoder = Decoder()
    assert decoder.decode(block(hex_dump)) == headers
    assert decoder.dynamic_table == table
    assert decoder.table_size == sum(len(name) + len(value) + 32 for name, value in table)


# RFC 7541 Appendix C.3-C.6: consecutive header blocks on one connection, with the dynamic table
# (newest first) and its size after each.

REQUESTS = [
    ([(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")],
     [(":authority", "www.example.com")], 57),
    ([(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com"),
      ("cache-control", "no-cache")],
     [("cache-control", "no-cache"), (":authority", "www.example.com")], 110),
    ([(":method", "GET"), (":scheme", "https"), (":path", "/index.html"), (":authority", "www.example.com"),
      ("custom-key", "custom-value")],
     [("custom-key", "custom-value"), ("cache-control", "no-cache"), (":authority", "www.example.com")], 164),
]
REQUESTS_PLAIN = [  # C.3
    "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
    "8286 84be 5808 6e6f 2d63 6163 6865",
    "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
]
REQUESTS_HUFFMAN = [  # C.4
    "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
    "8286 84be 5886 a8eb 1064 9cbf",
    "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
]

DATE_21 = ("date", "Mon, 21 Oct 2013 20:13:21 GMT")
DATE_22 = ("date", "Mon, 21 Oct 2013 20:13:22 GMT")
LOCATION = ("location", "https://www.example.com")
COOKIE = ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")
RESPONSES = [  # decoded with a 256-octet table: evictions
    ([(":status", "302"), ("cache-control", "private"), DATE_21, LOCATION],
     [LOCATION, DATE_21, ("cache-control", "private"), (":status", "302")], 222),
    ([(":status", "307"), ("cache-control", "private"), DATE_21, LOCATION],
     [(":status", "307"), LOCATION, DATE_21, ("cache-control", "private")], 222),
    ([(":status", "200"), ("cache-control", "private"), DATE_22, LOCATION, ("content-encoding", "gzip"), COOKIE],
     [COOKIE, ("content-encoding", "gzip"), DATE_22], 215),
]
RESPONSES_PLAIN = [  # C.5
    "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133"
    "2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70"
    "6c65 2e63 6f6d",
    "4803 3330 37c1 c0bf",
    "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d"
    "54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049"
    "5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e"
    "3d31",
]
RESPONSES_HUFFMAN = [  # C.6
    "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6"
    "2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
    "4883 640e ffc1 c0bf",
    "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab"
    "77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f"
    "9587 3160 65c0 03ed 4ee5 b106 3d50 07",
]
EXAMPLES = [
    pytest.param(REQUESTS_PLAIN, REQUESTS, 4096, id="C.3"),
    pytest.param(REQUESTS_HUFFMAN, REQUESTS, 4096, id="C.4"),
    pytest.param(RESPONSES_PLAIN, RESPONSES, 256, id="C.5"),
    pytest.param(RESPONSES_HUFFMAN, RESPONSES, 256, id="C.6"),
]


@pytest.mark.parametrize(("blocks", "expected", "table_size"), EXAMPLES)
def test_connection_examples(blocks, expected, table_size):
    decoder = Decoder(max_table_size=table_size)
    for hex_dump, (headers, table, size) in zip(blocks, expected):
        assert decoder.decode(block(hex_dump)) == headers
        assert decoder.dynamic_table == table
        assert decoder.table_size == size


@pytest.mark.parametrize(("blocks", "expected", "table_size"), EXAMPLES)
def test_connection_examples_from_memoryview(blocks, expected, table_size):
    decoder = Decoder(max_table_size=table_size)
    for hex_dump, (headers, _, _) in zip(blocks, expected):
        assert decoder.decode(memoryview(block(hex_dump))) == headers


@pytest.mark.parametrize(("blocks", "expected", "table_size"), EXAMPLES)
def test_truncated_examples(blocks, expected, table_size):
    """Every prefix of a block decodes to a prefix of its header list, or raises HpackError."""
    for number, hex_dump in enumerate(blocks):
        whole = block(hex_dump)
        headers = expected[number][0]
        for length in range(len(whole)):
            decoder = Decoder(max_table_size=table_size)
            for earlier in blocks[:number]:
                decoder.decode(block(earlier))
            try:
                decoded = decoder.decode(whole[:length])
            except HpackError:
                continue
            assert decoded == headers[:len(decoded)]
            assert len(decoded) < len(headers)


# Round trips through an independent encoder (python-hyper's hpack), one connection per example:
# its dynamic table is exercised across blocks, and resized between them.

names = st.one_of(
    st.sampled_from([b":path", b"content-type", b"grpc-timeout", b"x-mq-request-id", b"date", b"te"]),
    st.binary(min_size=1, max_size=24),
    st.text(st.characters(codec="ascii"), min_size=1, max_size=24).map(str.encode),
)
values = st.one_of(
    st.sampled_from([b"", b"application/grpc", b"trailers", b"2999m", b"GET", b"/"]),
    st.binary(max_size=64),
    st.text(st.characters(codec="latin-1"), max_size=64).map(lambda text: text.encode("latin-1")),
)
fields = st.tuples(names, values, st.booleans())  # the last: never indexed
header_lists = st.lists(fields, max_size=12)
connections = st.lists(st.tuples(header_lists, st.none() | st.integers(0, 4096)), min_size=1, max_size=8)


def latin1(headers):
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value, _ in headers]


@settings(max_examples=300, deadline=None)
@given(connections, st.booleans())
def test_round_trip_through_reference_encoder(connection, huffman):
    encoder = reference.Encoder()
    decoder = Decoder(max_table_size=4096)
    for headers, table_size in connection:
        if table_size is not None:
            encoder.header_table_size = table_size
        encoded = encoder.encode(
            [reference.NeverIndexedHeaderTuple(name, value) if never else (name, value)
             for name, value, never in headers],
            huffman=huffman,
        )
        assert decoder.decode(encoded) == latin1(headers)
        assert decoder.table_size <= encoder.header_table_size
        assert decoder.dynamic_table == [
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in encoder.header_table.dynamic_entries]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_huffman_strings_round_trip(octets):
    encoded = reference.Encoder().encode([(b"x", octets)], huffman=True)
    assert Decoder().decode(encoded) == [("x", octets.decode("latin-1"))]


def test_huffman_every_octet():
    octets = bytes(range(256))
    encoded = reference.Encoder().encode([(octets, octets[::-1])], huffman=True)
    assert Decoder().decode(encoded) == [(octets.decode("latin-1"), octets[::-1].decode("latin-1"))]


# Our encoding helpers, decoded by our decoder and by the reference one.

responses = st.lists(
    st.one_of(
        st.tuples(st.just("indexed"), st.integers(1, 61), st.just(b"")),
        st.tuples(st.just("indexed name"), st.integers(1, 61), st.binary(max_size=300)),
        st.tuples(st.just("literal"), names, st.binary(max_size=300)),
    ),
    max_size=10,
)


def encode_response(fields):
    encoded = b""
    for kind, name, value in fields:
        if kind == "indexed":
            encoded += encode_integer(name, 7, 0x80)
        elif kind == "indexed name":
            encoded += encode_indexed_name(name, value)
        else:
            encoded += encode_literal(name, value)
    return encoded


@settings(max_examples=200, deadline=None)
@given(responses)
def test_encode_helpers_decoded_by_both(fields):
    encoded = encode_response(fields)
    ours = Decoder()
    theirs = reference.Decoder()
    for _ in range(2):  # the encoding leaves the peer's table as it was
        decoded = ours.decode(encoded)
        assert [(name.encode("latin-1"), value.encode("latin-1")) for name, value in decoded] == [
            (bytes(name), bytes(value)) for name, value in theirs.decode(encoded, raw=True)]
        assert ours.table_size == 0


def test_encode_helpers_examples():
    assert encode_integer(8, 7, 0x80) == b"\x88"  # :status 200
    assert encode_indexed_name(31, b"application/grpc") == b"\x0f\x10\x10application/grpc"  # content-type
    assert encode_literal(b"grpc-status", b"0") == b"\x00\x0bgrpc-status\x010"
    assert Decoder().decode(b"\x88" + encode_indexed_name(31, b"application/grpc")
                            + encode_literal(b"grpc-status", b"0")) == [
        (":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "0")]


@pytest.mark.parametrize(("value", "prefix_bits"), [(-1, 7), (5, 0), (5, 9)])
def test_encode_integer_rejects_misuse(value, prefix_bits):
    with pytest.raises(ValueError):
        encode_integer(value, prefix_bits)


def test_encode_indexed_name_rejects_an_index_outside_the_static_table():
    with pytest.raises(ValueError):
        encode_indexed_name(62, b"x")


# Malformed blocks: each raises HpackError with what was wrong.


@pytest.mark.parametrize(
    ("hex_dump", "message"),
    [
        ("80", "index 0 outside"),  # indexed, index 0
        ("be", "index 62 outside"),  # indexed, the dynamic table being empty
        ("ff 80 01", "index 255 outside"),  # indexed, a multi-octet index beyond the table
        ("7e 01 61", "index 62 outside"),  # literal with indexing, name index beyond the table
        ("0f 2f 01 61", "index 62 outside"),  # literal without indexing, name index beyond the table
        ("1f 2f 01 61", "index 62 outside"),  # never indexed, name index beyond the table
        ("ff", "truncated inside an integer"),
        ("ff 80 80", "truncated inside an integer"),
        ("41", "truncated before a string"),
        ("40 01", "truncated inside a string"),
        ("40 05 61 62", "truncated inside a string"),
        ("40 01 61", "truncated before a string"),
        ("40 7f ff", "truncated inside an integer"),
        ("ff 80 80 80 80 80 80 01", "integer longer than"),
        ("3f e2 1f", "update to 4097, above the 4096 allowed"),  # 4096 advertised
        ("82 20", "size update after a header field"),
        ("41 81 00", "padded"),  # '0' (5 zero bits) then 3 zero bits of padding
        ("41 82 ff ff", "padded"),  # 16 bits of EOS's prefix: padding longer than 7 bits
        ("41 81 ff", "padded"),  # 8 bits of EOS's prefix
        ("41 84 ff ff ff ff", "EOS"),  # EOS (30 ones) inside the string
        ("41 85 1f ff ff ff ff", "EOS"),  # 'a' (00011), then EOS
    ],
)
def test_malformed_blocks(hex_dump, message):
    with pytest.raises(HpackError, match=message):
        Decoder().decode(block(hex_dump))


def test_huffman_padding_of_up_to_7_ones_is_accepted():
    # 'a' is 00011: followed by 3 ones of padding, one octet
    assert Decoder().decode(block("41 81 1f")) == [(":authority", "a")]


def test_size_updates():
    decoder = Decoder(max_table_size=100)
    decoder.decode(block("40 01 61 01 62"))  # ("a", "b"), 34 octets
    assert decoder.decode(block("3f 45")) == []  # to 100, the maximum
    assert decoder.dynamic_table == [("a", "b")] and decoder.table_size == 34
    assert decoder.decode(block("3f 02")) == []  # to 33: too small for the entry...
    assert decoder.dynamic_table == [] and decoder.table_size == 0  # ... evicted
    decoder.decode(block("3f 45 40 01 61 01 62"))  # back to 100, another entry
    with pytest.raises(HpackError, match="index 62 outside"):  # to 0 then to 100: the entry is gone
        decoder.decode(block("20 3f 45 be"))


def test_entry_larger_than_the_table_empties_it():
    decoder = Decoder(max_table_size=64)
    decoder.decode(block("40 01 61 01 62"))
    assert decoder.decode(block("40 01 63 20") + b"d" * 32) == [("c", "d" * 32)]  # 65 octets > 64
    assert decoder.dynamic_table == [] and decoder.table_size == 0


def test_header_list_too_large():
    decoder = Decoder(max_header_list_size=100)
    assert decoder.decode(block("40 01 61 01 62 be")) == [("a", "b")] * 2  # 2 x 34 octets
    with pytest.raises(HpackError, match="header list of 102 octets, above the 100 allowed"):
        decoder.decode(block("be be be"))
    with pytest.raises(HpackError, match="header list of 101 octets"):
        decoder.decode(block("00 01 61 44") + b"b" * 68)


# Fuzz: any octets either decode or raise HpackError, never anything else.

fuzz_blocks = st.one_of(
    st.binary(max_size=64),
    # valid blocks with octets flipped, cut or inserted
    st.tuples(st.sampled_from(REQUESTS_HUFFMAN + RESPONSES_HUFFMAN + REQUESTS_PLAIN), st.integers(0, 200),
              st.integers(0, 255), st.integers(0, 200)).map(
        lambda case: (lambda whole: whole[:case[1]] + bytes([case[2]]) + whole[case[1] + 1:case[3] + case[1]])(
            block(case[0]))),
)


@settings(max_examples=2000, deadline=None)
@given(st.lists(fuzz_blocks, min_size=1, max_size=4), st.sampled_from([0, 64, 256, 4096]))
def test_fuzz_raises_only_hpack_error(blocks, max_table_size):
    decoder = Decoder(max_table_size=max_table_size, max_header_list_size=512)
    for octets in blocks:
        try:
            headers = decoder.decode(octets)
        except HpackError:
            return
        assert all(type(name) is str and type(value) is str for name, value in headers)
        assert decoder.table_size <= max_table_size
