"""The sans-I/O HTTP/2 server connection, without sockets or sleeps: python-hyper's `h2` as the
client where a client behaves, raw frames where it does not.  Every exchange is fed whole and one
byte at a time."""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.events
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.protocol.http2.hpack import encode_literal
from tidemq.protocol.http2 import (DataReceived, DataSent, H2Connection, Limits, ProtocolError, RequestReceived,
                                   StreamClosed, StreamReset, TrailersReceived)
from tidemq.protocol.http2 import frames as f

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/pkg.Service/Method"), (":authority", "test"),
           ("content-type", "application/grpc"), ("te", "trailers")]
SETTINGS = f.frame(f.SETTINGS, 0, 0)
PIECES = ["whole", "bytewise"]


def server(**limits) -> H2Connection:
    connection = H2Connection(Limits(**limits))
    connection.initiate()
    return connection


def feed(connection: H2Connection, data: bytes, pieces: str = "whole") -> list:
    if pieces == "whole":
        return connection.receive_data(data)
    events = []
    for i in range(len(data)):
        events += connection.receive_data(data[i:i + 1])
    return events


def client() -> h2.connection.H2Connection:
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="latin-1"))
    c.initiate_connection()
    return c


def raw_start(**limits) -> H2Connection:
    """A server that has had the client's preface and SETTINGS."""
    connection = server(**limits)
    assert connection.receive_data(f.PREFACE + SETTINGS) == []
    connection.data_to_send()
    return connection


def block(headers) -> bytes:
    return b"".join(encode_literal(k.encode(), v.encode()) for k, v in headers)


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    return f.FrameBuffer(f.LARGEST_FRAME_SIZE).feed(data)


def resets(data: bytes) -> dict[int, int]:
    return {s: struct.unpack(">I", p)[0] for t, _, s, p in parse_frames(data) if t == f.RST_STREAM}


def goaway_code(data: bytes) -> int | None:
    codes = [struct.unpack(">II", p[:8])[1] for t, _, _, p in parse_frames(data) if t == f.GOAWAY]
    return codes[-1] if codes else None


# -- a well-behaved client --

@pytest.mark.parametrize("pieces", PIECES)
def test_a_request_and_its_answer(pieces):
    c, s = client(), server()
    c.send_headers(1, REQUEST)
    c.send_data(1, b"\x00\x00\x00\x00\x03abc", end_stream=True)
    events = feed(s, c.data_to_send(), pieces)
    assert [type(e) for e in events if not isinstance(e, DataReceived)] == [RequestReceived]
    assert events[0].headers == REQUEST and not events[0].end_stream
    assert b"".join(e.data for e in events if isinstance(e, DataReceived)) == b"\x00\x00\x00\x00\x03abc"
    assert events[-1].end_stream
    assert s.respond(1, b"\x88", b"\x00\x00\x00\x00\x02ok", encode_literal(b"grpc-status", b"0"))
    seen = c.receive_data(s.data_to_send())
    kinds = [type(e) for e in seen]
    assert h2.events.RemoteSettingsChanged in kinds and h2.events.StreamEnded in kinds
    assert [e.data for e in seen if isinstance(e, h2.events.DataReceived)] == [b"\x00\x00\x00\x00\x02ok"]
    trailers = next(e for e in seen if isinstance(e, h2.events.TrailersReceived))
    assert trailers.headers == [("grpc-status", "0")]
    assert s.streams == {}


def test_the_server_preface_advertises_its_limits():
    c, s = client(), server(max_concurrent_streams=7, stream_window=1 << 20, connection_window=8 << 20)
    settings_changed = next(e for e in c.receive_data(s.data_to_send())
                            if isinstance(e, h2.events.RemoteSettingsChanged))
    changed = {int(k): v.new_value for k, v in settings_changed.changed_settings.items()}
    assert changed[f.SETTINGS_MAX_CONCURRENT_STREAMS] == 7
    assert changed[f.SETTINGS_INITIAL_WINDOW_SIZE] == 1 << 20
    assert changed[f.SETTINGS_ENABLE_PUSH] == 0
    assert c.outbound_flow_control_window == 8 << 20


@pytest.mark.parametrize("pieces", PIECES)
def test_a_header_block_split_over_continuation_frames(pieces):
    s = raw_start()
    whole = block(REQUEST + [("x-long", "v" * 30_000)])
    parts = [whole[i:i + 10_000] for i in range(0, len(whole), 10_000)]
    wire = f.frame(f.HEADERS, f.END_STREAM, 1, parts[0]) + b"".join(
        f.frame(f.CONTINUATION, f.END_HEADERS if i == len(parts) - 1 else 0, 1, p) for i, p in enumerate(parts[1:], 1))
    events = feed(s, wire, pieces)
    assert len(events) == 1 and events[0].headers[-1] == ("x-long", "v" * 30_000) and events[0].end_stream


# -- request validation (RFC 9113 §8.2-8.3): the stream is reset, the application never sees it --

MALFORMED = {
    "uppercase name": REQUEST + [("X-Upper", "1")],
    "duplicate :path": REQUEST + [(":path", "/again")],
    "no :method": [h for h in REQUEST if h[0] != ":method"],
    "no :scheme": [h for h in REQUEST if h[0] != ":scheme"],
    "empty :path": [(k, "" if k == ":path" else v) for k, v in REQUEST],
    "response pseudo-header": REQUEST + [(":status", "200")],
    "unknown pseudo-header": REQUEST + [(":foo", "1")],
    "pseudo-header after a regular one": REQUEST[1:] + REQUEST[:1],
    "connection-specific": REQUEST + [("connection", "keep-alive")],
    "transfer-encoding": REQUEST + [("transfer-encoding", "chunked")],
    "te other than trailers": [(k, "gzip" if k == "te" else v) for k, v in REQUEST],
    "a newline in a value": REQUEST + [("x-a", "1\r\nx-b: 2")],
    "bad content-length": REQUEST + [("content-length", "ten")],
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_are_reset_with_protocol_error(case):
    s = raw_start()
    events = s.receive_data(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block(MALFORMED[case])))
    assert events == []
    assert resets(s.data_to_send()) == {1: f.PROTOCOL_ERROR}
    # the connection serves on
    events = s.receive_data(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, block(REQUEST)))
    assert [type(e) for e in events] == [RequestReceived]


def test_content_length_must_match_the_data():
    s = raw_start()
    headers = block(REQUEST + [("content-length", "4")])
    events = s.receive_data(f.frame(f.HEADERS, f.END_HEADERS, 1, headers) + f.frame(f.DATA, f.END_STREAM, 1, b"abc"))
    assert [type(e) for e in events] == [RequestReceived, StreamReset]
    assert resets(s.data_to_send()) == {1: f.PROTOCOL_ERROR}
    events = s.receive_data(f.frame(f.HEADERS, f.END_HEADERS, 3, headers) + f.frame(f.DATA, f.END_STREAM, 3, b"abcd"))
    assert [type(e) for e in events] == [RequestReceived, DataReceived]


def test_trailers_with_a_pseudo_header_reset_the_stream():
    s = raw_start()
    events = s.receive_data(f.frame(f.HEADERS, f.END_HEADERS, 1, block(REQUEST)) + f.frame(f.DATA, 0, 1, b"x")
                            + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block([(":path", "/")])))
    assert [type(e) for e in events] == [RequestReceived, DataReceived, StreamReset]
    assert resets(s.data_to_send()) == {1: f.PROTOCOL_ERROR}
    events = s.receive_data(f.frame(f.HEADERS, f.END_HEADERS, 3, block(REQUEST))
                            + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, block([("x-t", "1")])))
    assert [type(e) for e in events] == [RequestReceived, TrailersReceived]


def test_frames_on_a_half_closed_stream_reset_it_with_stream_closed():
    s = raw_start()
    events = s.receive_data(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block(REQUEST))
                            + f.frame(f.DATA, f.END_STREAM, 1, b"late"))
    assert [type(e) for e in events] == [RequestReceived, StreamReset]
    assert events[1].error_code == f.STREAM_CLOSED and not events[1].remote
    assert resets(s.data_to_send()) == {1: f.STREAM_CLOSED}


# -- connection errors: a GOAWAY with the precise code, then the connection refuses everything --

def _headers_open(stream_id=1):
    return f.frame(f.HEADERS, f.END_HEADERS, stream_id, block(REQUEST))


CONNECTION_ERRORS = {
    "DATA on stream 0": (f.frame(f.DATA, 0, 0, b"x"), f.PROTOCOL_ERROR),
    "DATA on an idle stream": (f.frame(f.DATA, 0, 5, b"x"), f.PROTOCOL_ERROR),
    "HEADERS on stream 0": (f.frame(f.HEADERS, f.END_HEADERS, 0, block(REQUEST)), f.PROTOCOL_ERROR),
    "an even stream id": (f.frame(f.HEADERS, f.END_HEADERS, 2, block(REQUEST)), f.PROTOCOL_ERROR),
    "a stream id going down": (_headers_open(5) + _headers_open(3), f.PROTOCOL_ERROR),
    "HEADERS on a closed stream": (f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block(REQUEST))
                                   + f.frame(f.RST_STREAM, 0, 1, b"\0\0\0\x08") + _headers_open(1), f.STREAM_CLOSED),
    "DATA on a closed stream": (_headers_open(1) + f.frame(f.RST_STREAM, 0, 1, b"\0\0\0\x08")
                                + f.frame(f.DATA, 0, 1, b"x"), f.STREAM_CLOSED),
    "a frame above SETTINGS_MAX_FRAME_SIZE": (f.frame(f.HEADERS, f.END_HEADERS, 1, b"\0" * 16385), f.FRAME_SIZE_ERROR),
    "PING on a stream": (f.frame(f.PING, 0, 1, b"12345678"), f.PROTOCOL_ERROR),
    "PING of 7 octets": (f.frame(f.PING, 0, 0, b"1234567"), f.FRAME_SIZE_ERROR),
    "SETTINGS ACK with a payload": (f.frame(f.SETTINGS, f.ACK, 0, b"\0\x02\0\0\0\0"), f.FRAME_SIZE_ERROR),
    "SETTINGS of 5 octets": (f.frame(f.SETTINGS, 0, 0, b"\0\x02\0\0\0"), f.FRAME_SIZE_ERROR),
    "SETTINGS on a stream": (f.frame(f.SETTINGS, 0, 1), f.PROTOCOL_ERROR),
    "ENABLE_PUSH 2": (f.settings_frame({f.SETTINGS_ENABLE_PUSH: 2}), f.PROTOCOL_ERROR),
    "INITIAL_WINDOW_SIZE 2^31": (f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 31}), f.FLOW_CONTROL_ERROR),
    "MAX_FRAME_SIZE too small": (f.settings_frame({f.SETTINGS_MAX_FRAME_SIZE: 16383}), f.PROTOCOL_ERROR),
    "GOAWAY on a stream": (f.frame(f.GOAWAY, 0, 1, b"\0" * 8), f.PROTOCOL_ERROR),
    "PRIORITY on stream 0": (f.frame(f.PRIORITY, 0, 0, b"\0\0\0\x01\x10"), f.PROTOCOL_ERROR),
    "RST_STREAM on stream 0": (f.frame(f.RST_STREAM, 0, 0, b"\0\0\0\0"), f.PROTOCOL_ERROR),
    "RST_STREAM on an idle stream": (f.frame(f.RST_STREAM, 0, 1, b"\0\0\0\0"), f.PROTOCOL_ERROR),
    "RST_STREAM of 3 octets": (_headers_open() + f.frame(f.RST_STREAM, 0, 1, b"\0\0\0"), f.FRAME_SIZE_ERROR),
    "WINDOW_UPDATE on an idle stream": (f.window_update(1, 1), f.PROTOCOL_ERROR),
    "WINDOW_UPDATE of 0 on the connection": (f.window_update(0, 0), f.PROTOCOL_ERROR),
    "WINDOW_UPDATE of 3 octets": (f.frame(f.WINDOW_UPDATE, 0, 0, b"\0\0\x01"), f.FRAME_SIZE_ERROR),
    "the connection window above 2^31-1": (f.window_update(0, f.MAX_WINDOW) * 2, f.FLOW_CONTROL_ERROR),
    "CONTINUATION without HEADERS": (f.frame(f.CONTINUATION, f.END_HEADERS, 1, block(REQUEST)), f.PROTOCOL_ERROR),
    "a header block interrupted": (f.frame(f.HEADERS, 0, 1, block(REQUEST)) + f.frame(f.PING, 0, 0, b"12345678"),
                                   f.PROTOCOL_ERROR),
    "CONTINUATION of another stream": (f.frame(f.HEADERS, 0, 1, block(REQUEST))
                                       + f.frame(f.CONTINUATION, f.END_HEADERS, 3, b""), f.PROTOCOL_ERROR),
    "PUSH_PROMISE": (f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\x02"), f.PROTOCOL_ERROR),
    "an invalid header block": (f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x80"), f.COMPRESSION_ERROR),
    "DATA with padding as long as the frame": (_headers_open() + f.frame(f.DATA, f.PADDED, 1, b"\x04abc"),
                                               f.PROTOCOL_ERROR),
    "DATA beyond the connection window": (_headers_open() + f.frame(f.DATA, 0, 1, b"x" * 16384) * 5, f.FLOW_CONTROL_ERROR),
}


@pytest.mark.parametrize("case", sorted(CONNECTION_ERRORS))
@pytest.mark.parametrize("pieces", PIECES)
def test_connection_errors_end_it_with_their_code(case, pieces):
    wire, code = CONNECTION_ERRORS[case]
    s = raw_start(connection_window=65535, stream_window=1 << 20)
    with pytest.raises(ProtocolError) as error:
        feed(s, wire, pieces)
    assert error.value.code == code
    assert goaway_code(s.data_to_send()) == code
    with pytest.raises(ProtocolError):
        s.receive_data(f.frame(f.PING, 0, 0, b"12345678"))


def test_not_a_preface():
    s = server()
    with pytest.raises(ProtocolError) as error:
        s.receive_data(b"GET / HTTP/1.1\r\n")  # known wrong at the first octet, not after 24
    assert error.value.code == f.PROTOCOL_ERROR
    s = server()
    with pytest.raises(ProtocolError):
        s.receive_data(f.PREFACE + f.frame(f.PING, 0, 0, b"12345678"))  # SETTINGS must come first


def test_unknown_frames_and_flags_are_ignored():
    s = raw_start()
    events = s.receive_data(f.frame(0x42, 0xFF, 0, b"whatever") + f.frame(f.PING, 0xF0, 0, b"12345678")
                            + f.frame(f.PRIORITY, 0, 9, b"\0\0\0\x01\x10"))
    assert events == []
    assert [(t, fl) for t, fl, _, _ in parse_frames(s.data_to_send())] == [(f.PING, f.ACK)]


def test_a_stream_depending_on_itself_is_reset():
    s = raw_start()
    s.receive_data(f.frame(f.PRIORITY, 0, 3, b"\0\0\0\x03\x10"))
    assert resets(s.data_to_send()) == {3: f.PROTOCOL_ERROR}


# -- limits --

def test_concurrent_streams_beyond_the_limit_are_refused():
    s = raw_start(max_concurrent_streams=3)
    events = s.receive_data(b"".join(_headers_open(i) for i in (1, 3, 5, 7)))
    assert [e.stream_id for e in events] == [1, 3, 5]
    assert resets(s.data_to_send()) == {7: f.REFUSED_STREAM}
    s.send_trailers(1, b"\x88")
    events = s.receive_data(_headers_open(9))
    assert [e.stream_id for e in events] == [9]


@pytest.mark.parametrize("pieces", PIECES)
def test_a_continuation_flood_is_cut_off_by_frame_count(pieces):
    s = raw_start(max_continuation_frames=32)
    flood = f.frame(f.HEADERS, 0, 1, block(REQUEST)) + f.frame(f.CONTINUATION, 0, 1) * 10_000
    with pytest.raises(ProtocolError) as error:
        feed(s, flood[:9 + len(block(REQUEST)) + 9 * 40], pieces)  # 40 empty frames: stops at the 33rd
    assert error.value.code == f.ENHANCE_YOUR_CALM
    s = raw_start()
    with pytest.raises(ProtocolError) as error:
        s.receive_data(flood)
    assert error.value.code == f.ENHANCE_YOUR_CALM


def test_a_header_block_is_bounded_in_octets():
    s = raw_start(max_header_list_size=20_000)
    wire = f.frame(f.HEADERS, 0, 1, b"\x00" * 16384) + f.frame(f.CONTINUATION, 0, 1, b"\x00" * 16384)
    with pytest.raises(ProtocolError) as error:
        s.receive_data(wire)
    assert error.value.code == f.ENHANCE_YOUR_CALM


def test_rapid_reset_ends_the_connection():
    s = raw_start(early_reset_streams=100)
    pair = [_headers_open(i) + f.frame(f.RST_STREAM, 0, i, b"\0\0\0\x08") for i in range(1, 2000, 2)]
    with pytest.raises(ProtocolError) as error:
        for p in pair:
            s.receive_data(p)
    assert error.value.code == f.ENHANCE_YOUR_CALM
    assert s.early_resets == 100


def test_a_client_that_cancels_some_calls_is_not_cut_off():
    s = raw_start(early_reset_streams=100)
    for i in range(1, 3000, 2):
        s.receive_data(_headers_open(i) + f.frame(f.DATA, f.END_STREAM, i, b"x"))
        if i % 6 == 1:  # a third of the calls cancelled
            s.receive_data(f.frame(f.RST_STREAM, 0, i, b"\0\0\0\x08"))
        else:
            s.send_trailers(i, b"\x88")
    assert s.terminated is None and s.early_resets == 500


def test_unread_control_frame_answers_are_bounded():
    s = raw_start(max_queued_control_frames=1000)
    for _ in range(10):  # read between floods: fine
        s.receive_data(f.frame(f.PING, 0, 0, b"12345678") * 900 + f.settings_frame({}) * 90)
        s.data_to_send()
        s.output_drained()
    with pytest.raises(ProtocolError) as error:
        s.receive_data(f.frame(f.PING, 0, 0, b"12345678") * 1001)
    assert error.value.code == f.ENHANCE_YOUR_CALM


def test_request_window_is_given_back_only_as_it_is_consumed():
    s = raw_start(stream_window=65535, connection_window=65535)
    s.receive_data(_headers_open(1))
    events = s.receive_data(f.frame(f.DATA, 0, 1, b"x" * 16384) * 3)
    assert sum(len(e.data) for e in events) == 3 * 16384
    assert [t for t, _, _, _ in parse_frames(s.data_to_send())] == []  # nothing consumed: no WINDOW_UPDATE
    s.acknowledge_received_data(1, 3 * 16384)
    updates = {sid: struct.unpack(">I", p)[0] for t, _, sid, p in parse_frames(s.data_to_send()) if t == f.WINDOW_UPDATE}
    assert updates == {0: 3 * 16384, 1: 3 * 16384}
    s.receive_data(f.frame(f.DATA, 0, 1, b"x" * 16384) * 3 + f.frame(f.DATA, 0, 1, b"x" * 16383))  # a window's worth
    with pytest.raises(ProtocolError) as error:
        s.receive_data(f.frame(f.DATA, 0, 1, b"x"))
    assert error.value.code == f.FLOW_CONTROL_ERROR


def test_a_stream_over_its_window_is_reset():
    s = raw_start(stream_window=65535, connection_window=1 << 20)
    s.receive_data(_headers_open(1))
    events = s.receive_data(f.frame(f.DATA, 0, 1, b"x" * 16384) * 4 + f.frame(f.DATA, 0, 1, b"x" * 100))
    assert isinstance(events[-1], StreamReset) and events[-1].error_code == f.FLOW_CONTROL_ERROR


@pytest.mark.parametrize("pieces", PIECES)
def test_responses_wait_for_the_clients_window(pieces):
    s = server()
    feed(s, f.PREFACE + f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 10}) + _headers_open(1)
         + f.frame(f.DATA, f.END_STREAM, 1, b"q"), pieces)
    s.data_to_send()
    s.send_headers(1, b"\x88")
    assert not s.send_data(1, b"a" * 25, token="first")
    assert not s.send_trailers(1, b"\x88")
    sent = parse_frames(s.data_to_send())
    assert [(t, len(p)) for t, _, _, p in sent] == [(f.HEADERS, 1), (f.DATA, 10)]
    events = feed(s, f.window_update(1, 10), pieces)
    assert events == [] and [len(p) for _, _, _, p in parse_frames(s.data_to_send())] == [10]
    events = feed(s, f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 100}), pieces)  # +90 on the stream
    assert [type(e) for e in events] == [DataSent, StreamClosed] and events[0].token == "first"
    assert [(t, fl) for t, fl, _, _ in parse_frames(s.data_to_send())] == [
        (f.SETTINGS, f.ACK), (f.DATA, 0), (f.HEADERS, f.END_HEADERS | f.END_STREAM)]
    assert s.streams == {}


def test_a_reset_reports_what_was_never_sent():
    s = server()
    s.receive_data(f.PREFACE + f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 0}) + _headers_open(1))
    s.send_headers(1, b"\x88")
    s.send_data(1, b"a", token=1)
    s.send_data(1, b"b", token=2)
    events = s.receive_data(f.frame(f.RST_STREAM, 0, 1, b"\0\0\0\x08"))
    assert len(events) == 1 and events[0].unsent == [1, 2] and events[0].remote and s.queued_output == 0


def test_responses_queued_for_a_closed_window_are_bounded():
    s = server(max_queued_output=100_000)
    s.receive_data(f.PREFACE + f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 0}) + _headers_open(1))
    s.send_headers(1, b"\x88")
    for _ in range(10):
        s.send_data(1, b"x" * 10_000)
    assert s.terminated is None
    s.send_data(1, b"x")
    assert s.terminated is not None and goaway_code(s.data_to_send()) == f.ENHANCE_YOUR_CALM


def test_going_away_refuses_new_streams():
    s = raw_start()
    s.receive_data(_headers_open(1))
    s.close()
    assert goaway_code(s.data_to_send()) == f.NO_ERROR
    assert s.receive_data(_headers_open(3)) == []
    assert resets(s.data_to_send()) == {3: f.REFUSED_STREAM}
    assert 1 in s.streams


# -- the frame codec and a fuzz of the whole connection --

@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 255), st.integers(0, 9), st.binary(max_size=40)),
                max_size=12), st.integers(1, 50))
def test_frame_buffer_cuts_the_same_frames_however_the_bytes_arrive(frame_list, piece):
    wire = b"".join(f.frame(*spec) for spec in frame_list)
    buffer = f.FrameBuffer(f.DEFAULT_FRAME_SIZE)
    got = []
    for i in range(0, len(wire), piece):
        got += buffer.feed(wire[i:i + piece])
    assert got == [(t, fl, s, p) for t, fl, s, p in frame_list] and buffer.buffered() == 0


_fuzz_frame = st.one_of(
    st.tuples(st.integers(0, 10), st.integers(0, 255), st.integers(0, 8), st.binary(max_size=24)),
    st.tuples(st.just(f.HEADERS), st.sampled_from([0, 1, 4, 5, 8, 0x20, 0x25]), st.integers(0, 8),
              st.just(block(REQUEST))),
).map(lambda spec: f.frame(*spec))


@settings(max_examples=200, deadline=None)
@given(st.lists(_fuzz_frame, max_size=16), st.binary(max_size=8), st.booleans())
def test_fuzz_parses_or_raises_the_connections_protocol_error(frame_list, tail, bytewise):
    s = server(max_concurrent_streams=4, early_reset_streams=3, max_continuation_frames=3)
    wire = f.PREFACE + SETTINGS + b"".join(frame_list) + tail
    try:
        events = feed(s, wire, "bytewise" if bytewise else "whole")
    except ProtocolError as error:
        assert goaway_code(s.data_to_send()) == error.code
        return
    for event in events:
        if isinstance(event, DataReceived):
            s.acknowledge_received_data(event.stream_id, len(event.data))
        elif isinstance(event, RequestReceived):
            s.respond(event.stream_id, b"\x88", b"answer", b"\x88")
    s.data_to_send()
