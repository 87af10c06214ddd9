"""The HTTP/2 attacks of the last years' CVEs against a real `tidemq serve`, each while an official
SDK producer sends a message every 250 ms: every send succeeds within 1 s, the server's RSS grows by
less than 100 MB, and the server serves on.  The attacker speaks raw frames (python-hyper's `hpack`
encodes its header blocks)."""

from __future__ import annotations

import gzip
import socket
import struct
import threading
import time
import uuid

import hpack
import pytest
from rocketmq import Message, Producer

from .server import ServerProcess, closed_by_server, speaks_http2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME = struct.Struct(">IBI")
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4
NO_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0x0, 0x7, 0x8, 0xB
SEND = "/apache.rocketmq.v2.MessagingService/SendMessage"
MB = 1 << 20


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME.pack(len(payload) << 8 | ftype, flags, stream_id) + payload


def request_block(path: str = SEND, **extra: str) -> bytes:
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "tidemq"), ("content-type", "application/grpc"), ("te", "trailers"),
                                   *extra.items()])


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Attacker:
    """A raw HTTP/2 client connection."""

    def __init__(self, address: tuple[str, int], settings: bytes = b"") -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.buffer = b""
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))

    def send(self, data: bytes) -> bool:
        """Whether it all went (False: the server closed the connection)."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def received(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """The frames `data` completes: (type, flags, stream id, payload)."""
        self.buffer += data
        got = []
        while len(self.buffer) >= 9:
            length_type, flags, stream_id = FRAME.unpack_from(self.buffer)
            end = 9 + (length_type >> 8)
            if len(self.buffer) < end:
                break
            got.append((length_type & 0xFF, flags, stream_id & 0x7FFFFFFF, self.buffer[9:end]))
            self.buffer = self.buffer[end:]
        return got

    def frames_until_closed(self, timeout: float = 20.0) -> list[tuple[int, int, int, bytes]]:
        """Every frame the server sends until it closes the connection."""
        got = []
        self.sock.settimeout(timeout)
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            got += self.received(data)
            if not data:
                return got

    def close(self) -> None:
        self.sock.close()


def goaway_code(got) -> int | None:
    codes = [struct.unpack(">II", p[:8])[1] for t, _, _, p in got if t == GOAWAY]
    return codes[-1] if codes else None


class SteadyProducer:
    """An SDK producer sending a message every 250 ms on a thread, noting each send's time and the
    server's highest RSS."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.topic = f"steady_{uuid.uuid4().hex[:8]}"
        self.producer = Producer(server.config(), (self.topic,))
        self.latencies: list[float] = []
        self.errors: list[Exception] = []
        self.stop = threading.Event()

    def _message(self) -> Message:
        m = Message()
        m.topic, m.body = self.topic, b"steady"
        return m

    def __enter__(self) -> "SteadyProducer":
        self.producer.startup()
        self.producer.send(self._message())  # routes and connection made before the attack
        self.baseline = self.peak = rss(self.server.process.pid)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            started = time.monotonic()
            try:
                self.producer.send(self._message())
            except Exception as exc:  # noqa: BLE001 - every failure is reported by the test
                self.errors.append(exc)
            self.latencies.append(time.monotonic() - started)
            self.peak = max(self.peak, rss(self.server.process.pid))

    def __exit__(self, *exc_info) -> None:
        while len(self.latencies) < 4 and self.thread.is_alive():  # a few sends during every attack
            time.sleep(0.05)
        self.stop.set()
        self.thread.join(10)
        self.producer.shutdown()
        assert self.errors == []
        assert max(self.latencies) < 1.0, self.latencies
        assert self.peak - self.baseline < 100 * MB, f"RSS grew by {(self.peak - self.baseline) / MB:.0f} MB"
        assert self.server.process.poll() is None
        print(f"worst send {max(self.latencies) * 1000:.0f} ms, RSS growth {(self.peak - self.baseline) / MB:.1f} MB")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("h2limits") / "store", "--preface-timeout-ms", "3000",
                      "--idle-timeout-ms", "3000", "--write-stall-timeout-ms", "2000", "--max-connections", "48").start()
    yield s
    assert s.stop() == 0, s.log_text()
    assert "Traceback" not in s.log_text()


def address(server: ServerProcess) -> tuple[str, int]:
    return ("127.0.0.1", server.port)


def test_continuation_flood(server):
    flood = frame(HEADERS, 0, 1, request_block()) + frame(CONTINUATION, 0, 1) * 100_000  # 900 KB
    with SteadyProducer(server):
        for _ in range(20):
            attacker = Attacker(address(server))
            attacker.send(flood)
            assert goaway_code(attacker.frames_until_closed()) == ENHANCE_YOUR_CALM
            attacker.close()


def test_rapid_reset(server):
    block = request_block()
    pairs = b"".join(frame(HEADERS, END_HEADERS, i, block) + frame(RST_STREAM, 0, i, struct.pack(">I", CANCEL))
                     for i in range(1, 40_000, 2))
    with SteadyProducer(server):
        for _ in range(10):  # 200,000 pairs offered in all
            attacker = Attacker(address(server))
            attacker.send(pairs)
            assert goaway_code(attacker.frames_until_closed()) == ENHANCE_YOUR_CALM
            attacker.close()


def test_max_concurrent_streams(server):
    block = request_block()
    streams = b"".join(frame(HEADERS, END_HEADERS, i, block) for i in range(1, 400_000, 2))  # 200,000 streams
    with SteadyProducer(server):
        attacker = Attacker(address(server))
        attacker.send(streams)
        got = attacker.frames_until_closed()
        attacker.close()
    refused = [s for t, _, s, p in got if t == RST_STREAM and struct.unpack(">I", p)[0] == REFUSED_STREAM]
    settings = next(p for t, fl, _, p in got if t == SETTINGS and not fl & 1)
    limit = dict(struct.iter_unpack(">HI", settings))[3]  # SETTINGS_MAX_CONCURRENT_STREAMS
    assert limit == 1000 and refused[0] == 2 * limit + 1  # the first stream above the limit
    assert goaway_code(got) == ENHANCE_YOUR_CALM  # it kept opening streams it was refused


@pytest.mark.parametrize("flood", ["PING", "SETTINGS"])
def test_control_frame_flood_from_a_client_that_never_reads(server, flood):
    unit = frame(PING, 0, 0, b"12345678") if flood == "PING" else frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535))
    with SteadyProducer(server):
        attacker = Attacker(address(server))
        attacker.sock.settimeout(0.5)
        burst = unit * 10_000
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and attacker.send(burst):
            pass  # until the server stops reading (its writes are paused), then drops us
        got = attacker.frames_until_closed()  # reading only now: the answers, then the end
        attacker.close()
    assert len(got) < 400_000  # the answers queued were bounded


def test_gzip_bomb(server):
    bomb = gzip.compress(b"\0" * (60 * MB))  # about 61 KB
    message = struct.pack(">BI", 1, len(bomb)) + bomb
    block = request_block(**{"grpc-encoding": "gzip", "x-mq-client-id": "attacker"})
    decoder = hpack.Decoder()
    wire = b""
    for i in range(1, 41, 2):  # 20 requests
        wire += frame(HEADERS, END_HEADERS, i, block)
        wire += b"".join(frame(DATA, 0, i, message[j:j + 16384]) for j in range(0, len(message), 16384))
        wire += frame(DATA, END_STREAM, i)
    with SteadyProducer(server):
        attacker = Attacker(address(server))
        attacker.send(wire)
        attacker.sock.settimeout(10)
        statuses = {}
        while len(statuses) < 20:
            data = attacker.sock.recv(1 << 16)
            assert data, "the server closed the connection"
            for t, fl, s, p in attacker.received(data):
                if t == HEADERS:
                    fields = dict(decoder.decode(p))
                    if "grpc-status" in fields:
                        statuses[s] = fields["grpc-status"]
        attacker.close()
    assert set(statuses.values()) == {"8"}  # RESOURCE_EXHAUSTED


def test_flow_control_bounds_what_a_connection_buffers(server):
    """8 streams each sending a 15 MiB message (under the 16 MiB limit) that never ends, as fast as
    the windows allow: the server holds at most its per-connection buffer, refusing the streams
    that would exceed it."""
    block = request_block(**{"x-mq-client-id": "attacker"})
    with SteadyProducer(server):
        attacker = Attacker(address(server))
        streams = list(range(1, 17, 2))
        sent = {s: 0 for s in streams}
        prefix = struct.pack(">BI", 0, 15 * MB)
        attacker.send(b"".join(frame(HEADERS, END_HEADERS, s, block) + frame(DATA, 0, s, prefix) for s in streams))
        chunk = frame(DATA, 0, 0, b"x" * 16384)[9:]
        windows = {s: 65535 - 5 for s in streams}  # the server's initial window is read from its SETTINGS
        connection_window = 65535 - 5 * len(streams)
        reset, decoder = {}, hpack.Decoder()
        deadline = time.monotonic() + 20
        while len(reset) < len(streams) and time.monotonic() < deadline:
            for s in streams:
                if s in reset or sent[s] >= 15 * MB:
                    continue
                size = min(16384, windows[s], connection_window, 15 * MB - sent[s])
                if size > 0:
                    attacker.send(frame(DATA, 0, s, chunk[:size]))
                    windows[s] -= size
                    connection_window -= size
                    sent[s] += size
            attacker.sock.settimeout(0.05)
            try:
                data = attacker.sock.recv(1 << 20)
                if not data:
                    break
            except TimeoutError:
                data = b""
            for t, flags, stream_id, payload in attacker.received(data):
                if t == SETTINGS and not flags & 1:
                    initial = dict(struct.iter_unpack(">HI", payload)).get(4)
                    if initial:
                        windows = {s: w + initial - 65535 for s, w in windows.items()}
                elif t == WINDOW_UPDATE:
                    increment = struct.unpack(">I", payload)[0]
                    if stream_id == 0:
                        connection_window += increment
                    else:
                        windows[stream_id] += increment
                elif t == HEADERS:
                    fields = dict(decoder.decode(payload))
                    if "grpc-status" in fields:
                        reset[stream_id] = fields["grpc-status"]
            if sum(sent.values()) >= 8 * 15 * MB:
                break
        attacker.close()
    assert sum(sent.values()) - 15 * MB * len(reset) <= 40 * MB  # the rest was refused: never held
    assert reset and set(reset.values()) == {"8"}  # RESOURCE_EXHAUSTED


def test_preface_and_idle_timeouts_and_the_connection_cap(server):
    with SteadyProducer(server):
        idle = Attacker(address(server))
        silent = []
        for _ in range(60):  # above the cap of 48; each stops inside the connection preface
            sock = socket.create_connection(address(server), timeout=10)
            sock.sendall(PREFACE[:16])
            silent.append(sock)
        served = 0
        for sock in silent:  # each ends: refused at once above the cap, else at the preface timeout
            sock.settimeout(10)
            received = b""
            try:
                while data := sock.recv(1 << 16):
                    received += data
            except ConnectionResetError:
                pass
            served += received.startswith(frame(SETTINGS, 0, 0)[3:4], 3)  # the server's SETTINGS
            sock.close()
        assert 0 < served <= 48 - 2  # the producer and the idle connection hold two of the 48: some refused
        assert goaway_code(idle.frames_until_closed()) == NO_ERROR  # told it was idle, then closed
        idle.close()


PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01"  # a TLS ClientHello's first bytes, then nothing


def refused(sock: socket.socket) -> bool:
    """True when the server closes a fresh connection without answering the HTTP/2 preface."""
    try:
        return not speaks_http2(sock)
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_tls_handshakes_count_toward_the_cap_and_end_at_the_preface_timeout(server):
    with SteadyProducer(server):
        stalled = []
        for _ in range(60):  # above the cap of 48; each stops inside its TLS handshake
            sock = socket.create_connection(address(server), timeout=10)
            sock.sendall(PARTIAL_CLIENT_HELLO)
            stalled.append(sock)
        with socket.create_connection(address(server), timeout=10) as probe:
            assert refused(probe)  # the handshakes hold the cap
        for sock in stalled:  # each ends: refused at once above the cap, else at the 3 s preface timeout
            sock.settimeout(6)  # (a handshake's own timeout would be 10 s)
            assert closed_by_server(sock)
            sock.close()
        with socket.create_connection(address(server), timeout=10) as again:
            assert speaks_http2(again)


def test_limits_are_set_by_flags_and_config_keys(tmp_path):
    import argparse

    from tidemq.serve_options import add_serve_arguments, http2_limits, resolve_options

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    config = tmp_path / "tidemq.toml"
    config.write_text("grpcMaxConcurrentStreams = 64\ngrpcClientIdleTimeMills = 5000\ngrpcPrefaceTimeoutMillis = 2000\n"
                      "grpcWriteStallTimeoutMillis = 7000\ngrpcMaxConnections = 10\n")
    limits = http2_limits(resolve_options(parser.parse_args(["--config", str(config), "--max-connections", "20"])))
    assert (limits.max_concurrent_streams, limits.idle_timeout_s, limits.preface_timeout_s,
            limits.write_stall_timeout_s, limits.max_connections) == (64, 5.0, 2.0, 7.0, 20)
    with pytest.raises(ValueError, match="max_concurrent_streams"):
        resolve_options(parser.parse_args(["--max-concurrent-streams", "0"]))
