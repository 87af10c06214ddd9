"""Priority benchmark: one random-priority backlog consumed from tidemq and from RabbitMQ.

    .venv/bin/python bench/priority.py [--messages N] [--levels L] [--rounds R] [--no-rabbitmq]

The backlog: N messages (default 20,000) of 100 bytes with priorities drawn uniformly from
0..L-1 (default 10 levels, seeded), sent in full before any consumer starts.  Consumed by one
consumer that receives up to 32 messages at a time and acks each batch with one call:
- tidemq (`tidemq serve`, a child process on an ephemeral port, async flush): raw gRPC
  ReceiveMessage(32) + AckMessage(32 entries) with the official SDK's stubs, from a PRIORITY topic
  of L levels and, for the cost of priority order, from a NORMAL topic of L queues with the same
  backlog; the two alternate over R rounds (default 3), fresh topics and groups each round;
- RabbitMQ (Debian's `rabbitmq-server`, started here on ephemeral ports with its own data
  directory; installed with apt-get when missing, or the benchmark says why it cannot): a classic
  queue with x-max-priority = L, persistent messages, pika with prefetch 32, one multiple-ack per
  32 messages.

Prints per broker the consumption throughput (messages per second, the median round) and the
fraction of adjacent deliveries in priority order (delivery i+1 no higher than delivery i), and
tidemq's priority topic against its normal topic (throughput ratio, server CPU per 10,000
messages).  Targets (issue 43): 100% adjacent order within one broker; the priority topic at
least 90% of the normal topic's throughput.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# bench/grpc.py is named like the grpc package: keep this directory off the import path
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

READY = re.compile(r"tidemq ready: gRPC on ([\d.]+):(\d+)")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BODY = b"x" * 100
BATCH = 32


def adjacent_order(priorities: list[int]) -> float:
    """The fraction of adjacent deliveries whose second is no higher than the first."""
    pairs = len(priorities) - 1
    if pairs <= 0:
        return 1.0
    return sum(1 for a, b in zip(priorities, priorities[1:]) if b <= a) / pairs


# -- tidemq -----------------------------------------------------------------------------------------

class Tidemq:
    def __init__(self, directory: Path) -> None:
        self.log_path = directory / "tidemq.log"
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli", "serve", "--store", str(directory / "store"),
             "--listen", "127.0.0.1:0", "--segment-size", str(256 << 20)],
            stdout=self.log, stderr=self.log, cwd=ROOT)
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            match = READY.search(self.log_path.read_text(errors="replace"))
            if match:
                self.address = f"127.0.0.1:{match.group(2)}"
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("tidemq did not start:\n" + self.log_path.read_text())
        import grpc
        from rocketmq.grpc_protocol import service_pb2_grpc

        self.channel = grpc.insecure_channel(self.address)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.metadata = (("x-mq-client-id", f"bench@{os.getpid()}@0@priority"),)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def create_topic(self, name: str, kind: str, levels: int) -> None:
        from tidemq.protocol.grpc import admin_call

        if kind == "PRIORITY":
            admin_call(self.address, "CreateTopic", name=name, message_type=kind, priorities=levels)
        else:
            admin_call(self.address, "CreateTopic", name=name, message_type=kind, queue_nums=levels)

    def load(self, topic: str, priorities: list[int] | None, count: int) -> None:
        """Send the backlog, 500 messages a call (not measured)."""
        from rocketmq.grpc_protocol import definition_pb2 as pb
        from rocketmq.grpc_protocol import service_pb2 as svc

        for start in range(0, count, 500):
            request = svc.SendMessageRequest()
            for i in range(start, min(count, start + 500)):
                m = request.messages.add(body=BODY)
                m.topic.name = topic
                sp = m.system_properties
                sp.message_id = "01" + uuid.uuid4().hex.upper()
                sp.body_encoding = pb.IDENTITY
                sp.born_host = "127.0.0.1"
                sp.born_timestamp.GetCurrentTime()
                if priorities is None:
                    sp.message_type = pb.NORMAL
                else:
                    sp.message_type = pb.PRIORITY
                    sp.priority = priorities[i]
            response = self.stub.SendMessage(request, metadata=self.metadata, timeout=60)
            if response.status.code != pb.OK:
                raise RuntimeError(f"send failed: {response.status}")
        from tidemq.protocol.grpc import admin_call

        give_up = time.monotonic() + 120
        while time.monotonic() < give_up:  # every message dispatched (visible) before consuming
            for t in admin_call(self.address, "ListTopics"):
                if t["name"] == topic and sum(q["max_offset"] for q in t["queues"]) >= count:
                    return
            time.sleep(0.05)
        raise RuntimeError("the backlog did not become visible")

    def consume(self, topic: str, group: str, count: int) -> tuple[float, float, list[int]]:
        """Receive and ack `count` messages; (seconds, server CPU seconds, priorities in order)."""
        from rocketmq.grpc_protocol import definition_pb2 as pb
        from rocketmq.grpc_protocol import service_pb2 as svc

        request = svc.ReceiveMessageRequest(batch_size=BATCH, auto_renew=False)
        request.group.name = group
        request.message_queue.topic.name = topic
        request.message_queue.id = -1
        request.filter_expression.type = pb.TAG
        request.filter_expression.expression = "*"
        request.invisible_duration.FromSeconds(60)
        order: list[int] = []
        cpu0, t0 = self.cpu_seconds(), time.perf_counter()
        while len(order) < count:
            ack = svc.AckMessageRequest()
            ack.group.name = group
            ack.topic.name = topic
            for response in self.stub.ReceiveMessage(request, metadata=self.metadata, timeout=30):
                if response.HasField("message"):
                    sp = response.message.system_properties
                    order.append(sp.priority)
                    ack.entries.add(message_id=sp.message_id, receipt_handle=sp.receipt_handle)
            if not ack.entries:
                raise RuntimeError(f"{topic}: ran dry after {len(order)} of {count}")
            answer = self.stub.AckMessage(ack, metadata=self.metadata, timeout=30)
            if answer.status.code != pb.OK:
                raise RuntimeError(f"ack failed: {answer.status}")
        return time.perf_counter() - t0, self.cpu_seconds() - cpu0, order

    def stop(self) -> None:
        self.channel.close()
        self.process.terminate()
        self.process.wait(60)
        self.log.close()


# -- RabbitMQ ---------------------------------------------------------------------------------------

RABBITMQ_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # Debian's, without the su wrapper


def find_or_install_rabbitmq() -> tuple[Path | None, str]:
    """The rabbitmq-server script, installing Debian's package when missing; or None and why."""
    if RABBITMQ_SCRIPT.exists():
        return RABBITMQ_SCRIPT, "found"
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return None, "rabbitmq-server is not installed and apt-get (as root) is not available to install it"
    print("installing Debian's rabbitmq-server with apt-get ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "rabbitmq-server"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"{' '.join(command)} failed: {done.stderr.strip()[-300:]}"
    return (RABBITMQ_SCRIPT, "installed") if RABBITMQ_SCRIPT.exists() else (None, f"{RABBITMQ_SCRIPT} missing after install")


def import_pika():
    try:
        import pika
    except ImportError:
        print("installing pika with pip ...", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "pika"], capture_output=True, text=True)
        if done.returncode != 0:
            return None
        import pika
    return pika


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RabbitMQ:
    """A RabbitMQ node of its own: ephemeral AMQP, distribution and epmd ports, data, logs and
    Erlang cookie under `directory`, no plugins."""

    def __init__(self, script: Path, directory: Path, pika) -> None:
        self.pika = pika
        self.directory = directory
        self.port, dist_port, self.epmd_port = free_port(), free_port(), free_port()
        (directory / "enabled_plugins").write_text("[].\n")
        self.env = dict(
            os.environ, HOME=str(directory), RABBITMQ_NODENAME=f"bench{self.port}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(dist_port), ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_MNESIA_BASE=str(directory / "mnesia"), RABBITMQ_LOG_BASE=str(directory / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(directory / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(directory / "rabbitmq"), RABBITMQ_CONF_ENV_FILE=str(directory / "rabbitmq-env.conf"),
        )
        self.log = open(directory / "rabbitmq.log", "wb")
        self.process = subprocess.Popen([str(script)], env=self.env, stdout=self.log, stderr=self.log,
                                        start_new_session=True)
        give_up = time.monotonic() + 180
        while True:
            try:
                self.connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
                break
            except pika.exceptions.AMQPConnectionError:
                if self.process.poll() is not None or time.monotonic() > give_up:
                    self.stop()
                    raise RuntimeError("rabbitmq-server did not start: see " + str(directory / "rabbitmq.log")) from None
                time.sleep(0.5)
        self.channel = self.connection.channel()

    def load(self, queue: str, priorities: list[int], levels: int) -> None:
        pika = self.pika
        self.channel.queue_declare(queue, durable=True, arguments={"x-max-priority": levels})
        for p in priorities:
            self.channel.basic_publish("", queue, BODY, pika.BasicProperties(priority=p, delivery_mode=2))
        give_up = time.monotonic() + 300
        while self.channel.queue_declare(queue, passive=True).method.message_count < len(priorities):
            if time.monotonic() > give_up:  # the whole backlog queued before consuming
                raise RuntimeError("RabbitMQ did not queue the backlog")
            time.sleep(0.05)

    def consume(self, queue: str, count: int) -> tuple[float, list[int]]:
        order: list[int] = []
        self.channel.basic_qos(prefetch_count=BATCH)
        t0 = time.perf_counter()
        for method, properties, _ in self.channel.consume(queue, inactivity_timeout=30):
            if method is None:
                raise RuntimeError(f"RabbitMQ ran dry after {len(order)} of {count}")
            order.append(properties.priority)
            if len(order) % BATCH == 0 or len(order) == count:
                self.channel.basic_ack(method.delivery_tag, multiple=True)
            if len(order) == count:
                break
        elapsed = time.perf_counter() - t0
        self.channel.cancel()
        return elapsed, order

    def stop(self) -> None:
        try:
            if getattr(self, "connection", None) is not None and self.connection.is_open:
                self.connection.close()
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(30)
            epmd = shutil.which("epmd")  # the node started an epmd of its own port: stop it
            if epmd:
                subprocess.run([epmd, "-kill"], env=self.env, capture_output=True)
            self.log.close()


# -- the run ----------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--levels", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args()
    n, levels = args.messages, args.levels
    rng = random.Random(43)
    priorities = [rng.randrange(levels) for _ in range(n)]
    print(f"backlog: {n:,} messages of {len(BODY)} bytes, priorities uniform over 0..{levels - 1}; "
          f"one consumer, batches of {BATCH}, one ack call a batch")

    work = Path(tempfile.mkdtemp(prefix="tidemq-bench-priority-"))
    try:
        server = Tidemq(work)
        try:
            results = {"PRIORITY": [], "NORMAL": []}
            for round_ in range(args.rounds):
                kinds = ("PRIORITY", "NORMAL") if round_ % 2 == 0 else ("NORMAL", "PRIORITY")
                for kind in kinds:
                    topic, group = f"Bench{kind}{round_}", f"G{kind}{round_}"
                    server.create_topic(topic, kind, levels)
                    server.load(topic, priorities if kind == "PRIORITY" else None, n)
                    seconds, cpu, order = server.consume(topic, group, n)
                    results[kind].append((n / seconds, cpu / n * 10_000, order))
        finally:
            server.stop()
        rate = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
        cpu = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
        prio_order = results["PRIORITY"][0][2]
        order_fraction = min(adjacent_order(r[2]) for r in results["PRIORITY"])
        print(f"tidemq PRIORITY topic: {rate['PRIORITY']:8,.0f} msg/s  adjacent order {order_fraction:.2%}  "
              f"server CPU {cpu['PRIORITY']:.2f} s per 10,000  (rounds: "
              + ", ".join(f"{r[0]:,.0f}" for r in results["PRIORITY"]) + ")")
        print(f"tidemq NORMAL topic:   {rate['NORMAL']:8,.0f} msg/s  (no priorities)        "
              f"server CPU {cpu['NORMAL']:.2f} s per 10,000  (rounds: "
              + ", ".join(f"{r[0]:,.0f}" for r in results["NORMAL"]) + ")")
        ratio = rate["PRIORITY"] / rate["NORMAL"]
        print(f"priority / normal throughput: {ratio:.1%} (target >= 90%: {'met' if ratio >= 0.9 else 'NOT met'}); "
              f"order target 100%: {'met' if order_fraction == 1.0 else 'NOT met'}")
        assert sorted(prio_order) == sorted(priorities)

        if args.no_rabbitmq:
            return
        script, how = find_or_install_rabbitmq()
        pika = import_pika() if script else None
        if script is None or pika is None:
            print(f"RabbitMQ: not measured ({how if script is None else 'pika could not be installed with pip'})")
            return
        rabbit_dir = work / "rabbitmq"
        rabbit_dir.mkdir()
        rabbit = RabbitMQ(script, rabbit_dir, pika)
        try:
            rabbit_rates, rabbit_orders = [], []
            for round_ in range(args.rounds):
                queue = f"bench-priority-{round_}"
                rabbit.load(queue, priorities, levels)
                seconds, order = rabbit.consume(queue, n)
                rabbit_rates.append(n / seconds)
                rabbit_orders.append(adjacent_order(order))
                assert sorted(order) == sorted(priorities)
        finally:
            rabbit.stop()
        r_rate = statistics.median(rabbit_rates)
        print(f"RabbitMQ x-max-priority={levels} ({how}): {r_rate:8,.0f} msg/s  adjacent order {min(rabbit_orders):.2%}  "
              f"(rounds: " + ", ".join(f"{r:,.0f}" for r in rabbit_rates) + ")")
        print(f"tidemq PRIORITY / RabbitMQ throughput: {rate['PRIORITY'] / r_rate:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
