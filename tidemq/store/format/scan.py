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

Two implementations fill the same columns: the compiled walk (`_dispatch.scan_into`), which
fills every column and the value ranges of TAGS, UNIQ_KEY and KEYS in one pass and, asked for
keys, hashes them into the key index's entries (Python then decodes each distinct topic once
and hashes only what is not ASCII); and the reference, one record at a time by the record
codec (`record.parse`, `record.decode_properties`), which runs where the extension is not
built.  Tests hold the two equal on Hypothesis inputs.

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
from .record import (
    HEADER_QUEUE_ID,
    HEADER_QUEUE_OFFSET,
    HEADER_STORE_TIMESTAMP,
    HEADER_SYSFLAG,
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_ROLLBACK,
    TRANSACTION_TYPE_MASK,
    RecordBuffer,
    decode_properties,
    decode_topic,
    parse,
    tags_code,
)
from .special_queues import PROPERTY_DELAY, SCHEDULE_TOPIC, queue_tags_code

_scan_into: Callable[..., tuple[Any, ...]] | None
try:
    from .._dispatch import scan_into as _scan_into
except ImportError:  # the extension is optional: where it is not built, the reference below runs
    _scan_into = None

# whether `scan` runs the compiled walk; tests switch it off to cross-check it with the reference
COMPILED = _scan_into is not None

MIN_RECORD_SIZE = 91  # v1, IPv4 hosts, empty body, topic and properties
HEADER_SIZE_V4 = 88  # TOTALSIZE .. BODYLEN with IPv4 hosts; each IPv6 host adds 12

_I32 = struct.Struct(">i")


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
    # the key index's entries as the compiled walk made them when asked for keys: (hashes as
    # int32 bytes, rows as int64 bytes, slow: (entry, row, first, last) of each key to hash from
    # its decoded text, its or its topic's bytes not all ASCII)
    key_entries: tuple[bytes, bytes, list] | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def topic(self, i: int) -> str:
        return self.topic_names[self.topic_ids[i]]

    def properties(self, i: int) -> dict[str, str]:
        """Row `i`'s properties, decoded as `record.decode` does."""
        return decode_properties(self.buffer[int(self.properties_starts[i]) : int(self.properties_ends[i])])

    def property(self, i: int, name: str) -> str | None:
        """One property of row `i` (the last one of that name, as a dict would keep)."""
        return self.properties(i).get(name)

    def unique_key(self, i: int) -> str | None:
        return self.property(i, PROPERTY_UNIQ_KEY)

    def keys(self, i: int) -> list[str]:
        raw = self.property(i, PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []

    def _index_keys_reference(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`index_keys` one record at a time from its decoded properties."""
        hashes: list[int] = []
        rows: list[int] = []
        indexed = (self.sysflags & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK
        for i in np.flatnonzero(indexed).tolist():
            topic = self.topic(i)
            for key in properties_index_keys(self.properties(i)):
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
        return self._index_keys_reference()


def properties_index_keys(properties: dict[str, str]) -> list[str]:
    """The keys the key index takes from a record with these (decoded) properties: its
    UNIQ_KEY, each KEYS entry, then its tag as "T#tag"."""
    keys = properties.get(PROPERTY_KEYS)
    return record_index_keys(
        properties.get(PROPERTY_UNIQ_KEY), keys.split(KEY_SEPARATOR) if keys else (), properties.get(PROPERTY_TAGS)
    )


def _empty(buf, base_offset: int, end: int) -> RecordColumns:
    i64 = np.zeros(0, np.int64)
    i32 = np.zeros(0, np.int32)
    return RecordColumns(buf, base_offset, end, i64, i64, i32, i32, i64, i32, i64, i64, i32, [], i64, i64)


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
    """`view`'s values at buffer positions (clipped into the view), as int64."""
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
    run on to `stop`).  With `keys` (a caller that will ask for `index_keys`), the compiled walk
    hashes the keys as it goes."""
    if isinstance(buf, (bytearray, memoryview)):
        buf = bytes(buf)  # slices must be hashable bytes; the hot path scans mmaps
    stop = min(stop, len(buf))
    soft_stop = stop if soft_stop is None else soft_stop
    if COMPILED:
        return _scan_compiled(buf, start, stop, base_offset, soft_stop, keys)
    return _scan_reference(buf, start, stop, base_offset, soft_stop)


def _scan_reference(buf, start: int, stop: int, base_offset: int, soft_stop: int) -> RecordColumns:
    """`scan` one record at a time by the record codec (`dispatch_fields`): the reference the
    compiled walk is tested against, and what runs where it is not built."""
    rows: list[tuple] = []
    end = start
    for pos in _walk(buf, start, stop, soft_stop):
        fields = dispatch_fields(buf, pos, base_offset)
        if fields is None:
            break
        size, queue_id, queue_offset, sysflag, store_timestamp, topic, properties, properties_at, end = fields
        rows.append(
            (
                pos,
                size,
                queue_id,
                queue_offset,
                sysflag,
                store_timestamp,
                tags_code(properties.get(PROPERTY_TAGS)),
                topic,
                properties_at,
                end,
            )
        )
    if not rows:
        return _empty(buf, base_offset, base_offset + start)
    positions, sizes, queue_ids, queue_offsets, sysflags, store_timestamps, codes, topics, starts, ends = map(
        list, zip(*rows)
    )
    names: dict[str, int] = {}
    topic_ids = [names.setdefault(t, len(names)) for t in topics]
    offsets = np.array(positions, dtype=np.int64)
    return RecordColumns(
        buffer=buf,
        base_offset=base_offset,
        end=base_offset + end,
        positions=offsets.copy(),
        offsets=offsets + base_offset,
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
    )


def _scan_compiled(buf, start: int, stop: int, base_offset: int, soft_stop: int, keys: bool = False) -> RecordColumns:
    """`scan` by the compiled walk (`_dispatch.scan_into`, which documents the columns it fills):
    every field and check in one pass, and with
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
    positions, queue_offsets, timestamps, codes, starts, ends = wide[:6, :count]
    sizes, queue_ids, sysflags, topic_ids, final_codes = narrow[:, :count]
    for k in np.flatnonzero(final_codes == 0).tolist():
        codes[k] = tags_code(decode_properties(buf[int(starts[k]) : int(ends[k])]).get(PROPERTY_TAGS))
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
        key_entries=entries,
    )


def walk(buf, start: int, stop: int, max_count: int) -> list[int]:
    """Positions of the first `max_count` records along the TOTALSIZE chain from `start` (a
    record boundary) that end at or before `stop` (sizes only; `dispatch_fields` checks each)."""
    return _walk(buf, start, stop, stop, max_count)


def dispatch_fields(buf, pos: int, base_offset: int) -> tuple | None:
    """The dispatch fields of the record at `pos` by the record codec (`record.parse`, then
    the topic and the properties decoded as `record.decode` decodes them): (size, queue_id,
    queue_offset, sysflag, store_timestamp, topic, properties, properties_at, record_end); None
    where `record.decode(..., check_crc=False)` finds no record."""
    layout = parse(buf, pos, base_offset)
    if type(layout) is not tuple:
        return None
    fields, _, topic_bytes, properties_at, record_end = layout
    try:
        topic = decode_topic(topic_bytes)
    except UnicodeDecodeError:
        return None  # record.decode calls this record Invalid
    return (
        fields[0],
        fields[HEADER_QUEUE_ID],
        fields[HEADER_QUEUE_OFFSET],
        fields[HEADER_SYSFLAG],
        fields[HEADER_STORE_TIMESTAMP],
        topic,
        decode_properties(buf[properties_at:record_end]),
        properties_at,
        record_end,
    )
