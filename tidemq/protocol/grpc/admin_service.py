"""tidemq's own admin service, `tidemq.Admin`, on the MessagingService port: unary methods
with JSON payloads (no .proto to compile).  Each answer is `{"result": ...}` or
`{"error": {"code": NAME, "message": text}}`."""

from __future__ import annotations

import inspect
import json
import logging

from ...broker import Broker, BrokerError, admin, lookups
from .transport import UNARY, Method

log = logging.getLogger(__name__)

SERVICE = "tidemq.Admin"


def _encode(value) -> bytes:
    return json.dumps(value).encode()


def _decode(data: bytes):
    return json.loads(data or b"{}")


def admin_methods(broker: Broker) -> dict[str, Method]:
    """The transport's method table for `tidemq.Admin`."""

    def call(function):
        def handle(request, rpc):
            try:
                result = function(broker, **request)
            except (BrokerError, TypeError) as exc:
                return _error(exc)
            return _awaited(result) if inspect.iscoroutine(result) else {"result": result}

        handle.__name__ = function.__name__
        return Method(UNARY, handle, _decode, _encode)

    methods = {
        "CreateTopic": admin.create_topic,
        "ListTopics": admin.list_topics,
        "CreateGroup": admin.create_group,
        "UpdateGroup": admin.update_group,
        "ListGroups": admin.list_groups,
        "ListLite": admin.list_lite,
        "Stats": admin.stats,
        **lookups.METHODS,
    }
    return {f"/{SERVICE}/{name}": call(f) for name, f in methods.items()}


def _error(exc: Exception) -> dict:
    if isinstance(exc, BrokerError):
        return {"error": {"code": exc.code.name, "message": exc.message}}
    return {"error": {"code": "BAD_REQUEST", "message": str(exc)}}


async def _awaited(result) -> dict:
    try:
        return {"result": await result}
    except (BrokerError, TypeError) as exc:
        return _error(exc)


def admin_call(address: str, method: str, timeout: float = 10.0, **arguments):
    """Call the admin service of a running broker (synchronous; for the CLI, so grpcio is
    imported here, never by a broker)."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=_encode, response_deserializer=_decode)
        answer = stub(arguments, timeout=timeout)
    if "error" in answer:
        raise BrokerError.from_name(answer["error"]["code"], answer["error"]["message"])
    return answer["result"]
