"""HTTP/2 (RFC 9113), server side: a pure frame codec (`frames`), a sans-I/O connection that owns
stream and flow-control state (`connection`), and the limits it enforces (`limits`).  The gRPC
server (`tidemq.protocol.grpc`) runs on it through an asyncio adapter."""

from .connection import (
    DataReceived,
    DataSent,
    H2Connection,
    ProtocolError,
    RequestReceived,
    StreamClosed,
    StreamReset,
    TrailersReceived,
)
from .limits import Limits

__all__ = [
    "DataReceived",
    "DataSent",
    "H2Connection",
    "Limits",
    "ProtocolError",
    "RequestReceived",
    "StreamClosed",
    "StreamReset",
    "TrailersReceived",
]
