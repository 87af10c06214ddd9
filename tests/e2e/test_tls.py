"""TLS on `tidemq serve`: the official clients with TLS (the Java and Go clients' default) and
without, on one port; `--tls required|off`; the self-signed certificate kept in the store."""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import stat
import subprocess
import sys
import uuid

import pytest

from tidemq.certificate import certificate_files
from tidemq.protocol.grpc.transport import PREFACE
from tidemq.server import tls_listener

from .server import ServerProcess, closed_by_server, speaks_http2, tidemq
from .test_serve_options import parse

FLUSH_MODES = ("async",)  # TLS does not depend on the flush policy

# The Python SDK verifies the server against grpc's default roots, which grpc reads once per
# process from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH: it runs in a child process that trusts the file.
PYTHON_SDK_ROUND_TRIP = """
import json, sys
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

address, topic, tls = sys.argv[1], sys.argv[2], sys.argv[3] == "on"
config = ClientConfiguration(address, Credentials(), request_timeout=5)
producer = Producer(config, (topic,), tls_enable=tls)
producer.startup()
sent = []
for i in range(3):
    m = Message()
    m.topic, m.body = topic, f"python-{i}".encode()
    sent.append(producer.send(m).message_id)
producer.shutdown()
consumer = SimpleConsumer(config, topic + "-group", {topic: FilterExpression()}, await_duration=2, tls_enable=tls)
consumer.startup()
received = []
while len(received) < len(sent):
    for m in consumer.receive(16, 20):
        consumer.ack(m)
        received.append(m.message_id)
consumer.shutdown()
print(json.dumps({"sent": sent, "received": received}))
"""


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def cert_file(server: ServerProcess) -> str:
    return str(server.store / "config" / "tls" / "cert.pem")


def python_sdk_round_trip(server: ServerProcess, tls: bool, trusted: str | None = None) -> dict:
    env = dict(os.environ)
    if trusted:
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = trusted
    result = subprocess.run([sys.executable, "-c", PYTHON_SDK_ROUND_TRIP, server.address, unique("PyTls"),
                             "on" if tls else "off"], capture_output=True, text=True, env=env, timeout=90)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


def tls_connection(server: ServerProcess, trusted: str) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=trusted)
    context.set_alpn_protocols(["h2"])
    return context.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10),
                               server_hostname="127.0.0.1")


def plaintext_refused(server: ServerProcess) -> bool:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(PREFACE)
        return closed_by_server(s)


def test_python_sdk_with_and_without_tls_on_one_port(server):
    over_tls = python_sdk_round_trip(server, tls=True, trusted=cert_file(server))
    assert sorted(over_tls["received"]) == sorted(over_tls["sent"]) and len(over_tls["sent"]) == 3
    plaintext = python_sdk_round_trip(server, tls=False)
    assert sorted(plaintext["received"]) == sorted(plaintext["sent"]) and len(plaintext["sent"]) == 3


@pytest.mark.parametrize("tls", ["default", "off"])
@pytest.mark.parametrize("language", ["java", "go"])
def test_official_clients_send_and_receive(server, request, language, tls):
    """With their default configuration (TLS on), and with TLS off, against a permissive broker."""
    client = request.getfixturevalue(f"{language}_client")
    topic = unique(f"{language.capitalize()}Tls")
    receiving = client.start("receive", server.address, "--topic", topic, "--group", topic + "-group", "--count", 4,
                             "--await-ms", 2000, "--timeout-ms", 60_000, "--tls", tls)
    sent = client.run("send", server.address, "--topic", topic, "--count", 4, "--tag", "t", "--keys", "k1,k2",
                      "--tls", tls).check()
    received = receiving.wait().check()
    assert sent.tls is received.tls is (tls == "default")
    assert sorted(m["message_id"] for m in received.events("received")) == \
        sorted(m["message_id"] for m in sent.events("sent"))
    assert {(m["body"], m["tag"], tuple(m["keys"])) for m in received.events("received")} == \
        {(f"message-{i}", "t", ("k1", "k2")) for i in range(4)}


def test_required_refuses_plaintext_and_the_certificate_is_reused_across_restarts(tmp_path):
    server = ServerProcess(tmp_path / "store", "--tls", "required").start()
    try:
        trusted = cert_file(server)
        first = open(trusted, "rb").read()
        key = server.store / "config" / "tls" / "key.pem"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert plaintext_refused(server)
        with tls_connection(server, trusted) as s:
            assert s.selected_alpn_protocol() == "h2" and speaks_http2(s)
        assert server.stop() == 0
        server.start()
        assert open(trusted, "rb").read() == first
        with tls_connection(server, trusted) as s:
            assert speaks_http2(s)
        assert "creating a self-signed TLS certificate" in server.log_text()
        assert server.log_text().count("creating a self-signed TLS certificate") == 1
    finally:
        assert server.stop() == 0, server.log_text()


def test_off_refuses_tls_and_makes_no_certificate(tmp_path):
    server = ServerProcess(tmp_path / "store", "--tls", "off").start()
    try:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
                context.wrap_socket(raw, server_hostname="localhost")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            assert speaks_http2(s)
        assert not (server.store / "config" / "tls").exists()
    finally:
        assert server.stop() == 0, server.log_text()


def test_the_users_certificate_files(tmp_path):
    cert, key = certificate_files(tmp_path / "mine")
    server = ServerProcess(tmp_path / "store", "--tls-cert", cert, "--tls-key", key).start()
    try:
        with tls_connection(server, cert) as s:
            assert speaks_http2(s)
        assert not (server.store / "config" / "tls").exists()
    finally:
        assert server.stop() == 0, server.log_text()


def test_bad_tls_options_are_refused_with_a_clear_message(tmp_path):
    cert, key = certificate_files(tmp_path / "mine")
    with pytest.raises(ValueError, match="--tls must be off, permissive or required"):
        parse("--tls", "sometimes")
    assert parse("--tls", "enforcing").tls == "required" and parse("--tls", "disabled").tls == "off"
    cases = [
        (("--tls-cert", cert), "--tls-cert and --tls-key go together"),
        (("--tls-cert", cert, "--tls-key", str(tmp_path / "missing.pem")), "missing.pem does not exist"),
        (("--tls-cert", key, "--tls-key", key), f"TLS certificate {key} with key {key}"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            tls_listener(parse("--store", str(tmp_path / "store"), *args))


def test_tls_options_from_the_config_file(tmp_path):
    config = tmp_path / "tidemq.toml"
    config.write_text('tlsServerMode = "enforcing"\ntlsCertPath = "/etc/tidemq/cert.pem"\n'
                      'tlsKeyPath = "/etc/tidemq/key.pem"\n')
    options = parse("--config", str(config))
    assert (options.tls, options.tls_cert, options.tls_key) == ("required", "/etc/tidemq/cert.pem", "/etc/tidemq/key.pem")
    assert parse("--config", str(config), "--tls", "permissive").tls == "permissive"
    assert parse().tls == "permissive"


def test_a_bad_certificate_stops_serve_before_the_store_opens(tmp_path):
    store = tmp_path / "store"
    _, key = certificate_files(tmp_path / "mine")
    result = tidemq("serve", "--store", str(store), "--listen", "127.0.0.1:0", "--tls-cert", key, "--tls-key", key)
    assert result.returncode == 2 and result.stderr.startswith("tidemq: TLS certificate "), result.stderr
    assert not (store / "abort").exists()
