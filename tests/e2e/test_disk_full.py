"""A full disk under a real `tidemq serve` and the official Python SDK: on a small file system of
its own (tmpfs), filled by another process as a shared disk is.  Past RocketMQ's
diskSpaceWarningLevelRatio (90%) sends are refused with TOO_MANY_REQUESTS while receives go on;
with no space left at all, a receive whose pop-journal line the disk refuses gets the same precise
code and changes nothing; once space is freed, sends and receives go on, and every message the
producer was told is stored is delivered exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from rocketmq import FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.v5.exception import TooManyRequestsException

from .filling import fill
from .server import ServerProcess

FS_SIZE = "48m"
DISK_FULL = 42900  # apache.rocketmq.v2.Code.TOO_MANY_REQUESTS
WAIT_S = 10.0  # the store looks at its disk once a second
DISK_FULL_EXIT = 3  # `tidemq serve` (or any command) stopped for want of disk space


@contextlib.contextmanager
def server_on_small_disk(tmp_path: Path, *args: str):
    """A server (given `args`) whose store is on a tmpfs of FS_SIZE, and the path where this
    process sees that file system: mounted here by root, else in a user and mount namespace of
    the server's own."""
    mount = tmp_path / "disk"
    mount.mkdir()
    store = mount / "store"
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs", str(mount)], check=True)
        server = ServerProcess(store, *args)
        view = lambda: mount  # noqa: E731
    else:  # unprivileged: the server mounts it in namespaces of its own (util-linux's unshare)
        script = f'mount -t tmpfs -o size={FS_SIZE} tmpfs "$0" && exec "$@"'
        wrapper = ("unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(mount))
        server = ServerProcess(store, *args, wrapper=wrapper)
        view = lambda: Path(f"/proc/{server.process.pid}/root") / mount.relative_to("/")  # noqa: E731
    server.log_path = tmp_path / "server.log"
    try:
        server.start()
        yield server, view()
    finally:
        code = server.stop()
        if os.geteuid() == 0:
            subprocess.run(["umount", str(mount)], check=True)
        assert code == 0, server.log_text()
        assert "Traceback" not in server.log_text()


def message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic, m.body = topic, body
    return m


def until(attempt, deadline_s: float = WAIT_S):
    """attempt() until it returns a value other than None (the store's once-a-second look at its
    disk decides when); the last value."""
    give_up = time.monotonic() + deadline_s
    while (result := attempt()) is None and time.monotonic() < give_up:
        time.sleep(0.1)
    return result


def test_a_full_disk_refuses_sends_precisely_serves_reads_and_recovers(tmp_path):
    topic = f"full_{uuid.uuid4().hex[:6]}"
    with server_on_small_disk(tmp_path) as (server, disk):
        producer = Producer(server.config(), (topic,))
        producer.startup()
        consumer = SimpleConsumer(server.config(), "g", {topic: FilterExpression("*")}, await_duration=1)
        consumer.startup()
        try:
            stored = []  # the bodies of every send the producer was told is stored

            def send(body: bytes) -> None:
                producer.send(message(topic, body))
                stored.append(body)

            for i in range(60):
                send(b"before %d" % i)

            # past 90% used: a send is refused with the precise code, nothing stored
            filler = fill(disk, leave=2 << 20)

            def refused_send():
                try:
                    send(b"probe %d" % len(stored))
                except TooManyRequestsException as exc:
                    return exc
                return None

            refusal = until(refused_send)
            assert refusal is not None and refusal.code == DISK_FULL, refusal
            # reads go on: the messages stored before are received (the pop journal has room)
            received = [m for m in consumer.receive(16, 60)]
            assert received and all(m.body in stored for m in received)

            # no space at all: a receive whose journal line the disk refuses gets the same code
            more_filler = fill(disk, leave=0)
            refused_receive = None
            for _ in range(200):  # the journal's last page may hold a few more lines
                try:
                    received += consumer.receive(1, 60)
                except Exception as exc:  # noqa: BLE001 - its code is asserted
                    refused_receive = exc
                    break
            assert refused_receive is not None and getattr(refused_receive, "code", None) == DISK_FULL, refused_receive

            # space freed: sends are taken again, and every stored message is delivered once
            filler.unlink()
            more_filler.unlink(missing_ok=True)
            assert until(lambda: None if refused_send() else True)
            for i in range(5):
                send(b"after %d" % i)
            for m in received:
                consumer.ack(m)
            bodies = [m.body for m in received]
            while batch := consumer.receive(32, 60):
                bodies += [m.body for m in batch]
                for m in batch:
                    consumer.ack(m)
            assert sorted(bodies) == sorted(stored)
            assert server.process.poll() is None
        finally:
            consumer.shutdown()
            producer.shutdown()


def receive_all(consumer: SimpleConsumer, expected: int) -> list[bytes]:
    """Receive and ack until `expected` messages came, or receives come back empty for a while."""
    bodies: list[bytes] = []
    empty = 0
    while len(bodies) < expected and empty < 5:
        batch = consumer.receive(32, 60)
        empty = 0 if batch else empty + 1
        for m in batch:
            bodies.append(m.body)
            consumer.ack(m)
    return bodies


def test_batch_dispatch_on_a_full_disk_waits_for_space_and_delivers_each_message_once(tmp_path):
    """The disk fills while the commit log still has blocks allocated ahead (as when another
    process fills a shared disk between two of the store's looks at it: the warning level is 100%
    here, so that only the disk refuses appends).  Sends are taken into those blocks until they
    run out, then refused with TOO_MANY_REQUESTS; dispatch, a backlog of megabytes built in
    batches by the worker processes, has no block for the new pages of its consume queues and
    key index: it waits, the broker and its workers alive, and once space is freed every
    acknowledged message is delivered exactly once."""
    topic = f"burst_{uuid.uuid4().hex[:6]}"
    segment = 2 << 20  # what the commit log may have allocated ahead: the rest of its segment
    args = ("--disk-space-warning-level-ratio", "100", "--segment-size", str(segment))
    with server_on_small_disk(tmp_path, *args) as (server, disk):
        producer = Producer(server.config(), (topic,))
        producer.startup()
        consumer = SimpleConsumer(server.config(), "g", {topic: FilterExpression("*")}, await_duration=1)
        consumer.startup()
        try:
            stored = [b"first"]  # the segment is made, and its blocks allocated, before the disk fills
            producer.send(message(topic, stored[0]))
            filler = fill(disk, leave=0)
            refusal = None
            pad = bytes(4 << 10)
            for chunk in range(segment // (4 << 10) // 100 + 2):  # 100 in flight at a time
                bodies = [b"%d-%d" % (chunk, i) + pad for i in range(100)]
                futures = [(body, producer.send_async(message(topic, body))) for body in bodies]
                for body, future in futures:
                    try:
                        future.result()
                        stored.append(body)
                    except TooManyRequestsException as exc:
                        refusal = exc
                if refusal is not None:
                    break
            assert refusal is not None and refusal.code == DISK_FULL, refusal
            assert len(stored) > 100  # a backlog for the batch path (above 64 KiB) was taken
            # dispatch says it waits; the broker and its dispatch workers live (a page written
            # without a block ended them with SIGBUS)
            assert until(lambda: "waits for disk space" in server.log_text() or None)
            assert server.process.poll() is None
            assert "died" not in server.log_text()

            filler.unlink()
            assert until(lambda: None if refused(producer, topic, stored) else True)
            bodies = receive_all(consumer, len(stored))
            assert len(bodies) == len(stored) and sorted(bodies) == sorted(stored)
            assert "dispatch goes on at commit-log offset" in server.log_text()
            assert server.process.poll() is None
        finally:
            consumer.shutdown()
            producer.shutdown()


def refused(producer: Producer, topic: str, stored: list[bytes]) -> bool:
    """Send one message; whether the disk refused it (else it is in `stored`)."""
    body = b"after %d" % len(stored)
    try:
        producer.send(message(topic, body))
    except TooManyRequestsException:
        return True
    stored.append(body)
    return False


# Run in a user and mount namespace of its own (util-linux's `unshare`, as root or not), on a
# tmpfs of FS_SIZE: `tidemq serve` makes a store and is stopped once the disk is full, is started
# again on the full disk, and once space is freed the store is checked and served again.
SERVE_ON_A_FULL_DISK = r"""
import json, os, signal, subprocess, sys
from pathlib import Path

disk = Path(sys.argv[1])
sys.path.insert(0, sys.argv[2])  # the repository, for `fill`
from tests.e2e.filling import fill as fill_until

store = disk / "store"
serve = [sys.executable, "-m", "tidemq.cli", "serve", "--store", str(store), "--listen", "127.0.0.1:0",
         "--tls", "off", "--segment-size", str(4 << 20)]


def fill():
    fill_until(disk, leave=0).rename(disk / "filler")


def started_then_stopped(full_before_stop=False):
    server = subprocess.Popen(serve, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in server.stderr:
        lines.append(line)
        if "tidemq ready" in line:
            break
    if full_before_stop:
        fill()
    server.send_signal(signal.SIGTERM)
    lines += server.stderr.read().splitlines(keepends=True)
    return server.wait(30), "".join(lines)


results = {"stopped_full": started_then_stopped(full_before_stop=True)}
refused = subprocess.run(serve, capture_output=True, text=True, timeout=60)
results["full"] = (refused.returncode, refused.stderr)
(disk / "filler").unlink()
check = subprocess.run([sys.executable, "-m", "tidemq.cli", "store", "check", str(store)], capture_output=True, text=True)
results["check"] = (check.returncode, check.stdout + check.stderr)
results["again"] = started_then_stopped()
print(json.dumps(results))
"""


def test_serve_on_a_full_disk_says_so_in_one_line_and_the_store_opens_once_space_is_freed(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    script = f'mount -t tmpfs -o size={FS_SIZE} tmpfs "$0" && exec "$@"'
    run = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(mount),
         sys.executable, "-c", SERVE_ON_A_FULL_DISK, str(mount), str(Path(__file__).parents[2])],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.splitlines()[-1])
    store = mount / "store"
    # stopped on the full disk: no traceback, a line that says why, exit status 3
    code, said = results["stopped_full"]
    assert code == DISK_FULL_EXIT and "Traceback" not in said, said
    assert said.splitlines()[-1].startswith(f"tidemq: the disk of {store} is full ("), said
    # started on the full disk: one line naming the store's directory, the same status
    code, said = results["full"]
    assert code == DISK_FULL_EXIT and said.count("\n") == 1, said
    assert said.startswith(f"tidemq: the disk of {store} is full (") and "bytes free" in said, said
    # the store is sound and opens again, cleanly
    assert results["check"][0] == 0, results["check"][1]
    code, said = results["again"]
    assert code == 0 and "Traceback" not in said and "stopped cleanly" in said, said
