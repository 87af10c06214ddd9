"""CommitLog record codec: RocketMQ's v1/v2 message layout, pure functions over bytes.

Byte layout (big-endian), offsets for IPv4 hosts:

    0  TOTALSIZE            i32     whole record, this field included
    4  MAGICCODE            i32     0xDAA320A7 (v1) or 0xDAA320AB (v2: 2-byte topic length)
    8  BODYCRC              i32     crc32(body) & 0x7FFFFFFF
   12  QUEUEID              i32
   16  FLAG                 i32
   20  QUEUEOFFSET          i64     assigned at append time
   28  PHYSICALOFFSET       i64     the record's own commit-log offset
   36  SYSFLAG              i32
   40  BORNTIMESTAMP        i64     ms
   48  BORNHOST             ip4 + port i32 = 8, or ip6 + port = 20 (SYSFLAG 0x10)
   56  STORETIMESTAMP       i64     ms, set under the append lock
   64  STOREHOST            8 or 20 (SYSFLAG 0x20)
   72  RECONSUMETIMES       i32
   76  PREPAREDTXOFFSET     i64
   84  BODYLEN i32, body
       TOPICLEN (v1: u8, v2: i16), topic UTF-8
       PROPLEN i16, properties UTF-8: name \\x01 value \\x02 ...

Fixed overhead 4+4+4+4+4+8+8+4+8+8+8+8+4+8+4+1+2 = 91 bytes for v1 with IPv4 hosts; v2 adds one,
each IPv6 host adds 12.

A segment ends with a blank: [i32 remaining bytes][i32 BLANK_MAGIC_CODE], so no record spans two
segments.  `decode` returns a typed result — Record, EndOfSegment, EndOfData, Invalid — never a
magic number; the store, the dispatcher, recovery and the Spark data source all use it.
"""

from __future__ import annotations

import ipaddress
import mmap
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import final

try:  # zlib-ng's CRC-32: the same function, six times faster than zlib's on a 1 KiB body
    from zlib_ng.zlib_ng import crc32
except ImportError:  # a platform without a zlib-ng wheel
    from zlib import crc32

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194

BLANK_SIZE = 8  # [i32 size][i32 magic]
QUEUE_OFFSET_POSITION = 20
PHYSICAL_OFFSET_POSITION = 28
SYSFLAG_POSITION = 36

MAX_TOPIC_LENGTH_V1 = 127  # longer topics switch the record to v2
MAX_TOPIC_BYTES = 32767  # i16 length field of v2
MAX_PROPERTIES_BYTES = 32767

# SYSFLAG bits
FLAG_COMPRESSED = 0x1
FLAG_MULTI_TAGS = 0x2
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_NOT = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
# the transaction kinds whose records get a ConsumeQueue entry (PREPARED and ROLLBACK do not)
QUEUE_ENTRY_KINDS = (TRANSACTION_NOT, TRANSACTION_COMMIT)
FLAG_BORNHOST_V6 = 0x10
FLAG_STOREHOST_V6 = 0x20
FLAG_NEED_UNWRAP = 0x40
FLAG_INNER_BATCH = 0x80
COMPRESSION_TYPE_MASK = 0x700

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Well-known property names (RocketMQ MessageConst).
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
# the client message id: the key on disk is "UNIQ_KEY" (the Java constant that holds it is named
# PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX); stores written under that constant's name as the key
# are read as if it were UNIQ_KEY
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
LEGACY_PROPERTY_UNIQ_KEY = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
PROPERTY_INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
PROPERTY_INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
KEY_SEPARATOR = " "


class CodecError(ValueError):
    """The record cannot be encoded as given (the caller's fault)."""


# ---------------------------------------------------------------------------------------------
# Java String.hashCode, the ConsumeQueue tags code


# 31**k mod 2**32 for k = _POWERS_OF_31_COUNT - 1 down to 0: the last n weight a string of n units
_POWERS_OF_31_COUNT = 4096
_POWERS_OF_31 = [pow(31, k, 1 << 32) for k in range(_POWERS_OF_31_COUNT - 1, -1, -1)]


def java_string_hash_python(text: str) -> int:
    """Java's `String.hashCode()`: h = 31*h + c over UTF-16 code units, wrapped to int32.

    As the sum of c[i] * 31**(n-1-i) mod 2**32, one `map` over a table of powers instead of a
    Python step per unit.  `java_string_hash` is the compiled twin where the extension is built."""
    units: Sequence[int]
    if text.isascii():
        units = text.encode("ascii")
    else:
        raw = text.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    n = len(units)
    if n <= _POWERS_OF_31_COUNT:
        h = sum(map(operator.mul, units, _POWERS_OF_31[_POWERS_OF_31_COUNT - n :])) & 0xFFFFFFFF
    else:
        h = 0
        for unit in units:
            h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


try:
    from .._dispatch import java_hash as _java_hash
except ImportError:  # the extension is optional
    _java_hash = java_string_hash_python

# cached: tags repeat (key_hash bypasses the cache through __wrapped__: keys are mostly unique)
java_string_hash = lru_cache(maxsize=65536)(_java_hash)


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tags code: Java hash of the tag, sign-extended to i64; 0 without one."""
    return java_string_hash(tags) if tags else 0


# ---------------------------------------------------------------------------------------------
# Properties


def encode_properties(properties: dict[str, str]) -> bytes:
    """`name \\x01 value \\x02` for each property whose value is not None."""
    parts = [f"{name}\x01{value}\x02" for name, value in properties.items() if value is not None]
    text = "".join(parts)
    # each part holds exactly one of each separator unless a name or value smuggled one in
    if text.count("\x01") != len(parts) or text.count("\x02") != len(parts) or "\x02\x01" in text or text[:1] == "\x01":
        _explain_bad_properties(properties)
    return text.encode("utf-8")


def _explain_bad_properties(properties: dict[str, str]) -> None:
    for name, value in properties.items():
        if value is None:
            continue
        if not name:
            raise CodecError("property name must not be empty")
        for text in (str(name), str(value)):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise CodecError(f"property {name!r} contains a \\x01 or \\x02 separator character")
    raise CodecError("properties could not be encoded")


def decode_properties(data: bytes | bytearray | memoryview) -> dict[str, str]:
    """Inverse of `encode_properties`; like RocketMQ, skips segments under 3 chars or with no \\x01.
    A LEGACY_PROPERTY_UNIQ_KEY is returned as UNIQ_KEY (a UNIQ_KEY of the record wins)."""
    result: dict[str, str] = {}
    if not data:
        return result
    text = (data if type(data) is bytes else bytes(data)).decode("utf-8", "replace")
    for segment in text.split(PROPERTY_SEPARATOR):
        name, sep, value = segment.partition(NAME_VALUE_SEPARATOR)
        if sep and len(segment) >= 3:
            result[name] = value
    if LEGACY_PROPERTY_UNIQ_KEY in result:
        legacy = result.pop(LEGACY_PROPERTY_UNIQ_KEY)
        result.setdefault(PROPERTY_UNIQ_KEY, legacy)
    return result


# ---------------------------------------------------------------------------------------------
# Hosts and message ids

Host = tuple[str, int]
# what records are decoded from: a segment's mapping, or bytes read from it
RecordBuffer = bytes | bytearray | memoryview | mmap.mmap


@lru_cache(maxsize=1024)
def encode_host(host: Host) -> tuple[bytes, bool]:
    """(ip bytes + i32 port, is_ipv6) for an (address, port) pair."""
    address, port = host
    ip = ipaddress.ip_address(address)
    if not 0 <= port <= 0x7FFFFFFF:
        raise CodecError(f"port {port} out of range")
    return ip.packed + struct.pack(">i", port), ip.version == 6


def decode_host(data: bytes | memoryview) -> Host:
    raw = bytes(data)
    (port,) = struct.unpack_from(">i", raw, len(raw) - 4)
    return str(ipaddress.ip_address(raw[:-4])), port


def message_id(store_host: Host, commit_log_offset: int) -> str:
    """RocketMQ's offset message id: uppercase hex of store ip + port (i32) + offset (i64)."""
    packed, _ = encode_host(store_host)
    return (packed + struct.pack(">q", commit_log_offset)).hex().upper()


def parse_message_id(msg_id: str) -> tuple[Host, int]:
    """(store host, commit-log offset) from an offset message id (32 or 56 hex characters)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise CodecError(f"message id {msg_id!r} is not hexadecimal") from exc
    if len(raw) not in (16, 28):
        raise CodecError(f"message id {msg_id!r} must be 32 (IPv4) or 56 (IPv6) hex characters")
    (offset,) = struct.unpack_from(">q", raw, len(raw) - 8)
    return decode_host(raw[:-8]), offset


# ---------------------------------------------------------------------------------------------
# Header layouts: one struct per (born v6, store v6); the topic-length width is in the tail.


@lru_cache(maxsize=4)
def header_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    """TOTALSIZE .. BODYLEN: everything before the body."""
    born = "16si" if born_v6 else "4si"
    store = "16si" if store_v6 else "4si"
    return struct.Struct(f">iiiiiqqiq{born}q{store}iqi")


@final
@dataclass(slots=True)
class Record:
    """One decoded commit-log record. `body` is a memoryview into the source when decoded
    without copying; call bytes() on it to keep it past the source buffer's life."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sysflag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes | memoryview | None
    topic: str
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []

    @property
    def unique_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def transaction_type(self) -> int:
        return self.sysflag & TRANSACTION_TYPE_MASK

    @property
    def msg_id(self) -> str:
        return message_id(self.store_host, self.commit_log_offset)

    @property
    def body_bytes(self) -> bytes:
        """The body as bytes (a memoryview's are copied).  A record decoded without its body has
        none: asking is a ValueError."""
        body = self.body
        if body is None:
            raise ValueError(f"the record at {self.commit_log_offset} was decoded without its body")
        return body if type(body) is bytes else bytes(body)


@final
@dataclass(slots=True, frozen=True)
class EndOfSegment:
    """A blank filler: the rest of the segment (`size` bytes from `offset`) holds no record."""

    offset: int
    size: int


@final
@dataclass(slots=True, frozen=True)
class EndOfData:
    """Zeros where the next record would start: nothing was ever written here."""

    offset: int


@final
@dataclass(slots=True, frozen=True)
class Invalid:
    """Bytes at `offset` are not a valid record: a torn write or corruption (the caller decides
    which by what follows). `size` is the declared TOTALSIZE, or -1 if even that is unusable."""

    offset: int
    size: int
    reason: str


DecodeResult = Record | EndOfSegment | EndOfData | Invalid

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")

# RocketMQ's whole-record CRC property (its store's enabledAppendPropCRC): the last 20 bytes of a
# record that carries it are "__CRC32#", \x01, ten decimal digits (least significant first) and
# \x02, the last property; the digits are crc32(every byte of the record before them) & 0x7FFFFFFF.
CRC32_PROPERTY = "__CRC32#"
CRC32_PROPERTY_SIZE = len(CRC32_PROPERTY) + 1 + 10 + 1
CRC32_PROPERTY_MARK = CRC32_PROPERTY.encode() + b"\x01"
# What an appended record's properties end with before `seal_crc_property` fills in the digits.
CRC32_PROPERTY_RESERVED = CRC32_PROPERTY_MARK + b"0" * 10 + b"\x02"


def add_before_crc_property(properties_bytes: bytes, added: bytes) -> bytes:
    """Encoded properties with `added` (whole encoded properties) appended, before the reserved
    whole-record CRC property when they end with it: the CRC property stays the last one."""
    if properties_bytes.endswith(CRC32_PROPERTY_RESERVED):
        return b"".join((properties_bytes[:-CRC32_PROPERTY_SIZE], added, CRC32_PROPERTY_RESERVED))
    return properties_bytes + added


def crc_property_digits(crc: int) -> bytes:
    """The ten digits RocketMQ writes for `crc` (31 bits): least significant first, zero-padded."""
    return str(crc).zfill(10)[::-1].encode("ascii")


def seal_crc_property(buf, pos: int, size: int) -> None:
    """Fill in the whole-record CRC of the record at buf[pos:pos+size] if its properties end with
    the reserved property (`CRC32_PROPERTY_RESERVED`); every other field must be final."""
    end = pos + size
    tail = end - CRC32_PROPERTY_SIZE
    if buf[tail : tail + len(CRC32_PROPERTY_MARK)] != CRC32_PROPERTY_MARK or buf[end - 1] != 2:
        return
    with memoryview(buf)[pos:tail] as covered:
        crc = crc32(covered) & 0x7FFFFFFF
    buf[end - 11 : end - 1] = crc_property_digits(crc)


def whole_crc_mismatch(buf, pos: int, end: int) -> bool:
    """Whether the record at [pos, end) carries the whole-record CRC property and fails it."""
    tail = end - CRC32_PROPERTY_SIZE
    if buf[tail : tail + len(CRC32_PROPERTY_MARK)] != CRC32_PROPERTY_MARK or buf[end - 1] != 2:
        return False  # carries none: nothing to check
    digits = bytes(buf[end - 11 : end - 1])
    if not digits.isdigit():
        return True
    with memoryview(buf)[pos:tail] as covered:
        return (crc32(covered) & 0x7FFFFFFF) != int(digits[::-1])


_SIZE_MAGIC = struct.Struct(">ii")


# what `parse` finds in a record that passes its checks: the header's fields (`header_struct`
# order: TOTALSIZE .. BODYLEN), where the body starts, the topic's raw bytes, where the properties
# start and where the record ends
Layout = tuple[tuple, int, bytes, int, int]
HEADER_QUEUE_ID, HEADER_QUEUE_OFFSET, HEADER_SYSFLAG, HEADER_STORE_TIMESTAMP, HEADER_BODY_LENGTH = 3, 5, 7, 11, 16


def parse(
    buf: RecordBuffer, pos: int, base_offset: int = 0, check_position: bool = True
) -> Layout | EndOfSegment | EndOfData | Invalid:
    """The layout of the record at `buf[pos:]` with every check but the CRCs and the topic's
    UTF-8 (`decode` adds those): the one parse of a record, which `decode` and the columnar
    decoder's reference (`scan`) share.  Never raises on bad bytes."""
    offset = base_offset + pos
    available = len(buf) - pos
    if available < 8:
        if available <= 0 or not any(buf[pos:]):
            return EndOfData(offset)
        return Invalid(offset, -1, f"only {available} bytes left, too few for a record header")
    total_size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        if total_size != available:
            return Invalid(
                offset, total_size, f"blank filler of {total_size} bytes, but {available} remain in the segment"
            )
        return EndOfSegment(offset, total_size)
    if total_size == 0 and magic == 0:
        return EndOfData(offset)
    if magic == MESSAGE_MAGIC_CODE:
        v2 = False
    elif magic == MESSAGE_MAGIC_CODE_V2:
        v2 = True
    else:
        return Invalid(offset, total_size, f"bad magic code 0x{magic & 0xFFFFFFFF:08X}")
    if total_size < 91 or total_size > available:
        return Invalid(offset, total_size, f"record size {total_size} does not fit the {available} bytes left")
    sysflag = _I32.unpack_from(buf, pos + SYSFLAG_POSITION)[0]
    header = header_struct(bool(sysflag & FLAG_BORNHOST_V6), bool(sysflag & FLAG_STOREHOST_V6))
    if header.size + 3 > total_size:  # header, a topic length and a properties length at least
        return Invalid(offset, total_size, f"record size {total_size} is smaller than its {header.size}-byte header")
    fields = header.unpack_from(buf, pos)
    body_len = fields[HEADER_BODY_LENGTH]
    cursor = pos + header.size
    end = pos + total_size
    if body_len < 0 or cursor + body_len > end:
        return Invalid(offset, total_size, f"body length {body_len} runs past the record")
    body_start = cursor
    cursor += body_len
    if v2:
        if cursor + 2 > end:
            return Invalid(offset, total_size, "topic length runs past the record")
        topic_len = _I16.unpack_from(buf, cursor)[0]
        cursor += 2
    else:
        if cursor + 1 > end:
            return Invalid(offset, total_size, "topic length runs past the record")
        topic_len = buf[cursor]
        cursor += 1
    if topic_len < 0 or cursor + topic_len + 2 > end:
        return Invalid(offset, total_size, f"topic length {topic_len} runs past the record")
    topic_bytes = bytes(buf[cursor : cursor + topic_len])
    cursor += topic_len
    prop_len = _I16.unpack_from(buf, cursor)[0]
    cursor += 2
    if prop_len < 0 or cursor + prop_len != end:
        return Invalid(
            offset,
            total_size,
            f"record size {total_size} does not match its fields ({cursor + max(prop_len, 0) - pos})",
        )
    physical_offset = fields[6]
    if check_position and physical_offset != offset:
        return Invalid(offset, total_size, f"PHYSICALOFFSET {physical_offset} differs from the position {offset}")
    return fields, body_start, topic_bytes, cursor, end


def decode(
    buf: RecordBuffer,
    pos: int = 0,
    *,
    base_offset: int = 0,
    check_crc: bool = True,
    read_body: bool = True,
    read_properties: bool = True,
    check_position: bool = True,
) -> DecodeResult:
    """Decode the record at `buf[pos:]`.  `base_offset` is the commit-log offset of `buf[0]`,
    used to check PHYSICALOFFSET and to report positions.  Never raises on bad bytes."""
    layout = parse(buf, pos, base_offset, check_position)
    if type(layout) is not tuple:
        return layout  # type: ignore[return-value]
    fields, body_start, topic_bytes, properties_at, end = layout
    total_size, body_crc, body_len = fields[0], fields[2], fields[HEADER_BODY_LENGTH]
    offset = base_offset + pos
    body = memoryview(buf)[body_start : body_start + body_len] if read_body or check_crc else None
    if check_crc and (crc32(body) & 0x7FFFFFFF) != body_crc:
        return Invalid(offset, total_size, "body CRC mismatch")
    if check_crc and end - properties_at >= CRC32_PROPERTY_SIZE and whole_crc_mismatch(buf, pos, end):
        return Invalid(offset, total_size, f"whole-record CRC ({CRC32_PROPERTY}) mismatch")
    try:
        topic = decode_topic(topic_bytes)
    except UnicodeDecodeError:
        return Invalid(offset, total_size, "topic is not valid UTF-8")
    # positional, in field order (this is the dispatcher's and the data source's hot path)
    return Record(
        total_size,
        fields[1],  # MAGICCODE
        body_crc,
        fields[3],  # QUEUEID
        fields[4],  # FLAG
        fields[5],  # QUEUEOFFSET
        fields[6],  # PHYSICALOFFSET
        fields[7],  # SYSFLAG
        fields[8],  # BORNTIMESTAMP
        _host(fields[9], fields[10]),
        fields[11],  # STORETIMESTAMP
        _host(fields[12], fields[13]),
        fields[14],  # RECONSUMETIMES
        fields[15],  # PREPAREDTXOFFSET
        body if read_body else None,
        topic,
        decode_properties(buf[properties_at:end]) if read_properties and end > properties_at else {},
    )


@lru_cache(maxsize=65536)
def decode_topic(raw: bytes) -> str:
    """A topic's UTF-8 bytes as text, cached (a log holds few topics); raises UnicodeDecodeError."""
    return raw.decode("utf-8")


@lru_cache(maxsize=4096)
def _host(ip: bytes, port: int) -> Host:
    return str(ipaddress.ip_address(ip)), port


def skip_records(buf: RecordBuffer, pos: int, limit: int) -> int:
    """Follow the TOTALSIZE chain from the record at `pos` to the first record starting at or
    past `limit`, reading only each record's size and magic (the Spark planner's cheap scan for
    record-aligned split points).  Stops early where no record header is (a blank, zeros, damage
    or the buffer's end) and returns that position: `decode` there says which."""
    unpack = _SIZE_MAGIC.unpack_from
    last = len(buf) - 8
    while pos < limit and pos <= last:
        size, magic = unpack(buf, pos)
        if (magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2) or size < 91 or pos + size > last + 8:
            break
        pos += size
    return pos


# ---------------------------------------------------------------------------------------------
# Encoding: split so that the variable part is built outside the append lock and the
# position-dependent fields (queue offset, physical offset, store time) are packed inside it.


_POSITION_FIELDS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET at offset 20
_I64 = struct.Struct(">q")


class EncodedMessage:
    """A whole record, encoded outside the append lock with its position-dependent fields
    (queue offset, physical offset, store time) left zero; `pack_into` writes it and fills them."""

    __slots__ = ("data", "total_size", "store_timestamp_position")

    def __init__(self, data: bytes, store_timestamp_position: int) -> None:
        self.data = data
        self.total_size = len(data)
        self.store_timestamp_position = store_timestamp_position

    def pack_into(self, buf, pos: int, queue_offset: int, commit_log_offset: int, store_timestamp: int) -> None:
        buf[pos : pos + self.total_size] = self.data
        _POSITION_FIELDS.pack_into(buf, pos + QUEUE_OFFSET_POSITION, queue_offset, commit_log_offset)
        _I64.pack_into(buf, pos + self.store_timestamp_position, store_timestamp)


class RecordTemplate:
    """The parts of a record fixed by its topic and hosts, encoded once: a put then costs one
    header pack and one join.  Get one with `template(topic, born_host, store_host)`."""

    __slots__ = (
        "header",
        "fixed_size",
        "magic",
        "sysflag_bits",
        "born_ip",
        "born_port",
        "store_ip",
        "store_port",
        "topic_part",
        "store_timestamp_position",
        "native",
    )

    def __init__(self, topic: str, born_host: Host, store_host: Host) -> None:
        topic_bytes = topic.encode("utf-8")
        if len(topic_bytes) > MAX_TOPIC_BYTES:
            raise CodecError(f"topic is {len(topic_bytes)} bytes, at most {MAX_TOPIC_BYTES} fit a record")
        born_packed, born_v6 = encode_host(born_host)
        store_packed, store_v6 = encode_host(store_host)
        v2 = len(topic) > MAX_TOPIC_LENGTH_V1 or len(topic_bytes) > 255
        self.header = header_struct(born_v6, store_v6)
        self.magic = MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE
        self.sysflag_bits = (FLAG_BORNHOST_V6 if born_v6 else 0) | (FLAG_STOREHOST_V6 if store_v6 else 0)
        self.born_ip, self.born_port = born_packed[:-4], born_host[1]
        self.store_ip, self.store_port = store_packed[:-4], store_host[1]
        self.topic_part = (_I16.pack(len(topic_bytes)) if v2 else bytes((len(topic_bytes),))) + topic_bytes
        self.fixed_size = self.header.size + len(self.topic_part) + 2
        # STORETIMESTAMP follows BORNHOST: 56 with an IPv4 born host, 68 with IPv6
        self.store_timestamp_position = 68 if born_v6 else 56
        # the same fields in one tuple, for the compiled append loop (_append.c)
        self.native = (
            self.magic,
            self.sysflag_bits,
            self.born_ip,
            self.born_port,
            self.store_ip,
            self.store_port,
            self.topic_part,
            self.fixed_size,
        )

    def encode(
        self,
        body: bytes,
        queue_id: int,
        properties_bytes: bytes,
        born_timestamp: int,
        flag: int = 0,
        sysflag: int = 0,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
    ) -> EncodedMessage:
        if len(properties_bytes) > MAX_PROPERTIES_BYTES:
            raise CodecError(f"properties are {len(properties_bytes)} bytes, at most {MAX_PROPERTIES_BYTES}")
        body_len = len(body)
        data = b"".join(
            (
                self.header.pack(
                    self.fixed_size + body_len + len(properties_bytes),
                    self.magic,
                    crc32(body) & 0x7FFFFFFF,
                    queue_id,
                    flag,
                    0,
                    0,
                    (sysflag & ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)) | self.sysflag_bits,
                    born_timestamp,
                    self.born_ip,
                    self.born_port,
                    0,
                    self.store_ip,
                    self.store_port,
                    reconsume_times,
                    prepared_transaction_offset,
                    body_len,
                ),
                body,
                self.topic_part,
                _I16.pack(len(properties_bytes)),
                properties_bytes,
            )
        )
        return EncodedMessage(data, self.store_timestamp_position)

    def size(self, body_len: int, properties_len: int) -> int:
        return self.fixed_size + body_len + properties_len

    def write_into(
        self,
        buf,
        pos: int,
        body: bytes,
        body_crc: int,
        queue_id: int,
        properties_bytes: bytes,
        born_timestamp: int,
        flag: int,
        sysflag: int,
        reconsume_times: int,
        prepared_transaction_offset: int,
        queue_offset: int,
        commit_log_offset: int,
        store_timestamp: int,
    ) -> None:
        """Write a whole record at `buf[pos:]` in place, every field known (the append path: no
        intermediate bytes object).  `body_crc` is `crc32(body) & 0x7FFFFFFF`; properties must
        already be checked against MAX_PROPERTIES_BYTES."""
        body_len = len(body)
        properties_len = len(properties_bytes)
        header = self.header
        header.pack_into(
            buf,
            pos,
            self.fixed_size + body_len + properties_len,
            self.magic,
            body_crc,
            queue_id,
            flag,
            queue_offset,
            commit_log_offset,
            (sysflag & ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)) | self.sysflag_bits,
            born_timestamp,
            self.born_ip,
            self.born_port,
            store_timestamp,
            self.store_ip,
            self.store_port,
            reconsume_times,
            prepared_transaction_offset,
            body_len,
        )
        pos += header.size
        buf[pos : pos + body_len] = body
        pos += body_len
        tail = self.topic_part + properties_len.to_bytes(2, "big") + properties_bytes
        buf[pos : pos + len(tail)] = tail


@lru_cache(maxsize=4096)
def template(topic: str, born_host: Host, store_host: Host) -> RecordTemplate:
    return RecordTemplate(topic, born_host, store_host)


def prepare(
    *,
    topic: str,
    body: bytes,
    queue_id: int,
    properties_bytes: bytes,
    store_host: Host,
    born_host: Host,
    born_timestamp: int,
    flag: int = 0,
    sysflag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> EncodedMessage:
    """Encode everything that does not depend on where the record lands."""
    return template(topic, born_host, store_host).encode(
        body, queue_id, properties_bytes, born_timestamp, flag, sysflag, reconsume_times, prepared_transaction_offset
    )


def encode(
    *,
    topic: str,
    body: bytes,
    queue_id: int = 0,
    queue_offset: int = 0,
    commit_log_offset: int = 0,
    store_timestamp: int = 0,
    properties: dict[str, str] | None = None,
    store_host: Host = ("127.0.0.1", 10911),
    born_host: Host = ("127.0.0.1", 0),
    born_timestamp: int = 0,
    flag: int = 0,
    sysflag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> bytes:
    """A whole record as bytes (tests, tools, and the Spark pipeline's fixtures)."""
    prepared = prepare(
        topic=topic,
        body=body,
        queue_id=queue_id,
        properties_bytes=encode_properties(properties or {}),
        store_host=store_host,
        born_host=born_host,
        born_timestamp=born_timestamp,
        flag=flag,
        sysflag=sysflag,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
    )
    out = bytearray(prepared.total_size)
    prepared.pack_into(out, 0, queue_offset, commit_log_offset, store_timestamp)
    return bytes(out)


def closes_segment(buf, pos: int, segment_size: int) -> bool:
    """Whether the bytes at `pos` of a segment's `segment_size` bytes are the blank that closes
    it (dispatch moves past it to the next segment)."""
    if pos + BLANK_SIZE > segment_size:
        return False
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return magic == BLANK_MAGIC_CODE and pos + size == segment_size


def encode_blank(size: int) -> bytes:
    """The filler that closes a segment: `size` bytes, of which the first 8 say so."""
    if size < BLANK_SIZE:
        raise CodecError(f"a blank needs at least {BLANK_SIZE} bytes, got {size}")
    return _SIZE_MAGIC.pack(size, BLANK_MAGIC_CODE)
