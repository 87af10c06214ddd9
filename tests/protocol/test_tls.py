"""TLS and plaintext HTTP/2 on one port (tidemq.protocol.tls) in front of the gRPC transport, on a
real loopback port: grpcio's client over both, and raw sockets for peers that misbehave."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

import grpc
import pytest

from tidemq.certificate import certificate_files
from tidemq.protocol.grpc.transport import PREFACE, UNARY, GrpcServer, Method
from tidemq.protocol.tls import OFF, PERMISSIVE, REQUIRED, SniffingListener, server_context

from e2e.server import closed_by_server, speaks_http2

ECHO = "/test.Tls/Echo"
PREFACE_TIMEOUT_S = 1.0


def _echo(request: bytes, rpc) -> bytes:
    return request


class Served:
    """A GrpcServer behind a SniffingListener on its own event loop thread."""

    def __init__(self, listener: SniffingListener, event_loop: str) -> None:
        self.listener = listener
        if event_loop == "uvloop":
            import uvloop
            self.loop = uvloop.new_event_loop()
        else:
            self.loop = asyncio.new_event_loop()
        self.server = GrpcServer({ECHO: Method(UNARY, _echo, bytes, bytes)})
        listener.served = self.server.connection_count
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.port = self.loop.run_until_complete(self.server.start("127.0.0.1:0", listener))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(1.0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return s


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    cert_file, key_file = certificate_files(tmp_path_factory.mktemp("tls"))
    return cert_file, key_file


def serve(certificate, event_loop: str, mode: str = PERMISSIVE, **limits) -> Served:
    context = server_context(*certificate) if mode != OFF else None
    return Served(SniffingListener(mode, context, **limits), event_loop)


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def served(request, certificate):
    s = serve(certificate, request.param, preface_timeout=PREFACE_TIMEOUT_S)
    yield s
    s.stop()


def tls_client(certificate, served: Served) -> ssl.SSLSocket:
    """A TLS connection that verifies the server's certificate for "localhost" and offers h2."""
    context = ssl.create_default_context(cafile=certificate[0])
    context.set_alpn_protocols(["h2"])
    return context.wrap_socket(served.connect(), server_hostname="localhost")


def test_grpc_calls_over_tls_and_plaintext_on_one_port(certificate, served):
    with open(certificate[0], "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    with grpc.secure_channel(f"localhost:{served.port}", credentials) as channel:
        assert channel.unary_unary(ECHO)(b"over tls", timeout=10) == b"over tls"
    with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        assert channel.unary_unary(ECHO)(b"in plaintext", timeout=10) == b"in plaintext"


def test_tls_negotiates_h2_with_a_certificate_for_loopback_names(certificate, served):
    context = ssl.create_default_context(cafile=certificate[0])
    context.set_alpn_protocols(["h2", "http/1.1"])
    for name in ("localhost", "127.0.0.1", "::1"):
        with context.wrap_socket(served.connect(), server_hostname=name) as s:
            assert s.selected_alpn_protocol() == "h2"
            assert s.version() in ("TLSv1.2", "TLSv1.3")


def test_a_silent_peer_is_closed_after_the_preface_timeout(served):
    with served.connect() as s:
        assert closed_by_server(s)  # long before the socket's own 10 s timeout


@pytest.mark.parametrize("garbage", [
    b"\x16\x03\x01\x00\x05hello",  # a TLS record header over a body that is no ClientHello
    b"\x16" + bytes(range(256)) * 64,
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x00" * 100,
], ids=["tls-record-not-a-hello", "tls-record-of-noise", "http1", "zeros"])
def test_garbage_closes_that_connection_only(certificate, served, garbage):
    with tls_client(certificate, served) as good:
        with served.connect() as bad:
            bad.sendall(garbage)
            bad.shutdown(socket.SHUT_WR)
            while bad.recv(65536):  # an HTTP/2 GOAWAY for plaintext garbage, nothing for TLS
                pass
        assert speaks_http2(good)
    with served.connect() as s:
        assert speaks_http2(s)


def test_a_peer_that_stops_in_the_middle_of_the_handshake_is_closed(served):
    with served.connect() as s:
        s.sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes, then nothing
        assert closed_by_server(s)


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_required_refuses_plaintext_and_off_refuses_tls(certificate, event_loop):
    required = serve(certificate, event_loop, REQUIRED)
    off = serve(certificate, event_loop, OFF)
    try:
        with required.connect() as s:
            s.sendall(PREFACE)
            assert closed_by_server(s)
        with tls_client(certificate, required) as s:
            assert speaks_http2(s)
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            tls_client(certificate, off)
        with off.connect() as s:
            assert speaks_http2(s)
    finally:
        required.stop()
        off.stop()


def test_connections_waiting_for_their_first_byte_or_handshake_count_toward_the_cap(certificate):
    served = serve(certificate, "asyncio", preface_timeout=60, max_connections=5)
    try:
        ready = served.connect()
        assert speaks_http2(ready)  # one connection served ...
        waiting = [served.connect() for _ in range(4)]  # ... and four being sniffed make five
        for s in waiting[2:]:
            s.sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes
        with served.connect() as s:
            assert closed_by_server(s)  # well before the 60 s every waiting one gets
        waiting[0].sendall(PREFACE)  # it was kept waiting, not closed
        assert speaks_http2(waiting[0])
        for s in (ready, *waiting):
            s.close()
    finally:
        served.stop()


def test_stopping_closes_connections_still_being_sniffed(certificate):
    served = serve(certificate, "asyncio", preface_timeout=60)
    s = served.connect()
    with served.connect() as ready:
        assert speaks_http2(ready)
    served.stop()
    assert closed_by_server(s)
    s.close()
