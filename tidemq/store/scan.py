"""Columnar dispatch decoder: the fields dispatch needs from a run of commit-log records, as columns.

`record.decode` is the reference codec and returns one `Record` (a properties dict, hosts,
a body view) per call; dispatch needs a few fixed fields of every record and two or three
property values.  `scan` walks the TOTALSIZE chain of a buffer from `start` and returns them
for every record as NumPy columns:

    offsets           i64   commit-log offset (base_offset + position)
    sizes             i32   TOTALSIZE
    queue_ids         i32   QUEUEID           at +12
    queue_offsets     i64   QUEUEOFFSET       at +20
    sysflags          i32   SYSFLAG           at +36
    store_timestamps  i64   STORETIMESTAMP    at +56 (+68 with an IPv6 born host)
    tags_codes        i64   Java hash of the TAGS property, 0 without one
    topics            list[str], and topic_ids (i32, equal ids for equal topics within a scan)
    properties_starts / properties_ends: where each record's properties lie in the buffer,
                      decoded lazily (`properties`, `unique_key`, `keys`, `index_keys`)

Only the walk along the chain (one 4-byte read per record), the topic and the TAGS value
(`find` on the buffer, then cached decodes and Java hashes) are per-record Python work; the
fixed fields and every layout check are gathered with NumPy from the record positions.

The scan stops at the first position that does not hold a whole valid record ending at or
before `stop` (a blank, zeros, a torn or corrupt record, or a record running past `stop`):
`end` says where, and `record.decode` there gives the typed reason.  The checks are exactly
those of `record.decode(..., check_crc=False)`; the tests hold the two to agreement.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import numpy as np

from .index_file import INT_MAX
from .record import (
    KEY_SEPARATOR,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_ROLLBACK,
    TRANSACTION_TYPE_MASK,
    decode_properties,
    java_string_hash,
)

MIN_RECORD_SIZE = 91  # v1, IPv4 hosts, empty body, topic and properties
HEADER_SIZE_V4 = 88  # TOTALSIZE .. BODYLEN with IPv4 hosts; each IPv6 host adds 12

_I32 = struct.Struct(">i")

_TAGS_AT_START = b"TAGS\x01"
_TAGS_INSIDE = b"\x02TAGS\x01"
_SEPARATOR = b"\x02"


@dataclass(slots=True)
class RecordColumns:
    """What `scan` found: one row per record, in log order."""

    buffer: object  # the scanned buffer, for lazy property reads
    base_offset: int
    end: int  # commit-log offset where the scan stopped
    positions: np.ndarray  # i64, in the buffer
    offsets: np.ndarray
    sizes: np.ndarray
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    sysflags: np.ndarray
    store_timestamps: np.ndarray
    tags_codes: np.ndarray
    topics: list[str]
    topic_ids: np.ndarray  # i32: rows with equal topics have equal ids (within this scan)
    topic_names: list[str]  # topic_names[topic_ids[i]] == topics[i]
    properties_starts: np.ndarray
    properties_ends: np.ndarray

    def __len__(self) -> int:
        return len(self.topics)

    def properties(self, i: int) -> dict[str, str]:
        """Row `i`'s properties, decoded as `record.decode` does."""
        return decode_properties(self.buffer[int(self.properties_starts[i]) : int(self.properties_ends[i])])

    def property(self, i: int, name: str) -> str | None:
        """One property of row `i` (the last one of that name, as a dict would keep)."""
        return property_value(self.buffer, int(self.properties_starts[i]), int(self.properties_ends[i]), name)

    def unique_key(self, i: int) -> str | None:
        return self.property(i, PROPERTY_UNIQ_KEY)

    def keys(self, i: int) -> list[str]:
        raw = self.property(i, PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []

    def index_keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The key index's entries for these rows, in order: (abs Java hash of "topic#key" as
        IndexFile keeps it, commit-log offset, store timestamp) for the UNIQ_KEY and then each
        KEYS entry of every record that is not a ROLLBACK."""
        return index_entries(self)


def _empty(buf, base_offset: int, end: int) -> RecordColumns:
    i64 = np.zeros(0, np.int64)
    i32 = np.zeros(0, np.int32)
    return RecordColumns(buf, base_offset, end, i64, i64, i32, i32, i64, i32, i64, i64, [], i32, [], i64, i64)


def _view(buf, dtype: str, start: int, stop: int) -> np.ndarray:
    """Values of `dtype` starting at every byte position in [start, stop - itemsize] of `buf`
    (overlapping, stride 1): `_view(...)[p - start]` reads the field at p."""
    size = np.dtype(dtype).itemsize
    return np.ndarray(shape=(max(stop - start - size + 1, 0),), dtype=dtype, buffer=buf, offset=start, strides=(1,))


def _at(view: np.ndarray, positions: np.ndarray, start: int) -> np.ndarray:
    """`view`'s values at buffer positions (clipped into the view: rows that read outside are
    invalid anyway and masked by the caller), as int64."""
    return view[np.clip(positions - start, 0, len(view) - 1)].astype(np.int64)


def _walk(buf, pos: int, stop: int, soft_stop: int) -> list[int]:
    """Record positions along the TOTALSIZE chain from `pos`: each record at least the minimum
    size and ending at or before `stop`; no record starts at or past `soft_stop`."""
    unpack = _I32.unpack_from
    positions: list[int] = []
    append = positions.append
    limit = min(stop - MIN_RECORD_SIZE + 1, soft_stop)
    while pos < limit:
        size = unpack(buf, pos)[0]
        if size < MIN_RECORD_SIZE or pos + size > stop:
            break
        append(pos)
        pos += size
    return positions


# bytes -> (topic, id), bytes -> tags code: shared by every scan of the process
_topics: dict[bytes, str] = {}
_tags_codes: dict[bytes, int] = {}


def scan(buf, start: int, stop: int, base_offset: int = 0, soft_stop: int | None = None) -> RecordColumns:
    """Decode the dispatch fields of every whole valid record in `buf[start:stop]`, following
    the chain from `start` (a record boundary).  `base_offset` is the commit-log offset of
    `buf[0]`.  With `soft_stop`, no record starting at or past it is taken (records may still
    run on to `stop`)."""
    if isinstance(buf, (bytearray, memoryview)):
        buf = bytes(buf)  # slices must be hashable bytes; the hot path scans mmaps
    stop = min(stop, len(buf))
    positions = _walk(buf, start, stop, stop if soft_stop is None else soft_stop)
    if not positions:
        return _empty(buf, base_offset, base_offset + start)
    pos = np.array(positions, dtype=np.int64)
    # views from the first record on: every field lies below `stop`
    lo = positions[0]
    i8, i4, i2, u1 = (_view(buf, t, lo, stop) for t in (">i8", ">i4", ">i2", "u1"))
    try:
        sizes = _at(i4, pos, lo)
        magic = _at(i4, pos + 4, lo)
        sysflags = _at(i4, pos + 36, lo)
        ends = pos + sizes
        born_v6 = (sysflags & 0x10) != 0
        store_v6 = (sysflags & 0x20) != 0
        header_size = HEADER_SIZE_V4 + 12 * born_v6 + 12 * store_v6
        body_lengths = _at(i4, pos + header_size - 4, lo)
        v2 = magic == MESSAGE_MAGIC_CODE_V2
        topic_length_at = pos + header_size + body_lengths
        topic_lengths = np.where(v2, _at(i2, topic_length_at, lo), _at(u1, topic_length_at, lo))
        topic_at = topic_length_at + 1 + v2
        properties_at = topic_at + topic_lengths + 2
        properties_lengths = _at(i2, properties_at - 2, lo)
        ok = (
            ((magic == MESSAGE_MAGIC_CODE) | v2)
            & (body_lengths >= 0)
            & (topic_length_at + 1 + v2 <= ends)
            & (topic_lengths >= 0)
            & (properties_at <= ends)
            & (properties_lengths >= 0)
            & (properties_at + properties_lengths == ends)
            & (_at(i8, pos + 28, lo) == pos + base_offset)
        )
        count = len(positions) if ok.all() else int(np.argmin(ok))
        pos = pos[:count]
        queue_ids = i4[pos + (12 - lo)].astype(np.int32)
        queue_offsets = i8[pos + (20 - lo)].astype(np.int64)
        store_timestamps = i8[pos + (56 - lo) + 12 * born_v6[:count]].astype(np.int64)
    finally:
        del i8, i4, i2, u1  # release the buffer exports: the caller may close the mapping
    # per-record work: the topic and the TAGS value
    topics: list[str] = []
    topic_ids: list[int] = []
    codes: list[int] = []
    names: dict[str, int] = {}
    topic_cache = _topics
    tags_cache = _tags_codes
    for i, (t0, p0, p1) in enumerate(
        zip(topic_at[:count].tolist(), properties_at[:count].tolist(), ends[:count].tolist())
    ):
        raw = buf[t0 : p0 - 2]
        topic = topic_cache.get(raw)
        if topic is None:
            try:
                topic = raw.decode("utf-8")
            except UnicodeDecodeError:
                count = i  # record.decode calls this record Invalid
                break
            if len(topic_cache) > 65536:
                topic_cache.clear()
            topic_cache[raw] = topic
        topics.append(topic)
        tid = names.get(topic)
        if tid is None:
            tid = names[topic] = len(names)
        topic_ids.append(tid)
        # the last TAGS property wins, as in a dict: a "\x02TAGS\x01" inside, else one at the start
        props = buf[p0:p1]
        at = props.rfind(_TAGS_INSIDE)
        if at >= 0:
            at += 6
        elif props[:5] == _TAGS_AT_START:
            at = 5
        else:
            codes.append(0)
            continue
        value_end = props.find(_SEPARATOR, at)
        value = props[at:value_end] if value_end >= 0 else props[at:]
        code = tags_cache.get(value)
        if code is None:
            text = value.decode("utf-8", "replace")
            code = java_string_hash(text) if text else 0
            if len(tags_cache) > 65536:
                tags_cache.clear()
            tags_cache[value] = code
        codes.append(code)
    pos = pos[:count]
    return RecordColumns(
        buffer=buf,
        base_offset=base_offset,
        end=base_offset + (int(ends[count - 1]) if count else start),
        positions=pos,
        offsets=pos + base_offset,
        sizes=sizes[:count].astype(np.int32),
        queue_ids=queue_ids[:count],
        queue_offsets=queue_offsets[:count],
        sysflags=sysflags[:count].astype(np.int32),
        store_timestamps=store_timestamps[:count],
        tags_codes=np.array(codes, dtype=np.int64),
        topics=topics,
        topic_ids=np.array(topic_ids, dtype=np.int32),
        topic_names=list(names),
        properties_starts=properties_at[:count],
        properties_ends=ends[:count],
    )


def property_value(buf, start: int, end: int, name: str) -> str | None:
    """The value of property `name` in `buf[start:end]` as `record.decode_properties` would give
    it (the last segment of that name; undecodable bytes replaced), or None."""
    key = name.encode("utf-8")
    first, last = _value_range(buf, start, end, b"\x02" + key + b"\x01", key + b"\x01")
    if first < 0:
        return None
    return bytes(buf[first:last]).decode("utf-8", "replace")


_UNIQ_INSIDE = b"\x02" + PROPERTY_UNIQ_KEY.encode() + b"\x01"
_UNIQ_AT_START = PROPERTY_UNIQ_KEY.encode() + b"\x01"
_KEYS_INSIDE = b"\x02" + PROPERTY_KEYS.encode() + b"\x01"
_KEYS_AT_START = PROPERTY_KEYS.encode() + b"\x01"


def _value_range(buf, start: int, end: int, inside: bytes, at_start: bytes) -> tuple[int, int]:
    """(first, end) of the last property value named by the patterns, or (-1, -1)."""
    at = buf.rfind(inside, start - 1, end) if start > 0 else buf.rfind(inside, start, end)
    if at >= 0:
        at += len(inside)
    elif buf.find(at_start, start, min(start + len(at_start), end)) == start:
        at = start + len(at_start)
    else:
        return -1, -1
    value_end = buf.find(_SEPARATOR, at, end)
    return at, end if value_end < 0 else value_end


_POWERS = np.ones(1, dtype=np.uint32)


def _powers_of_31(n: int) -> np.ndarray:
    """31**i mod 2**32 for i < n (uint32)."""
    global _POWERS
    if len(_POWERS) < n:
        size = max(n, 2 * len(_POWERS), 64)
        powers = np.ones(size, dtype=np.uint64)
        for i in range(1, size):
            powers[i] = (int(powers[i - 1]) * 31) & 0xFFFFFFFF
        _POWERS = powers.astype(np.uint32)
    return _POWERS


def index_entries(columns: RecordColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """See `RecordColumns.index_keys`.  Key bytes are hashed with NumPy straight from the buffer
    (Java's hash over UTF-16 units equals one over bytes for ASCII); a record with a non-ASCII
    key or topic is hashed through Python strings."""
    buf = columns.buffer
    n = len(columns)
    empty = (np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not n:
        return empty
    indexed = (columns.sysflags & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK
    # one (row, first byte, end byte) per key, in order: UNIQ_KEY, then each KEYS entry
    rows: list[int] = []
    firsts: list[int] = []
    lasts: list[int] = []
    slow: list[tuple[int, str]] = []  # (row, key text) of rows hashed through Python strings
    slow_rows: set[int] = set()
    starts = columns.properties_starts.tolist()
    ends = columns.properties_ends.tolist()
    for i in np.flatnonzero(indexed).tolist():
        start, end = starts[i], ends[i]
        if start == end:
            continue
        u0, u1 = _value_range(buf, start, end, _UNIQ_INSIDE, _UNIQ_AT_START)
        k0, k1 = _value_range(buf, start, end, _KEYS_INSIDE, _KEYS_AT_START)
        if u1 > u0:
            rows.append(i)
            firsts.append(u0)
            lasts.append(u1)
        if k1 > k0:
            value = buf[k0:k1]
            if b" " not in value:
                rows.append(i)
                firsts.append(k0)
                lasts.append(k1)
            else:
                at = k0
                for part in value.split(b" "):
                    if part:
                        rows.append(i)
                        firsts.append(at)
                        lasts.append(at + len(part))
                    at += len(part) + 1
    if not rows:
        return empty
    row = np.array(rows, dtype=np.int64)
    first = np.array(firsts, dtype=np.int64)
    last = np.array(lasts, dtype=np.int64)
    lengths = last - first
    b = np.frombuffer(buf, dtype=np.uint8)
    try:
        # every key's bytes, back to back
        total = int(lengths.sum())
        key_ends = np.cumsum(lengths)
        key_starts = key_ends - lengths
        index = np.arange(total, dtype=np.int64) + np.repeat(first - key_starts, lengths)
        chars = b[index].astype(np.uint32)
    finally:
        del b
    ascii_key = np.ones(len(rows), dtype=bool)
    if (chars >= 0x80).any():
        ascii_key = np.logical_and.reduceat(chars < 0x80, key_starts) if total else ascii_key
    powers = _powers_of_31(int(lengths.max()) + 1)
    after = np.repeat(key_ends, lengths) - 1 - np.arange(total, dtype=np.int64)
    key_sums = np.add.reduceat(chars * powers[after], key_starts, dtype=np.uint32)
    # hash("topic#key") = hash("topic#") * 31**len(key) + hash(key), all mod 2**32
    names = columns.topic_names
    prefix = np.array([java_string_hash(t + "#") & 0xFFFFFFFF for t in names], dtype=np.uint32)
    topic_ids = columns.topic_ids[row]
    hashes = (prefix[topic_ids] * powers[lengths] + key_sums).astype(np.uint32)
    if not ascii_key.all() or any(not t.isascii() for t in names):
        topics_ascii = np.array([t.isascii() for t in names], dtype=bool)
        redo = np.flatnonzero(~ascii_key | ~topics_ascii[topic_ids])
        for k in redo.tolist():
            i = rows[k]
            text = bytes(buf[firsts[k] : lasts[k]]).decode("utf-8", "replace")
            hashes[k] = java_string_hash(f"{columns.topics[i]}#{text}") & 0xFFFFFFFF
    signed = hashes.view(np.int32).astype(np.int64)
    signed = np.abs(signed)
    signed[signed > INT_MAX] = 0  # abs(Integer.MIN_VALUE): RocketMQ keeps 0
    return signed.astype(np.int32), columns.offsets[row], columns.store_timestamps[row]
