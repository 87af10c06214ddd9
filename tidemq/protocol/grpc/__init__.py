"""apache.rocketmq.v2 gRPC endpoint: a thin adapter from protobuf to broker calls, plus tidemq's
JSON admin service on the same port."""

from .admin_service import admin_call, admin_methods
from .messaging_service import MessagingService
from .transport import GrpcServer

__all__ = ["GrpcServer", "MessagingService", "admin_call", "admin_methods"]
