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
    store_timestamps  i64   STORETIMESTAMP    at +56, or +68 after an IPv6 born host
    tags_codes        i64   Java hash of the TAGS property, 0 without one
    topic_ids         i32, equal ids for equal topics within a scan, and topic_names by id
    properties_starts / properties_ends: where each record's properties lie in the buffer,
                      decoded lazily (`properties`, `unique_key`, `keys`, `index_keys`)

Where the extension is built, one compiled pass (`_dispatch.scan_into`) fills every column and
the value ranges of TAGS, UNIQ_KEY and KEYS, and, asked for keys, hashes them into the key
index's entries.  Python then decodes each distinct topic once and hashes only what is not
ASCII.  (Keys asked of a scan that was not asked for them are hashed from the ranges by NumPy.)

Without it, only the walk along the chain (one 4-byte read per record) and the topic (a slice and
a cached decode) are per-record Python work; the fixed fields and every layout check are gathered with
NumPy from the record positions, and the TAGS codes and key-index hashes are computed in bulk
from the property bytes (`property_columns`).  Up to SMALL_SCAN records (a dispatch round at
light load) are decoded one at a time instead, into the same columns: there NumPy's fixed cost
per call would be most of the work.

The scan stops at the first position that does not hold a whole valid record ending at or
before `stop` (a blank, zeros, a torn or corrupt record, or a record running past `stop`):
`end` says where, and `record.decode` there gives the typed reason.  The checks are exactly
those of `record.decode(..., check_crc=False)` (PHYSICALOFFSET included); tests hold the two
to agreement.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .index_keys import TAG_KEY_PREFIX, index_key, key_hash, record_index_keys
from .property_columns import KEYS, LEGACY_UNIQ_KEY, TAGS, UNIQ_KEY, index_entries, tags_codes, unique_key_ranges
from .record import (
    KEY_SEPARATOR,
    LEGACY_PROPERTY_UNIQ_KEY,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_ROLLBACK,
    TRANSACTION_TYPE_MASK,
    RecordBuffer,
    decode_properties,
    decode_topic,
    tags_code,
)
from .special_queues import PROPERTY_DELAY, SCHEDULE_TOPIC, queue_tags_code

_scan_into: Callable[..., tuple[Any, ...]] | None
try:
    from .._dispatch import scan_into as _scan_into
except ImportError:  # the extension is optional: where it is not built, the NumPy walk below runs
    _scan_into = None

# whether `scan` runs the compiled walk; tests switch it off to cross-check the NumPy path
COMPILED = _scan_into is not None

MIN_RECORD_SIZE = 91  # v1, IPv4 hosts, empty body, topic and properties
HEADER_SIZE_V4 = 88  # TOTALSIZE .. BODYLEN with IPv4 hosts; each IPv6 host adds 12

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_FIXED = struct.Struct(">iiiiiqqi")  # TOTALSIZE .. SYSFLAG
# up to this many records, `scan` decodes one record at a time (NumPy's per-call cost would
# dominate); tests set it to 0 to cross-check the vectorized path on small inputs too
SMALL_SCAN = 16

_SEPARATOR = b"\x02"


@dataclass(slots=True)
class RecordColumns:
    """What `scan` found: one row per record, in log order."""

    buffer: RecordBuffer  # the scanned buffer, for lazy property reads
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
    topic_ids: np.ndarray  # i32: rows with equal topics have equal ids (within this scan)
    topic_names: list[str]  # topic_names[topic_ids[i]] is row i's topic
    properties_starts: np.ndarray
    properties_ends: np.ndarray
    # per row: [first, last) of the UNIQ_KEY and KEYS values, or -1 (found with the TAGS when
    # the scan was asked for keys, else on first use)
    unique_key_ranges: tuple[np.ndarray, np.ndarray] | None
    keys_ranges: tuple[np.ndarray, np.ndarray] | None
    # the key index's entries as the compiled walk made them when asked for keys: (hashes as
    # int32 bytes, rows as int64 bytes, slow: (entry, row, first, last) of each key to hash from
    # its decoded text, its or its topic's bytes not all ASCII)
    key_entries: tuple[bytes, bytes, list] | None = None
    # per row: [first, last) of the TAGS value, or -1 (for the key index's tag entries)
    tags_ranges: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def topic(self, i: int) -> str:
        return self.topic_names[self.topic_ids[i]]

    def properties(self, i: int) -> dict[str, str]:
        """Row `i`'s properties, decoded as `record.decode` does."""
        return decode_properties(self.buffer[int(self.properties_starts[i]) : int(self.properties_ends[i])])

    def property(self, i: int, name: str) -> str | None:
        """One property of row `i` (the last one of that name, as a dict would keep)."""
        return property_value(self.buffer, int(self.properties_starts[i]), int(self.properties_ends[i]), name)

    def unique_key(self, i: int) -> str | None:
        found = self.property(i, PROPERTY_UNIQ_KEY)
        return found if found is not None else self.property(i, LEGACY_PROPERTY_UNIQ_KEY)

    def keys(self, i: int) -> list[str]:
        raw = self.property(i, PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []

    def _index_keys_small(self, indexed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`index_keys` one record at a time (see SMALL_SCAN)."""
        hashes: list[int] = []
        rows: list[int] = []
        for i in np.flatnonzero(indexed).tolist():
            topic = self.topic(i)
            for key in index_keys_in(self.buffer, int(self.properties_starts[i]), int(self.properties_ends[i])):
                hashes.append(key_hash(index_key(topic, key)))
                rows.append(i)
        taken = np.array(rows, dtype=np.int64)
        return np.array(hashes, dtype=np.int32), self.offsets[taken], self.store_timestamps[taken]

    def _index_keys_compiled(self, key_entries: tuple[bytes, bytes, list]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`index_keys` from the entries the compiled walk made (a scan asked for keys); keys of
        non-ASCII text (or topic) are hashed here from the decoded text."""
        raw_hashes, raw_rows, slow = key_entries
        hashes = np.frombuffer(raw_hashes, dtype=np.int32)
        rows = np.frombuffer(raw_rows, dtype=np.int64)
        if slow:
            hashes = hashes.copy()
            for entry, row, first, last in slow:
                prefix = ""
                if last < 0:  # a tag's entry (see _dispatch.scan_into)
                    prefix, last = TAG_KEY_PREFIX, -1 - last
                text = bytes(self.buffer[first:last]).decode("utf-8", "replace")
                hashes[entry] = key_hash(index_key(self.topic(row), prefix + text))
        return hashes, self.offsets[rows], self.store_timestamps[rows]

    def index_keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The key index's entries for these rows, in order: (abs Java hash of "topic#key" as
        IndexFile keeps it, commit-log offset, store timestamp) for the UNIQ_KEY, each KEYS entry
        and the tag ("T#tag") of every record that is not a ROLLBACK."""
        if not len(self):
            return np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.key_entries is not None:
            return self._index_keys_compiled(self.key_entries)
        indexed = (self.sysflags & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK
        if len(self) <= SMALL_SCAN:
            return self._index_keys_small(indexed)
        b = np.frombuffer(self.buffer, dtype=np.uint8)
        try:
            unique, keys = self.unique_key_ranges, self.keys_ranges  # found together
            if unique is None or keys is None:
                unique, keys = unique_key_ranges(b, self.properties_starts, self.properties_ends, [UNIQ_KEY, KEYS])
                self.unique_key_ranges, self.keys_ranges = unique, keys
            tags = self.tags_ranges
            if tags is None:
                (tags,) = unique_key_ranges(b, self.properties_starts, self.properties_ends, [TAGS])
                self.tags_ranges = tags
            return index_entries(
                self.buffer,
                b,
                unique,
                keys,
                tags,
                indexed,
                self.topic_ids,
                self.topic_names,
                self.offsets,
                self.store_timestamps,
            )
        finally:
            del b  # release the buffer export: the mapping may be closed


def _empty(buf, base_offset: int, end: int) -> RecordColumns:
    i64 = np.zeros(0, np.int64)
    i32 = np.zeros(0, np.int32)
    return RecordColumns(
        buf, base_offset, end, i64, i64, i32, i32, i64, i32, i64, i64, i32, [], i64, i64, (i64, i64), (i64, i64)
    )


def field_view(buf, dtype: str, start: int, stop: int) -> np.ndarray:
    """Values of `dtype` starting at every byte position in [start, stop - itemsize] of `buf`
    (overlapping, stride 1): `field_view(...)[p - start]` reads the field at p."""
    size = np.dtype(dtype).itemsize
    return np.ndarray(shape=(max(stop - start - size + 1, 0),), dtype=dtype, buffer=buf, offset=start, strides=(1,))


def header_sizes(sysflags: np.ndarray) -> np.ndarray:
    """Each record's bytes from TOTALSIZE through BODYLEN (its body starts there), from its
    SYSFLAG: an IPv6 born or store host adds 12 to the IPv4 header."""
    return HEADER_SIZE_V4 + 12 * ((sysflags & 0x10) != 0) + 12 * ((sysflags & 0x20) != 0)


def field_at(view: np.ndarray, positions: np.ndarray, start: int) -> np.ndarray:
    """`view`'s values at buffer positions (clipped into the view: rows that read outside are
    invalid anyway and masked by the caller), as int64."""
    return view[np.clip(positions - start, 0, len(view) - 1)].astype(np.int64)


def _walk(buf, pos: int, stop: int, soft_stop: int, max_count: int = -1) -> list[int]:
    """Record positions along the TOTALSIZE chain from `pos`: each record at least the minimum
    size and ending at or before `stop`; no record starts at or past `soft_stop`; at most
    `max_count` of them if it is not negative."""
    unpack = _I32.unpack_from
    positions: list[int] = []
    append = positions.append
    limit = min(stop - MIN_RECORD_SIZE + 1, soft_stop)
    while pos < limit and max_count != len(positions):
        size = unpack(buf, pos)[0]
        if size < MIN_RECORD_SIZE or pos + size > stop:
            break
        append(pos)
        pos += size
    return positions


def scan(
    buf, start: int, stop: int, base_offset: int = 0, soft_stop: int | None = None, keys: bool = False
) -> RecordColumns:
    """`_scan` (below), with the tags codes of delay-level records' units set to their due
    times (`special_queues.queue_tags_code`)."""
    columns = _scan(buf, start, stop, base_offset, soft_stop, keys)
    if SCHEDULE_TOPIC in columns.topic_names:
        schedule_id = columns.topic_names.index(SCHEDULE_TOPIC)
        codes = columns.tags_codes
        for i in np.flatnonzero(columns.topic_ids == schedule_id).tolist():
            level = columns.property(i, PROPERTY_DELAY)
            codes[i] = queue_tags_code(SCHEDULE_TOPIC, level, int(columns.store_timestamps[i]), int(codes[i]))
    return columns


def _scan(
    buf, start: int, stop: int, base_offset: int = 0, soft_stop: int | None = None, keys: bool = False
) -> RecordColumns:
    """Decode the dispatch fields of every whole valid record in `buf[start:stop]`, following
    the chain from `start` (a record boundary).  `base_offset` is the commit-log offset of
    `buf[0]`.  With `soft_stop`, no record starting at or past it is taken (records may still
    run on to `stop`).  With `keys`, the UNIQ_KEY and KEYS values are located with the TAGS (for
    a caller that will ask for `index_keys`), and the compiled walk hashes them as it goes."""
    if isinstance(buf, (bytearray, memoryview)):
        buf = bytes(buf)  # slices must be hashable bytes; the hot path scans mmaps
    stop = min(stop, len(buf))
    if COMPILED:
        return _scan_compiled(buf, start, stop, base_offset, stop if soft_stop is None else soft_stop, keys)
    positions = _walk(buf, start, stop, stop if soft_stop is None else soft_stop)
    if not positions:
        return _empty(buf, base_offset, base_offset + start)
    if len(positions) <= SMALL_SCAN:
        return _scan_small(buf, positions, base_offset)
    pos = np.array(positions, dtype=np.int64)
    # views from the first record on: every field lies below `stop`
    lo = positions[0]
    i8, i4, i2, u1 = (field_view(buf, t, lo, stop) for t in (">i8", ">i4", ">i2", "u1"))
    try:
        sizes = field_at(i4, pos, lo)
        magic = field_at(i4, pos + 4, lo)
        sysflags = field_at(i4, pos + 36, lo)
        ends = pos + sizes
        born_v6 = (sysflags & 0x10) != 0
        header_size = header_sizes(sysflags)
        body_lengths = field_at(i4, pos + header_size - 4, lo)
        v2 = magic == MESSAGE_MAGIC_CODE_V2
        topic_length_at = pos + header_size + body_lengths
        topic_lengths = np.where(v2, field_at(i2, topic_length_at, lo), field_at(u1, topic_length_at, lo))
        topic_at = topic_length_at + 1 + v2
        properties_at = topic_at + topic_lengths + 2
        properties_lengths = field_at(i2, properties_at - 2, lo)
        ok = (
            ((magic == MESSAGE_MAGIC_CODE) | v2)
            & (body_lengths >= 0)
            & (topic_length_at + 1 + v2 <= ends)
            & (topic_lengths >= 0)
            & (properties_at <= ends)
            & (properties_lengths >= 0)
            & (properties_at + properties_lengths == ends)
            & (field_at(i8, pos + 28, lo) == pos + base_offset)
        )
        count = len(positions) if ok.all() else int(np.argmin(ok))
        pos = pos[:count]
        queue_ids = i4[pos + (12 - lo)].astype(np.int32)
        queue_offsets = i8[pos + (20 - lo)].astype(np.int64)
        store_timestamps = i8[pos + (56 - lo) + 12 * born_v6[:count]].astype(np.int64)
    finally:
        del i8, i4, i2, u1  # release the buffer exports: the caller may close the mapping
    # per-record work: the topic
    topic_ids: list[int] = []
    names: dict[str, int] = {}
    for i, (t0, t1) in enumerate(zip(topic_at[:count].tolist(), (properties_at[:count] - 2).tolist())):
        try:
            topic = decode_topic(buf[t0:t1])
        except UnicodeDecodeError:
            count = i  # record.decode calls this record Invalid
            break
        tid = names.get(topic)
        if tid is None:
            tid = names[topic] = len(names)
        topic_ids.append(tid)
    b = np.frombuffer(buf, dtype=np.uint8)
    try:
        ranges = unique_key_ranges(b, properties_at[:count], ends[:count], [TAGS, UNIQ_KEY, KEYS] if keys else [TAGS])
        codes = tags_codes(buf, b, *ranges[0])
    finally:
        del b
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
        tags_codes=codes,
        topic_ids=np.array(topic_ids, dtype=np.int32),
        topic_names=list(names),
        properties_starts=properties_at[:count],
        properties_ends=ends[:count],
        unique_key_ranges=ranges[1] if keys else None,
        keys_ranges=ranges[2] if keys else None,
        tags_ranges=ranges[0],
    )


def _scan_compiled(buf, start: int, stop: int, base_offset: int, soft_stop: int, keys: bool = False) -> RecordColumns:
    """`scan` by the compiled walk (`_dispatch.scan_into`, which documents the columns it fills):
    every field and check in one pass, the value ranges of UNIQ_KEY and KEYS included, and with
    `keys` the key index's entries (hashed as each record is read, while its properties are in
    cache, not in a second pass).
    Python decodes each distinct topic once and hashes the few TAGS values that are not ASCII."""
    limit = min(stop - MIN_RECORD_SIZE + 1, soft_stop)
    capacity = (limit - start + MIN_RECORD_SIZE - 1) // MIN_RECORD_SIZE  # records that can start before limit
    if capacity <= 0:
        return _empty(buf, base_offset, base_offset + start)
    wide = np.empty((10, capacity), np.int64)
    narrow = np.empty((5, capacity), np.int32)
    assert _scan_into is not None  # called where COMPILED
    walked = _scan_into(buf, start, stop, soft_stop, base_offset, wide, narrow, keys)
    count, end, raw_topics = walked[:3]
    names: list[str] = []
    for raw in raw_topics:
        try:
            names.append(decode_topic(raw))
        except UnicodeDecodeError:  # record.decode calls its first record Invalid: stop there
            count = int(np.argmax(narrow[3, :count] == len(names)))
            end = int(wide[0, count])
            break
    if not count:
        return _empty(buf, base_offset, base_offset + start)
    entries = walked[3] if keys else None
    if entries is not None and count < walked[0]:  # the rows were cut: so are their entries
        raw_hashes, raw_rows, slow = entries
        kept = int(np.searchsorted(np.frombuffer(raw_rows, dtype=np.int64), count))
        entries = raw_hashes[: 4 * kept], raw_rows[: 8 * kept], [item for item in slow if item[0] < kept]
    positions, queue_offsets, timestamps, codes, starts, ends, uniq_first, uniq_last, keys_first, keys_last = wide[
        :, :count
    ]
    sizes, queue_ids, sysflags, topic_ids, final_codes = narrow[:, :count]
    for k in np.flatnonzero(final_codes == 0).tolist():
        codes[k] = tags_code(property_value(buf, int(starts[k]), int(ends[k]), PROPERTY_TAGS))
    return RecordColumns(
        buffer=buf,
        base_offset=base_offset,
        end=base_offset + end,
        positions=positions,
        offsets=positions + base_offset,
        sizes=sizes,
        queue_ids=queue_ids,
        queue_offsets=queue_offsets,
        sysflags=sysflags,
        store_timestamps=timestamps,
        tags_codes=codes,
        topic_ids=topic_ids,
        topic_names=names,
        properties_starts=starts,
        properties_ends=ends,
        unique_key_ranges=(uniq_first, uniq_last),
        keys_ranges=(keys_first, keys_last),
        key_entries=entries,
    )


def walk(buf, start: int, stop: int, max_count: int) -> list[int]:
    """Positions of the first `max_count` records along the TOTALSIZE chain from `start` (a
    record boundary) that end at or before `stop` (sizes only; `decode_one` checks each)."""
    return _walk(buf, start, stop, stop, max_count)


def decode_one(buf, pos: int, base_offset: int) -> tuple | None:
    """The dispatch fields of the record at `pos`, one record in plain Python (for a few
    records, where NumPy's fixed cost per call would be most of the work): (size, queue_id,
    queue_offset, sysflag, store_timestamp, topic, properties_at, record_end); None if it fails
    `scan`'s checks (the same checks, PHYSICALOFFSET included)."""
    size, magic, _, queue_id, _, queue_offset, physical_offset, sysflag = _FIXED.unpack_from(buf, pos)
    record_end = pos + size
    header_size = HEADER_SIZE_V4 + (12 if sysflag & 0x10 else 0) + (12 if sysflag & 0x20 else 0)
    v2 = magic == MESSAGE_MAGIC_CODE_V2
    if not (v2 or magic == MESSAGE_MAGIC_CODE) or header_size + 3 > size or physical_offset != pos + base_offset:
        return None
    body_length = _I32.unpack_from(buf, pos + header_size - 4)[0]
    topic_length_at = pos + header_size + body_length
    if body_length < 0 or topic_length_at + 1 + v2 > record_end:
        return None
    topic_length = _I16.unpack_from(buf, topic_length_at)[0] if v2 else buf[topic_length_at]
    topic_at = topic_length_at + 1 + v2
    properties_at = topic_at + topic_length + 2
    if topic_length < 0 or properties_at > record_end:
        return None
    properties_length = _I16.unpack_from(buf, properties_at - 2)[0]
    if properties_length < 0 or properties_at + properties_length != record_end:
        return None
    try:
        topic = decode_topic(buf[topic_at : topic_at + topic_length])
    except UnicodeDecodeError:
        return None  # record.decode calls this record Invalid
    store_timestamp = _I64.unpack_from(buf, pos + (68 if sysflag & 0x10 else 56))[0]
    return size, queue_id, queue_offset, sysflag, store_timestamp, topic, properties_at, record_end


def _scan_small(buf, positions: list[int], base_offset: int) -> RecordColumns:
    """`scan` for a few records, one at a time in Python (`decode_one`): a dispatch round of one
    record is the common case at light load.  Same checks, same columns."""
    rows: list[tuple] = []
    end = positions[0]
    for pos in positions:
        fields = decode_one(buf, pos, base_offset)
        if fields is None:
            break
        size, queue_id, queue_offset, sysflag, store_timestamp, topic, properties_at, record_end = fields
        tags = property_value(buf, properties_at, record_end, PROPERTY_TAGS)
        rows.append(
            (
                pos,
                size,
                queue_id,
                queue_offset,
                sysflag,
                store_timestamp,
                tags_code(tags),
                topic,
                properties_at,
                record_end,
            )
        )
        end = record_end
    if not rows:
        return _empty(buf, base_offset, base_offset + positions[0])
    pos_, sizes, queue_ids, queue_offsets, sysflags, store_timestamps, codes, topics, starts, ends = map(
        list, zip(*rows)
    )
    names: dict[str, int] = {}
    topic_ids = [names.setdefault(t, len(names)) for t in topics]
    return RecordColumns(  # no key ranges: `_index_keys_small` reads the keys per record
        buffer=buf,
        base_offset=base_offset,
        end=base_offset + end,
        positions=np.array(pos_, dtype=np.int64),
        offsets=np.array(pos_, dtype=np.int64) + base_offset,
        sizes=np.array(sizes, dtype=np.int32),
        queue_ids=np.array(queue_ids, dtype=np.int32),
        queue_offsets=np.array(queue_offsets, dtype=np.int64),
        sysflags=np.array(sysflags, dtype=np.int32),
        store_timestamps=np.array(store_timestamps, dtype=np.int64),
        tags_codes=np.array(codes, dtype=np.int64),
        topic_ids=np.array(topic_ids, dtype=np.int32),
        topic_names=list(names),
        properties_starts=np.array(starts, dtype=np.int64),
        properties_ends=np.array(ends, dtype=np.int64),
        unique_key_ranges=None,
        keys_ranges=None,
    )


def property_range(buf, start: int, end: int, name: str) -> tuple[int, int]:
    """[first, last) of the value of property `name` in `buf[start:end]` (the last segment of
    that name, as `record.decode_properties` keeps it), or (-1, -1)."""
    key = name.encode("utf-8")
    inside = b"\x02" + key + b"\x01"
    at = buf.rfind(inside, start - 1, end)  # start >= 91: a match at start - 1 begins a segment at start
    if at >= 0:
        at += len(inside)
    elif buf.find(key + b"\x01", start, min(start + len(key) + 1, end)) == start:
        at = start + len(key) + 1
    else:
        return -1, -1
    value_end = buf.find(_SEPARATOR, at, end)
    return at, end if value_end < 0 else value_end


def index_keys_in(buf, start: int, end: int) -> list[str]:
    """The keys the key index takes from a record whose properties are `buf[start:end]`: its
    UNIQ_KEY, each KEYS entry, then its tag as "T#tag"."""
    return index_keys_of(properties_in(buf, start, end))


def properties_in(buf, start: int, end: int) -> dict[bytes, bytes]:
    """Every property in `buf[start:end]`, raw name -> raw value, the last segment of a name
    winning: for each name what `property_range` finds, in one pass (to read several: the
    trickle takes TAGS, UNIQ_KEY and KEYS of each record)."""
    found = {}
    for segment in buf[start:end].split(_SEPARATOR):
        name, separator, value = segment.partition(b"\x01")
        if separator:
            found[name] = value
    return found


def text_of(properties: dict[bytes, bytes], name: bytes) -> str | None:
    """A value of `properties_in` decoded as `property_value` decodes it, or None."""
    value = properties.get(name)
    return None if value is None else value.decode("utf-8", "replace")


def index_keys_of(properties: dict[bytes, bytes]) -> list[str]:
    """`index_keys_in` of a record whose properties `properties_in` read."""
    unique_key = text_of(properties, UNIQ_KEY if UNIQ_KEY in properties else LEGACY_UNIQ_KEY)
    keys = text_of(properties, KEYS)
    return record_index_keys(unique_key, keys.split(KEY_SEPARATOR) if keys else (), text_of(properties, TAGS))


def property_value(buf, start: int, end: int, name: str) -> str | None:
    """The value of property `name` in `buf[start:end]` as `record.decode_properties` would give
    it (undecodable bytes replaced), or None."""
    first, last = property_range(buf, start, end, name)
    return None if first < 0 else bytes(buf[first:last]).decode("utf-8", "replace")
