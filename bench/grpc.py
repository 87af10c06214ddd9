"""gRPC broker benchmark: the official SDK against `tidemq serve`, and a raw-gRPC load generator.

    .venv/bin/python bench/grpc.py [--messages N] [--flush async|sync] [--processes P] [--concurrency C]
                                   [--sdk-processes P] [--sdk-seconds S]

The server runs in a child process (`tidemq serve`, ephemeral port, temp store); its CPU time is
read from /proc/<pid>/stat (user + system, all threads) around each phase.  Prints:
- SDK producer: sync sends from one thread (throughput, latency p50/p99), async sends in flight;
- SDK simple consumer: receive (batch 32) + ack throughput;
- send-to-delivery time to a long-polling SDK receiver at light load (p50/p99);
- is the server the bottleneck for SDK clients: P SDK producer processes (send_async), then P SDK
  simple-consumer processes (threads of receive + ack), flat out; each client's CPU utilisation
  (CPU seconds / wall seconds) next to the server's, and CPU per message on both sides;
- the server CPU of an empty call (Heartbeat): the gRPC transport's floor every RPC pays;
- load generator: P processes x C concurrent raw SendMessage calls, then raw ReceiveMessage(32) +
  AckMessage, first with one message per call (as the SDK does), then batched (B messages per
  SendMessage, B entries per AckMessage): server throughput and server CPU seconds per 10,000
  messages, with the ratio to the targets.

Targets (issue 3): server CPU <= 100 us per message sent and <= 150 us per message received and
acked; send-to-delivery p99 < 10 ms at light load.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this file is named like the grpc package: keep its directory off the import path
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

READY = re.compile(r"tidemq ready: gRPC on ([\d.]+):(\d+)")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- the server under test ------------------------------------------------------------------------

class Server:
    def __init__(self, store: Path, flush: str) -> None:
        self.log = open(store.parent / "server.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli", "serve", "--store", str(store), "--listen", "127.0.0.1:0", "--flush", flush],
            stdout=self.log, stderr=self.log, cwd=ROOT)
        log_path = store.parent / "server.log"
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            match = READY.search(log_path.read_text(errors="replace"))
            if match:
                self.address = f"127.0.0.1:{match.group(2)}"
                return
            time.sleep(0.05)
        raise RuntimeError("server did not start:\n" + log_path.read_text())

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        self.log.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- SDK phases -----------------------------------------------------------------------------------

def sdk_phases(server: Server, messages: int) -> dict:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    config = ClientConfiguration(server.address, Credentials())
    topic = f"BenchSdk{uuid.uuid4().hex[:6]}"
    producer = Producer(config, (topic,))
    producer.startup()

    def make(body: bytes) -> Message:
        m = Message()
        m.topic = topic
        m.body = body
        m.tag = "bench"
        return m

    body = b"x" * 256
    for _ in range(50):  # warm-up: route, channels
        producer.send(make(body))
    latencies = []
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    for _ in range(messages):
        s = time.perf_counter()
        producer.send(make(body))
        latencies.append(time.perf_counter() - s)
    sync_elapsed, sync_cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0

    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    window, futures = 64, []
    for i in range(messages):
        futures.append(producer.send_async(make(body)))
        if len(futures) >= window:
            futures.pop(0).result()
    for f in futures:
        f.result()
    async_elapsed, async_cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0

    consumer = SimpleConsumer(config, f"BenchGroup{uuid.uuid4().hex[:6]}", {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    total = 2 * messages + 50
    got = 0
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    while got < total:
        batch = consumer.receive(32, 30)
        if not batch:
            break
        for m in batch:
            consumer.ack(m)
        got += len(batch)
    consume_elapsed, consume_cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0

    # send-to-delivery at light load: one message at a time to a receiver that is long polling
    delivery = []
    light = min(300, messages)
    received = threading.Event()
    stamps: dict[bytes, float] = {}
    stop = threading.Event()

    def receiver() -> None:
        while not stop.is_set():
            for m in consumer.receive(1, 30):
                delivery.append(time.perf_counter() - stamps[m.body])
                consumer.ack(m)
                received.set()

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    time.sleep(0.5)  # let the receiver's first long poll reach the server
    for i in range(light):
        received.clear()
        key = b"d%d" % i
        stamps[key] = time.perf_counter()
        producer.send(make(key))
        received.wait(10)
        time.sleep(0.002)  # light load: the receiver is back to waiting before the next send
    stop.set()
    producer.send(make(b"last"))
    stamps[b"last"] = time.perf_counter()
    thread.join(10)
    consumer.shutdown()
    producer.shutdown()
    return {
        "sync_rate": messages / sync_elapsed, "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
        "sync_cpu_per_msg": sync_cpu / messages, "sync_busy": sync_cpu / sync_elapsed,
        "async_rate": messages / async_elapsed, "async_busy": async_cpu / async_elapsed,
        "consume_rate": got / consume_elapsed, "consume_cpu_per_msg": consume_cpu / max(1, got), "consumed": got,
        "consume_busy": consume_cpu / consume_elapsed,
        "delivery_p50": percentile(delivery, 0.5), "delivery_p99": percentile(delivery, 0.99), "delivered": len(delivery),
    }


# -- is the server the bottleneck for SDK clients? ----------------------------------------------------

def _sdk_client(role: str, address: str, topic: str, group: str, seconds: float, window: int, ready, start, out) -> None:
    """One client process: SDK producer (send_async, `window` in flight) or SDK simple consumers
    (`window` threads, each receive(32) + ack), flat out for `seconds`.  Reports its own CPU."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    config = ClientConfiguration(address, Credentials())
    done = 0
    if role == "producer":
        client = Producer(config, (topic,))
        client.startup()

        def make() -> Message:
            m = Message()
            m.topic, m.body, m.tag = topic, b"s" * 256, "bench"
            return m

        for _ in range(20):
            client.send(make())
        ready.put(os.getpid())
        start.wait()
        cpu0, t0 = time.process_time(), time.perf_counter()
        futures = []
        while time.perf_counter() - t0 < seconds:
            futures.append(client.send_async(make()))
            if len(futures) >= window:
                futures.pop(0).result()
                done += 1
        for f in futures:
            f.result()
            done += 1
    else:
        client = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
        client.startup()
        ready.put(os.getpid())
        start.wait()
        cpu0, t0 = time.process_time(), time.perf_counter()
        counts = [0] * window

        def consume(k: int) -> None:
            while time.perf_counter() - t0 < seconds:
                for m in client.receive(32, 30):
                    client.ack(m)
                    counts[k] += 1

        threads = [threading.Thread(target=consume, args=(k,)) for k in range(window)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done = sum(counts)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    client.shutdown()
    out.put((done, cpu, wall))


def sdk_saturation(server: Server, role: str, topic: str, group: str, processes: int, seconds: float, window: int):
    """`processes` SDK clients of one role run flat out; returns messages/s, each client's CPU
    utilisation (CPU seconds / wall seconds) and the server's over the same wall time."""
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_sdk_client, args=(role, server.address, topic, group, seconds, window, ready, start, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    start.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    elapsed, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
    for p in procs:
        p.join()
    messages = max(1, sum(r[0] for r in results))
    return {"rate": messages / elapsed, "clients": [r[1] / r[2] for r in results], "server": cpu / elapsed,
            "client_per_msg": sum(r[1] for r in results) / messages, "server_per_msg": cpu / messages}


# -- raw gRPC load generator ------------------------------------------------------------------------

def _metadata(i: int):
    return (("x-mq-client-id", f"loadgen@{os.getpid()}@{i}@0"),)


async def _send_load(address: str, topic: str, count: int, concurrency: int, batch: int = 1) -> int:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc
    from rocketmq.grpc_protocol import service_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        body = b"y" * 256
        sent = 0

        async def worker(w: int) -> None:
            nonlocal sent
            md = _metadata(w)
            while sent < count:
                n = min(batch, count - sent)
                sent += n
                request = svc.SendMessageRequest()
                for _ in range(n):
                    # the system properties the SDK's producer always sets, born time and host included
                    m = request.messages.add(body=body)
                    m.topic.name = topic
                    m.system_properties.message_id = uuid.uuid4().hex.upper()
                    m.system_properties.message_type = pb.NORMAL
                    m.system_properties.body_encoding = pb.IDENTITY
                    m.system_properties.tag = "load"
                    m.system_properties.born_timestamp.seconds = int(time.time())
                    m.system_properties.born_host = "127.0.0.1"
                response = await stub.SendMessage(request, metadata=md, timeout=30)
                if response.status.code != pb.OK:
                    raise RuntimeError(response.status.message)

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return sent


async def _consume_load(address: str, topic: str, group: str, count: int, concurrency: int, batch: int = 1) -> int:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc
    from rocketmq.grpc_protocol import service_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        done = 0
        empty_streak = 0

        async def worker(w: int) -> None:
            nonlocal done, empty_streak
            md = _metadata(w)
            while done < count and empty_streak < 3 * concurrency:
                req = svc.ReceiveMessageRequest(batch_size=32)
                req.group.name = group
                req.message_queue.topic.name = topic
                req.filter_expression.type = pb.TAG
                req.filter_expression.expression = "*"
                req.invisible_duration.FromSeconds(60)
                req.long_polling_timeout.FromSeconds(1)
                messages = [r.message async for r in stub.ReceiveMessage(req, metadata=md, timeout=10) if r.HasField("message")]
                empty_streak = 0 if messages else empty_streak + 1
                for start in range(0, len(messages), batch):
                    ack = svc.AckMessageRequest()
                    ack.group.name = group
                    ack.topic.name = topic
                    for m in messages[start:start + batch]:
                        ack.entries.add(message_id=m.system_properties.message_id,
                                        receipt_handle=m.system_properties.receipt_handle)
                    response = await stub.AckMessage(ack, metadata=md, timeout=30)
                    if response.status.code != pb.OK:
                        raise RuntimeError(response.status.message)
                done += len(messages)

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done


async def _heartbeats(address: str, count: int, concurrency: int) -> None:
    import grpc
    from rocketmq.grpc_protocol import service_pb2 as svc
    from rocketmq.grpc_protocol import service_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        left = count

        async def worker(w: int) -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await stub.Heartbeat(svc.HeartbeatRequest(), metadata=_metadata(w), timeout=30)

        await asyncio.gather(*(worker(w) for w in range(concurrency)))


def heartbeat_floor(server: Server, count: int) -> float:
    """Server CPU seconds per call that does nothing: what the gRPC transport itself costs per call."""
    cpu0 = server.cpu_seconds()
    asyncio.run(_heartbeats(server.address, count, 64))
    return (server.cpu_seconds() - cpu0) / count


def _load_process(kind: str, address: str, topic: str, group: str, count: int, concurrency: int, batch: int, out) -> None:
    if kind == "send":
        out.put(asyncio.run(_send_load(address, topic, count, concurrency, batch)))
    else:
        out.put(asyncio.run(_consume_load(address, topic, group, count, concurrency, batch)))


def load_phase(server: Server, kind: str, topic: str, group: str, count: int, processes: int, concurrency: int,
               batch: int = 1):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_load_process, args=(kind, server.address, topic, group, count // processes, concurrency, batch, out))
             for _ in range(processes)]
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    elapsed, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
    for p in procs:
        p.join()
    return total, elapsed, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per SDK phase")
    parser.add_argument("--load-messages", type=int, default=40000, help="messages of the load generator")
    parser.add_argument("--flush", default="async", choices=["async", "sync"])
    parser.add_argument("--processes", type=int, default=2, help="load generator processes")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent calls per load process")
    parser.add_argument("--batch", type=int, default=32, help="messages per SendMessage / entries per AckMessage "
                        "in the batched load phase (the SDK sends 1)")
    parser.add_argument("--sdk-processes", type=int, default=2, help="SDK client processes in the saturation phases")
    parser.add_argument("--sdk-seconds", type=float, default=10, help="length of each saturation phase")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="tidemq-bench-"))
    server = Server(root / "store", args.flush)
    try:
        print(f"tidemq gRPC benchmark: server pid {server.process.pid} at {server.address}, {args.flush} flush, "
              f"{os.cpu_count()} CPUs")
        sdk = sdk_phases(server, args.messages)
        print(f"SDK producer, sync send, 1 thread : {sdk['sync_rate']:8.0f} msg/s   latency p50 {sdk['p50'] * 1e3:.2f} ms  "
              f"p99 {sdk['p99'] * 1e3:.2f} ms   server CPU {sdk['sync_cpu_per_msg'] * 1e6:.0f} us/msg, busy {sdk['sync_busy']:.2f} CPUs")
        print(f"SDK producer, send_async x64      : {sdk['async_rate']:8.0f} msg/s   server busy {sdk['async_busy']:.2f} CPUs")
        print(f"SDK simple consumer receive+ack   : {sdk['consume_rate']:8.0f} msg/s   ({sdk['consumed']} messages)   "
              f"server CPU {sdk['consume_cpu_per_msg'] * 1e6:.0f} us/msg, busy {sdk['consume_busy']:.2f} CPUs")
        print(f"send-to-delivery, long polling    : p50 {sdk['delivery_p50'] * 1e3:.2f} ms  p99 {sdk['delivery_p99'] * 1e3:.2f} ms"
              f"  ({sdk['delivered']} messages; target p99 < 10 ms: {'met' if sdk['delivery_p99'] < 0.010 else 'NOT met'})")

        topic, group = f"BenchSat{uuid.uuid4().hex[:6]}", f"BenchSatGroup{uuid.uuid4().hex[:6]}"
        for role, window, what in (("producer", 64, "send_async, 64 in flight"),
                                   ("consumer", 4, "4 threads of receive(32) + ack")):
            sat = sdk_saturation(server, role, topic, group, args.sdk_processes, args.sdk_seconds, window)
            clients = " ".join(f"{u:.2f}" for u in sat["clients"])
            # the server has headroom when it is well under one core (its event loop holds one GIL)
            # and cheaper per message than the clients together
            headroom = sat["server"] < 0.7 and sat["server_per_msg"] < sat["client_per_msg"]
            print(f"SDK {role}s flat out, {args.sdk_processes} processes ({what}): {sat['rate']:6.0f} msg/s\n"
                  f"    CPU utilisation (CPU s / wall s): clients {clients}, server {sat['server']:.2f};  "
                  f"CPU per message: clients {sat['client_per_msg'] * 1e6:.0f} us, server {sat['server_per_msg'] * 1e6:.0f} us"
                  f"  -> {'server has headroom' if headroom else 'THE SERVER IS THE BOTTLENECK'}")

        floor = heartbeat_floor(server, 5000)
        print(f"reference: empty Heartbeat calls     : server CPU {floor * 1e6:.0f} us/call (the gRPC transport's per-call floor)")
        for batch in (1, args.batch):
            topic, group = f"BenchLoad{uuid.uuid4().hex[:6]}", f"BenchLoadGroup{uuid.uuid4().hex[:6]}"
            count = args.load_messages if batch > 1 else args.load_messages // 4
            sent, elapsed, cpu = load_phase(server, "send", topic, group, count, args.processes, args.concurrency, batch)
            per = cpu / sent
            print(f"load: SendMessage, {batch:2d} msg/call, {args.processes * args.concurrency} calls in flight : "
                  f"{sent / elapsed:7.0f} msg/s   server CPU {per * 1e4:.2f} s per 10,000 sent ({per * 1e6:.0f} us/msg, "
                  f"{per * 1e6 / 100:.2f}x the 100 us target)   server busy {cpu / elapsed:.2f} CPUs")
            got, elapsed, cpu = load_phase(server, "consume", topic, group, sent, args.processes, args.concurrency, batch)
            per = cpu / max(1, got)
            print(f"load: Receive(32)+Ack, {batch:2d} entries/ack, {args.processes * args.concurrency} in flight: "
                  f"{got / elapsed:7.0f} msg/s   server CPU {per * 1e4:.2f} s per 10,000 received+acked ({per * 1e6:.0f} us/msg, "
                  f"{per * 1e6 / 150:.2f}x the 150 us target)   server busy {cpu / elapsed:.2f} CPUs")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
