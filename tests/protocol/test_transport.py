"""tidemq's HTTP/2 gRPC transport, served on a real loopback port: grpcio's client for what a gRPC
client does, and a raw socket for what a well-behaved client never does."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

import grpc
import pytest

from tidemq.protocol.http2 import hpack
from tidemq.protocol.grpc.transport import BIDI_STREAM, SERVER_STREAM, UNARY, GrpcServer, Method

SERVICE = "/test.Transport/"


def _identity(data: bytes) -> bytes:
    return data


class Service:
    """Handlers on the server's event loop; what they saw, for the tests."""

    def __init__(self) -> None:
        self.seen_metadata = None
        self.seen_remaining = None
        self.cancelled = threading.Event()
        self.unwritten: list[int] = []
        self.release = asyncio.Event()
        self.mute_read = threading.Event()

    def methods(self) -> dict[str, Method]:
        table = {
            "Echo": Method(UNARY, self.echo, _identity, _identity),
            "AsyncEcho": Method(UNARY, self.async_echo, _identity, _identity),
            "Fail": Method(UNARY, self.fail, _identity, _identity),
            "Hang": Method(UNARY, self.hang, _identity, _identity),
            "Slow": Method(UNARY, self.slow, _identity, _identity),
            "Repeat": Method(SERVER_STREAM, self.repeat, _identity, _identity),
            "Chat": Method(BIDI_STREAM, self.chat, _identity, _identity),
            "Mute": Method(BIDI_STREAM, self.mute, _identity, _identity),
        }
        return {SERVICE + name: m for name, m in table.items()}

    def echo(self, request: bytes, rpc) -> bytes:
        self.seen_metadata = dict(rpc.metadata)
        self.seen_remaining = rpc.time_remaining()
        return request

    async def async_echo(self, request: bytes, rpc) -> bytes:
        await asyncio.sleep(0.001)
        return request[::-1]

    def fail(self, request: bytes, rpc) -> bytes:
        raise RuntimeError("boom")

    async def hang(self, request: bytes, rpc) -> bytes:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    async def slow(self, request: bytes, rpc) -> bytes:
        await self.release.wait()
        return b"done"

    async def repeat(self, request: bytes, rpc) -> list[bytes]:
        """Request: b"<count>:<size>"; answers count messages of size bytes (byte i is i % 251)."""
        count, size = map(int, request.split(b":"))
        rpc.on_unwritten = self.unwritten.append
        return [bytes([i % 251]) * size for i in range(count)]

    async def mute(self, rpc) -> None:
        """Reads nothing until `mute_read` is set, then everything."""
        await asyncio.get_running_loop().run_in_executor(None, self.mute_read.wait)
        while await rpc.read() is not None:
            pass

    async def chat(self, rpc) -> None:
        while True:
            message = await rpc.read()
            if message is None:
                return
            await rpc.write(message.upper())


@pytest.fixture(scope="module")
def served():
    """A GrpcServer on its own event loop thread; yields (service, address, loop, server)."""
    service = Service()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    def run():
        asyncio.set_event_loop(loop)

        async def start():
            service.release = asyncio.Event()
            server = GrpcServer(service.methods(), max_receive_message_length=8 << 20)
            box["server"] = server
            box["port"] = await server.start("127.0.0.1:0")
            started.set()

        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    yield service, f"127.0.0.1:{box['port']}", loop, box["server"]
    asyncio.run_coroutine_threadsafe(box["server"].stop(1.0), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture()
def channel(served):
    _, address, _, _ = served
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1),
                                                 ("grpc.max_send_message_length", -1)]) as ch:
        yield ch


def unary(channel, name):
    return channel.unary_unary(SERVICE + name)


def test_unary_answers_and_sees_metadata_and_deadline(served, channel):
    service = served[0]
    answer = unary(channel, "Echo")(b"hello", metadata=(("x-mq-client-id", "c-1"), ("trace-bin", b"\x00\xff")),
                                    timeout=5)
    assert answer == b"hello"
    assert service.seen_metadata["x-mq-client-id"] == "c-1"
    assert service.seen_metadata["trace-bin"] == b"\x00\xff"
    assert 3 < service.seen_remaining <= 5
    assert unary(channel, "Echo")(b"") == b""  # an empty message is still one message


def test_many_concurrent_calls_on_one_connection(served, channel):
    echo = unary(channel, "AsyncEcho")
    futures = [echo.future(str(i).encode() * (1 + i % 50)) for i in range(400)]
    assert [f.result(timeout=30) for f in futures] == [(str(i).encode() * (1 + i % 50))[::-1] for i in range(400)]


def test_messages_larger_than_every_window_and_frame(served, channel):
    big = bytes(range(256)) * (6 << 12)  # 6 MiB: beyond the default 64 KiB windows and 16 KiB frames
    assert unary(channel, "Echo")(big, timeout=30) == big
    count, size = 4, 3 << 20
    replies = list(channel.unary_stream(SERVICE + "Repeat")(f"{count}:{size}".encode(), timeout=30))
    assert [len(r) for r in replies] == [size] * count
    assert all(r == bytes([i % 251]) * size for i, r in enumerate(replies))


def test_gzip_compressed_requests_are_inflated(served, channel):
    body = b"compress me " * 1000
    assert unary(channel, "Echo")(body, compression=grpc.Compression.Gzip) == body


def test_unknown_method_and_failing_handler(served, channel):
    with pytest.raises(grpc.RpcError) as missing:
        unary(channel, "Nope")(b"x")
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as failed:
        unary(channel, "Fail")(b"x")
    assert failed.value.code() == grpc.StatusCode.UNKNOWN


def test_request_over_the_limit_is_refused_and_the_connection_serves_on(served, channel):
    with pytest.raises(grpc.RpcError) as refused:
        unary(channel, "Echo")(b"x" * (9 << 20), timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert unary(channel, "Echo")(b"after") == b"after"


def test_client_deadline_cancels_the_handler(served, channel):
    service = served[0]
    service.cancelled.clear()
    with pytest.raises(grpc.RpcError) as late:
        unary(channel, "Hang")(b"x", timeout=0.2)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert service.cancelled.wait(5)


def test_bidi_stream_reads_until_the_client_ends(served, channel):
    chat = channel.stream_stream(SERVICE + "Chat")
    words = [b"one", b"two", b"x" * 100_000, b"four"]
    assert list(chat(iter(words), timeout=10)) == [w.upper() for w in words]


# -- raw HTTP/2 ----------------------------------------------------------------------------------

FRAME = struct.Struct(">IBI")


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME.pack(len(payload) << 8 | ftype, flags, stream_id) + payload


def request_block(path: str) -> bytes:
    return b"".join(hpack.encode_literal(k.encode(), v.encode()) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "test"),
        ("content-type", "application/grpc"), ("te", "trailers")))


def serve_and_run(client_side, service: "Service | None" = None, **server_options) -> None:
    """Run `client_side(address)` on a thread against a GrpcServer of its own."""
    async def scenario():
        server = GrpcServer((service or Service()).methods(), **server_options)
        port = await server.start("127.0.0.1:0")
        try:
            await asyncio.get_running_loop().run_in_executor(None, client_side, f"127.0.0.1:{port}")
        finally:
            await server.stop(1.0)

    asyncio.run(scenario())


class RawClient:
    """Just enough HTTP/2 to misbehave."""

    def __init__(self, address: str, initial_window: int = 65535) -> None:
        host, port = address.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.decoder = hpack.Decoder()
        self.buffer = b""
        settings = struct.pack(">HI", 4, initial_window)
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, settings))

    def request(self, stream_id: int, path: str, message: bytes, end: bool = True) -> None:
        block = request_block(path)
        body = struct.pack(">BI", 0, len(message)) + message
        self.sock.sendall(frame(1, 0x4, stream_id, block) + frame(0, 0x1 if end else 0, stream_id, body))

    def frames(self, until, timeout: float = 5.0):
        """Frames received (type, flags, stream, payload) until `until(frame)` is true, or the
        connection closes."""
        got = []
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            while len(self.buffer) >= 9:
                length_type, flags, stream_id = FRAME.unpack_from(self.buffer)
                length = length_type >> 8
                if len(self.buffer) < 9 + length:
                    break
                f = (length_type & 0xFF, flags, stream_id & 0x7FFFFFFF, self.buffer[9:9 + length])
                self.buffer = self.buffer[9 + length:]
                got.append(f)
                if until(f):
                    return got
            data = self.sock.recv(1 << 16)
            if not data:
                return got
            self.buffer += data
        raise AssertionError(f"timed out; frames so far: {[(t, fl, s) for t, fl, s, _ in got]}")

    def close(self) -> None:
        self.sock.close()


def test_a_stream_reset_while_blocked_by_flow_control_reports_what_was_not_written(served):
    service = served[0]
    service.unwritten.clear()
    client = RawClient(served[1], initial_window=1000)  # room for one 600-byte message, not two
    try:
        client.request(1, SERVICE + "Repeat", b"5:600")
        data = client.frames(lambda f: f[0] == 0)  # the first DATA
        assert sum(len(p) for t, _, _, p in data if t == 0) <= 1000
        client.sock.sendall(frame(3, 0, 1, struct.pack(">I", 8)))  # RST_STREAM CANCEL
        deadline = time.monotonic() + 5
        while not service.unwritten and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.unwritten == [4]  # 5 messages; the first was written whole
        # the connection still serves: a PING is answered
        client.sock.sendall(frame(6, 0, 0, b"12345678"))
        pong = client.frames(lambda f: f[0] == 6)
        assert pong[-1][1] == 1 and pong[-1][3] == b"12345678"
    finally:
        client.close()


def test_protocol_errors_close_only_that_connection(served, channel):
    bad = RawClient(served[1])
    try:
        bad.sock.sendall(frame(0, 0, 0, b"data on stream zero"))
        got = bad.frames(lambda f: f[0] == 7)  # GOAWAY
        assert struct.unpack(">II", got[-1][3][:8])[1] == 1  # PROTOCOL_ERROR
    finally:
        bad.close()
    garbage = socket.create_connection(served[1].split(":"), timeout=5)
    garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    garbage.settimeout(5)
    received = b""
    while chunk := garbage.recv(4096):
        received += chunk
    garbage.close()
    assert unary(channel, "Echo")(b"still here") == b"still here"


def test_a_header_block_split_over_continuation_frames(served):
    client = RawClient(served[1])
    try:
        block = b"".join(hpack.encode_literal(k.encode(), v.encode()) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", SERVICE + "Echo"), (":authority", "test"),
            ("content-type", "application/grpc"), ("x-long", "v" * 40_000)))
        parts = [block[i:i + 16_000] for i in range(0, len(block), 16_000)]
        frames = frame(1, 0, 1, parts[0]) + b"".join(
            frame(9, 0x4 if i == len(parts) - 1 else 0, 1, p) for i, p in enumerate(parts[1:], 1))
        frames += frame(0, 0x1, 1, struct.pack(">BI", 0, 3) + b"abc")
        client.sock.sendall(frames)
        got = client.frames(lambda f: f[0] == 1 and f[1] & 0x1)  # the trailers
        assert b"".join(p for t, _, s, p in got if t == 0 and s == 1)[5:] == b"abc"
        assert ("grpc-status", "0") in client.decoder.decode(got[-1][3])
    finally:
        client.close()


def test_shutdown_finishes_calls_in_flight_and_refuses_new_ones():
    async def scenario():
        service = Service()
        server = GrpcServer(service.methods())
        port = await server.start("127.0.0.1:0")
        address = f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(address) as ch:
            slow = ch.unary_unary(SERVICE + "Slow")
            hang = ch.unary_unary(SERVICE + "Hang")
            assert await ch.unary_unary(SERVICE + "Echo")(b"warm") == b"warm"
            answered = asyncio.ensure_future(slow(b"x", timeout=30))
            cancelled = asyncio.ensure_future(hang(b"x", timeout=30))
            await asyncio.sleep(0.2)
            stopping = asyncio.ensure_future(server.stop(grace=1.0))
            await asyncio.sleep(0.2)
            service.release.set()
            assert await answered == b"done"
            with pytest.raises(grpc.RpcError) as killed:
                await cancelled
            assert killed.value.code() == grpc.StatusCode.CANCELLED
            await stopping
            assert service.cancelled.is_set()
            with pytest.raises(grpc.RpcError) as refused:
                await ch.unary_unary(SERVICE + "Echo")(b"late", timeout=2)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())


def test_a_request_arriving_in_pieces_of_any_size(served):
    """Frames cut anywhere by the network: the preface, a frame header, a payload."""
    client = RawClient.__new__(RawClient)
    host, port = served[1].split(":")
    client.sock = socket.create_connection((host, int(port)), timeout=5)
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.decoder, client.buffer = hpack.Decoder(), b""
    block = b"".join(hpack.encode_literal(k.encode(), v.encode()) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", SERVICE + "Echo"), (":authority", "test"),
        ("content-type", "application/grpc")))
    message = bytes(range(256)) * 8
    wire = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(1, 0x4, 1, block)
            + frame(0, 0, 1, struct.pack(">BI", 0, len(message)) + message[:1000]) + frame(0, 0x1, 1, message[1000:]))
    try:
        sizes = [1, 2, 3, 5, 7, 9, 11, 64, 1000]
        position, i = 0, 0
        while position < len(wire):
            piece = wire[position:position + sizes[i % len(sizes)]]
            client.sock.sendall(piece)
            position += len(piece)
            i += 1
            time.sleep(0.0005)
        got = client.frames(lambda f: f[0] == 1 and f[1] & 0x1 and f[2] == 1)
        assert b"".join(p for t, _, s, p in got if t == 0 and s == 1)[5:] == message
    finally:
        client.close()


def test_a_whole_request_over_the_limit_in_one_frame_is_refused_with_one_reset():
    """A request whose only DATA frame ends the stream goes the one-message way: the size limit
    holds there too.  A refused request still being sent is reset once, not twice."""
    def client_side(address):
        client = RawClient(address)
        try:
            client.request(1, SERVICE + "Echo", b"y" * 101)  # one DATA frame, END_STREAM
            got = client.frames(lambda f: f[0] == 1 and f[1] & 0x1 and f[2] == 1)
            assert ("grpc-status", str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])) in client.decoder.decode(got[-1][3])
            client.request(3, SERVICE + "Echo", b"z" * 200, end=False)  # refused while still sending
            got = client.frames(lambda f: f[0] == 3 and f[2] == 3)  # its RST_STREAM
            client.request(5, SERVICE + "Echo", b"ok")
            got += client.frames(lambda f: f[0] == 1 and f[1] & 0x1 and f[2] == 5)
            assert [f[0] for f in got if f[2] == 3].count(3) == 1
            assert b"".join(p for t, _, s, p in got if t == 0 and s == 5)[5:] == b"ok"
        finally:
            client.close()

    serve_and_run(client_side, max_receive_message_length=100)


def _statuses(client: RawClient, frames_got) -> dict[int, str]:
    statuses = {}
    for t, _, s, p in frames_got:
        if t == 1:
            fields = dict(client.decoder.decode(p))
            if "grpc-status" in fields:
                statuses[s] = fields["grpc-status"]
            elif ":status" in fields:
                statuses[s] = fields[":status"]
    return statuses


def test_a_request_that_is_not_grpc_is_answered_once_it_is_read(served):
    client = RawClient(served[1])
    try:
        get = b"".join(hpack.encode_literal(k.encode(), v.encode()) for k, v in (
            (":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "test")))
        client.sock.sendall(frame(1, 0x4, 1, get) + frame(6, 0, 0, b"pingpong"))
        before_end = client.frames(lambda f: f[0] == 6 and f[1] & 0x1)  # everything handled up to the PING
        assert [f for f in before_end if f[2] == 1] == []  # nothing on the stream yet
        client.sock.sendall(frame(0, 0x1, 1, b"ignored body"))
        got = client.frames(lambda f: f[0] == 0 and f[1] & 0x1 and f[2] == 1)
        assert _statuses(client, got) == {1: "405"}
        assert b"gRPC" in b"".join(p for t, _, s, p in got if t == 0)
        assert not [f for f in got if f[0] == 3]  # read whole: no RST_STREAM
    finally:
        client.close()


def test_a_compressed_request_inflating_beyond_the_limit_is_resource_exhausted():
    import gzip

    async def scenario():
        server = GrpcServer(Service().methods(), max_receive_message_length=1 << 20, max_inflated_message_length=10_000)
        port = await server.start("127.0.0.1:0")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                echo = ch.unary_unary(SERVICE + "Echo")
                assert await echo(b"z" * 10_000, compression=grpc.Compression.Gzip) == b"z" * 10_000
                with pytest.raises(grpc.RpcError) as bomb:
                    await echo(b"z" * 10_001, compression=grpc.Compression.Gzip)
                assert bomb.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await server.stop(1.0)
        assert len(gzip.compress(b"z" * 10_001)) < 100  # what was sent was small

    asyncio.run(scenario())


def test_incomplete_requests_a_connection_holds_are_bounded():
    from tidemq.protocol.http2 import Limits

    def client_side(address):
        client = RawClient(address)
        try:
            for stream_id in (1, 3, 5):  # 900 of a 1000-octet message each, not finished
                client.sock.sendall(frame(1, 0x4, stream_id, request_block(SERVICE + "Echo"))
                                    + frame(0, 0, stream_id, struct.pack(">BI", 0, 1000) + b"q" * 900))
            got = client.frames(lambda f: f[0] == 1 and f[1] & 0x1)
            assert _statuses(client, got) == {5: str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])}
            client.sock.sendall(frame(0, 0x1, 1, b"q" * 100))  # the others go on
            got = client.frames(lambda f: f[0] == 1 and f[1] & 0x1 and f[2] == 1)
            assert _statuses(client, got)[1] == "0"
        finally:
            client.close()

    serve_and_run(client_side, max_receive_message_length=1000, limits=Limits(max_request_buffer=2500))


def test_a_bidi_stream_gets_window_back_only_as_its_handler_reads():
    from tidemq.protocol.http2 import Limits

    service = Service()

    def client_side(address):
        client = RawClient(address)
        try:
            body = struct.pack(">BI", 0, 20_000) + b"m" * 20_000
            pieces = frame(0, 0, 1, body[:16384]) + frame(0, 0, 1, body[16384:])
            client.sock.sendall(frame(1, 0x4, 1, request_block(SERVICE + "Mute")) + pieces + pieces)  # 2, unread
            client.sock.sendall(frame(6, 0, 0, b"pingpong"))
            got = client.frames(lambda f: f[0] == 6 and f[1] & 0x1)  # all of it handled
            assert [f for f in got if f[0] == 8 and f[2] == 1] == []  # no WINDOW_UPDATE for the stream
            service.mute_read.set()  # the handler reads: the window comes back
            got = client.frames(lambda f: f[0] == 8 and f[2] == 1)
            assert struct.unpack(">I", got[-1][3])[0] == 2 * 20_005
        finally:
            service.mute_read.set()
            client.close()

    serve_and_run(client_side, service, limits=Limits(stream_window=100_000))  # WINDOW_UPDATE per 25,000
