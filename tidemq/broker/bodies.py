"""A stored body as a client receives it, by RocketMQ 5.5.0's sysflag semantics.

`MessageSysFlag.COMPRESSED_FLAG` (bit 0) says the body is compressed; bits 8-10 say how
(`CompressionType`): 1 LZ4, 2 ZSTD, 3 ZLIB, and 0, the value of stores older than these bits,
ZLIB too.  RocketMQ's own clients compress with zlib (a zlib stream, RFC 1950) and set 3; its
gRPC proxy stores a client's GZIP-encoded body (RFC 1952) as it came, with bit 0 only, and so
does tidemq.  The two containers are told apart by their first octet: a gzip member starts
0x1f 0x8b, while a zlib stream's first octet has 8 (deflate) in its low nibble.

So a client is given a gzip body as it is, marked GZIP (it inflates it), and a zlib body inflated
(RocketMQ's proxy likewise inflates what it reads before it answers), marked IDENTITY.  LZ4 and
ZSTD bodies, which a 4.x-style producer writes only when told to, are given as stored: tidemq has
no decoder for them.  Pure functions."""

from __future__ import annotations

import logging
import zlib

from ..store import record

log = logging.getLogger(__name__)

COMPRESSION_SHIFT = 8
COMPRESSION_LZ4 = 1
COMPRESSION_ZSTD = 2
COMPRESSION_ZLIB = 3
# the bits that say how a body is stored; a copy of a record (retry, dead letter) keeps them
BODY_FLAGS = record.FLAG_COMPRESSED | record.COMPRESSION_TYPE_MASK
GZIP_MAGIC = b"\x1f\x8b"
# the most a stored body inflates to (RocketMQ's clients compress bodies of at most their
# maxMessageSize, 4 MiB by default); a body that would inflate further is given as stored
MAX_INFLATED = 64 << 20


def compression_type(sysflag: int) -> int:
    """RocketMQ's CompressionType value of a compressed record (0 reads as ZLIB)."""
    kind = (sysflag & record.COMPRESSION_TYPE_MASK) >> COMPRESSION_SHIFT
    return COMPRESSION_ZLIB if kind == 0 else kind


def delivered_body(body: bytes, sysflag: int) -> tuple[bytes, bool]:
    """(the body to give a client, whether it is gzip-encoded)."""
    if not sysflag & record.FLAG_COMPRESSED:
        return body, False
    if compression_type(sysflag) != COMPRESSION_ZLIB:
        return body, False
    if body[:2] == GZIP_MAGIC:
        return body, True
    plain = _inflate(body, 15)
    if plain is None:
        log.warning(
            "a body flagged zlib-compressed does not inflate to at most %d octets; it is given as stored", MAX_INFLATED
        )
        return body, False
    return plain, False


def plain_body(body: bytes, sysflag: int) -> bytes | None:
    """The uncompressed body, or None if it cannot be had (an unknown or broken encoding)."""
    if not sysflag & record.FLAG_COMPRESSED:
        return body
    if compression_type(sysflag) != COMPRESSION_ZLIB:
        return None
    return _inflate(body, 31 if body[:2] == GZIP_MAGIC else 15)


def _inflate(body: bytes, wbits: int) -> bytes | None:
    """One whole zlib (wbits 15) or gzip (31) stream inflated, or None if it is broken, cut short
    or inflates past MAX_INFLATED."""
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(body, MAX_INFLATED)
    except zlib.error:
        return None
    if inflater.unconsumed_tail or not inflater.eof:
        return None
    return plain
