"""gRPC's framing on HTTP/2 (the gRPC over HTTP2 protocol document): a message's 5-octet prefix,
status trailers, metadata values, timeouts, and compressed request messages.  Pure."""

from __future__ import annotations

import base64
import importlib
import struct
from types import ModuleType

from ..http2 import hpack


def _zlib() -> ModuleType:
    """zlib-ng inflates faster (the event loop's turn is shorter); the standard
    zlib has the same API.  (zlib-ng's type stub declares `error` an instance, not the class it
    is: the module is typed as a plain module.)"""
    try:
        return importlib.import_module("zlib_ng.zlib_ng")
    except ImportError:  # pragma: no cover - a dependency
        return importlib.import_module("zlib")


zlib = _zlib()

# gRPC status codes
OK, CANCELLED, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 1, 2, 8, 12, 13

MESSAGE_PREFIX = struct.Struct(">BI")  # a message's compressed flag and length
FOREVER = float(1 << 40)  # the deadline of a call without grpc-timeout, in seconds since the epoch
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
NOT_METADATA = frozenset(("content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"))
_MAX_DETAILS = 1024  # characters of grpc-message sent

# ":status: 200" is entry 8 of HPACK's static table; "content-type" is entry 31
RESPONSE_HEADERS = b"\x88" + hpack.encode_indexed_name(31, b"application/grpc")
OK_TRAILERS = hpack.encode_literal(b"grpc-status", b"0")


def trailers(code: int, details: str) -> bytes:
    block = hpack.encode_literal(b"grpc-status", str(code).encode())
    if details:
        block += hpack.encode_literal(b"grpc-message", _percent_encode(details[:_MAX_DETAILS]))
    return block


def _percent_encode(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII but '%' as is, the rest %XX of its UTF-8."""
    raw = text.encode("utf-8", "replace")
    return b"".join(bytes((c,)) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c for c in raw)


def binary_metadata(value: str) -> bytes:
    """A "-bin" metadata value: base64, padded or not."""
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return value.encode("latin-1")


def parse_timeout(value: str) -> float:
    """grpc-timeout ("1S", "2999m") in seconds."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None or not value[:-1].isdigit() or len(value) > 9:
        raise ValueError(f"malformed grpc-timeout {value!r}")
    return int(value[:-1]) * unit


class Refused(Exception):
    """A request the server will not serve: answered with `code` and the message."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """A compressed request message, inflated to at most `limit` octets (else RESOURCE_EXHAUSTED)."""
    if encoding == "gzip":
        wbits = 31
    elif encoding == "deflate":
        wbits = 15
    else:
        raise Refused(INTERNAL, "compressed flag set without a grpc-encoding")
    inflater = zlib.decompressobj(wbits)
    try:
        inflated = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise Refused(INTERNAL, f"compressed request message: {exc}") from None
    if len(inflated) > limit or inflater.unconsumed_tail:
        raise Refused(
            RESOURCE_EXHAUSTED, f"a request message larger than the {limit} octets the server accepts once inflated"
        )
    return inflated
