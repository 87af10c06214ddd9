"""tidemq's own admin service, `tidemq.Admin`, on the MessagingService port: unary methods
with JSON payloads (no .proto to compile).  Each answer is `{"result": ...}` or
`{"error": {"code": NAME, "message": text}}`."""

from __future__ import annotations

import json
import logging

import grpc

from ...broker import Broker, BrokerError, admin

log = logging.getLogger(__name__)

SERVICE = "tidemq.Admin"


def _encode(value) -> bytes:
    return json.dumps(value).encode()


def _decode(data: bytes):
    return json.loads(data or b"{}")


def admin_handler(broker: Broker) -> grpc.GenericRpcHandler:
    def call(function):
        async def handle(request, context):
            try:
                return {"result": function(broker, **request)}
            except BrokerError as exc:
                return {"error": {"code": exc.code.name, "message": exc.message}}
            except TypeError as exc:
                return {"error": {"code": "BAD_REQUEST", "message": str(exc)}}

        return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=_decode, response_serializer=_encode)

    methods = {
        "CreateTopic": admin.create_topic,
        "ListTopics": admin.list_topics,
        "CreateGroup": admin.create_group,
        "ListGroups": admin.list_groups,
        "Stats": admin.stats,
    }
    return grpc.method_handlers_generic_handler(SERVICE, {name: call(f) for name, f in methods.items()})


def admin_call(address: str, method: str, timeout: float = 10.0, **arguments):
    """Call the admin service of a running broker (synchronous; for the CLI)."""
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=_encode, response_deserializer=_decode)
        answer = stub(arguments, timeout=timeout)
    if "error" in answer:
        raise BrokerError.from_name(answer["error"]["code"], answer["error"]["message"])
    return answer["result"]
