"""A broker imports what it serves with and nothing else: no Spark, no Arrow, no client SDK."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer

from .server import READY

NOT_FOR_A_BROKER = ("pyspark", "pyarrow", "py4j", "opentelemetry", "grpc", "rocketmq.v5")

# `tidemq serve` as the command runs it, listing its sys.modules when it exits
SERVE_AND_LIST_MODULES = """
import atexit, runpy, sys
atexit.register(lambda: print("MODULES " + " ".join(sorted(sys.modules)), file=sys.stderr, flush=True))
sys.argv = ["tidemq", *sys.argv[1:]]
runpy.run_module("tidemq.cli", run_name="__main__")
"""


def test_the_broker_process_imports_no_pipeline_and_no_client_sdk(tmp_path):
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-c", SERVE_AND_LIST_MODULES, "serve", "--store", str(tmp_path / "store"),
               "--listen", "127.0.0.1:0", "--segment-size", str(1 << 20)]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        give_up = time.monotonic() + 60
        while not (ready := READY.search(log_path.read_text(errors="replace"))):
            assert server.poll() is None and time.monotonic() < give_up, log_path.read_text(errors="replace")
            time.sleep(0.05)
        producer = Producer(ClientConfiguration(f"127.0.0.1:{ready.group(2)}", Credentials(), request_timeout=3), ("orders",))
        producer.startup()
        try:
            message = Message()
            message.topic, message.body, message.tag = "orders", b"paid", "paid"
            assert producer.send(message).message_id
        finally:
            producer.shutdown()
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, log_path.read_text(errors="replace")
    listed = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith("MODULES ")]
    modules = set(listed[-1].split()[1:])
    assert {"tidemq.server", "rocketmq.grpc_protocol.service_pb2"} <= modules
    unwanted = sorted(m for m in modules if any(m == u or m.startswith(u + ".") for u in NOT_FOR_A_BROKER))
    assert unwanted == []
