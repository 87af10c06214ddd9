"""Many sends in flight at once, from one SDK producer and from several producer processes:
every send is acknowledged, and each message is stored exactly once (under both flush modes;
under sync flush concurrent sends share fsyncs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from rocketmq import FilterExpression
from tidemq.protocol.grpc import admin_call

from .test_sdk import clients, message, receive_all, unique  # noqa: F401 (clients: a fixture)


def stored(server, topic: str) -> int:
    """How many records the topic's queues hold (as far as dispatch has indexed them)."""
    (t,) = [t for t in admin_call(server.address, "ListTopics") if t["name"] == topic]
    return sum(q["max_offset"] - q["min_offset"] for q in t["queues"])


def receive_exactly(consumer, bodies: list[bytes]) -> None:
    """Receives every one of `bodies` once, and then nothing more: a send stored twice (a client
    retry after a failure) would be delivered a second time."""
    got = receive_all(consumer, len(bodies))
    assert sorted(m.body for m in got) == sorted(bodies)
    assert consumer.receive(32, 20) == []


def test_200_sends_in_flight_are_each_acknowledged_and_stored_once(server, clients):
    topic = unique("InFlight")
    producer = clients.producer(topic)
    futures = [producer.send_async(message(topic, b"m%d" % i)) for i in range(200)]
    ids = [f.result(timeout=30).message_id for f in futures]  # raises on a failed send
    assert len(set(ids)) == 200
    consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=1)
    receive_exactly(consumer, [b"m%d" % i for i in range(200)])
    assert stored(server, topic) == 200  # every record delivered: dispatch has indexed them all


PRODUCER = textwrap.dedent("""
    import sys
    from rocketmq import ClientConfiguration, Credentials, Message, Producer
    address, topic, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    producer = Producer(ClientConfiguration(address, Credentials(), request_timeout=3), (topic,))
    producer.startup()
    futures = []
    for i in range(count):
        m = Message()
        m.topic = topic
        m.body = b"%s-%d" % (name.encode(), i)
        futures.append(producer.send_async(m))
    failed = 0
    for f in futures:
        try:
            f.result(timeout=30)
        except Exception as exc:
            failed += 1
            print("failed:", exc, file=sys.stderr)
    producer.shutdown()
    print("acknowledged", count - failed)
""")


def test_several_producer_processes_sending_at_once_store_each_message_once(server, clients):
    topic = unique("Producers")
    processes = [subprocess.Popen([sys.executable, "-c", PRODUCER, server.address, topic, f"p{n}", "100"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(3)]
    outputs = [p.communicate(timeout=120) for p in processes]
    for (out, err), p in zip(outputs, processes):
        assert p.returncode == 0 and "acknowledged 100" in out, err[-2000:]
    consumer = clients.simple(unique("G"), {topic: FilterExpression()}, await_duration=1)
    receive_exactly(consumer, [b"p%d-%d" % (n, i) for n in range(3) for i in range(100)])
    assert stored(server, topic) == 300
