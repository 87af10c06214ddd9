"""A hostile lite client over gRPC against a real server whose lite subscription limits are set
low (`--max-sync-lite-subscription-rate`, `--max-lite-subscription-count`): huge and rapid
PARTIAL_ADD requests are refused with RocketMQ's status codes and change nothing, while another
client's complete set is still taken and served."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from tidemq.protocol.grpc import admin_call

from .server import ServerProcess, wait_until


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """One partial add per 100 s (one held at start), three subscriptions in the broker."""
    s = ServerProcess(tmp_path_factory.mktemp("lite-limits") / "store", "--max-sync-lite-subscription-rate", "0.01",
                      "--max-lite-subscription-count", "3").start()
    channel = grpc.insecure_channel(s.address)
    yield s, service_pb2_grpc.MessagingServiceStub(channel)
    channel.close()
    assert s.stop() == 0, s.log_text()


def test_huge_and_rapid_partial_adds_are_refused_and_change_nothing(limited):
    server, stub = limited
    admin_call(server.address, "CreateTopic", name="LB", message_type="LITE", queue_nums=1)
    admin_call(server.address, "CreateGroup", name="LG", lite_bind_topic="LB")

    def sync(client: str, action, names: list[str]) -> int:
        request = svc.SyncLiteSubscriptionRequest(action=action, lite_topic_set=names)
        request.topic.name, request.group.name = "LB", "LG"
        meta = (("x-mq-client-id", client), ("x-mq-language", "JAVA"))
        return stub.SyncLiteSubscription(request, metadata=meta, timeout=5).status.code

    def subscribers() -> dict[str, int]:
        listing = admin_call(server.address, "ListLite", bind_topic="LB")
        return {t["lite_topic"]: t["subscribers"] for t in listing["lite_topics"]}

    assert sync("hostile", pb.PARTIAL_ADD, [f"n{i}" for i in range(1501)]) == pb.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
    assert sync("hostile", pb.PARTIAL_ADD, ["first"]) == pb.OK  # the one held
    codes = [sync("hostile", pb.PARTIAL_ADD, [f"more{i}"]) for i in range(50)]
    assert codes == [pb.TOO_MANY_REQUESTS] * 50
    assert sync("hostile", pb.COMPLETE_ADD, ["first", "second", "third", "fourth"]) == pb.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
    assert sync("polite", pb.COMPLETE_ADD, ["room"]) == pb.OK  # complete sets are not rate-limited

    for i, name in enumerate(("first", "room", "more0")):
        request = svc.SendMessageRequest()
        m = request.messages.add(body=name.encode())
        m.topic.name = "LB"
        m.system_properties.message_id = f"0102FC000000011EE60B141BD00000000{i}"
        m.system_properties.message_type = pb.LITE
        m.system_properties.lite_topic = name
        m.system_properties.body_encoding = pb.IDENTITY
        assert stub.SendMessage(request, metadata=(("x-mq-client-id", "producer"),), timeout=5).status.code == pb.OK
    wait_until(lambda: len(subscribers()) == 3, what="the three lite topics dispatched")
    assert subscribers() == {"first": 1, "room": 1, "more0": 0}  # nothing the refusals asked for

    receive = svc.ReceiveMessageRequest(batch_size=32, long_polling_timeout=Duration(seconds=1))
    receive.group.name, receive.message_queue.topic.name = "LG", "LB"
    receive.invisible_duration.FromSeconds(30)
    meta = (("x-mq-client-id", "polite"), ("x-mq-language", "JAVA"))
    got = [r.message for r in stub.ReceiveMessage(receive, metadata=meta, timeout=10) if r.HasField("message")]
    assert [(m.body, m.system_properties.lite_topic) for m in got] == [(b"room", "room")]
