"""Property values of many records at once, for dispatch: the TAGS code of every record and the
key index's (hash of "topic#key") entries, found with NumPy in the records' property bytes.

Properties are `name \\x01 value \\x02 ...` (spec §1).  `record.decode_properties` splits the
decoded text on \\x02, takes the name up to the first \\x01 and keeps the last value of a name.
Both separators are ASCII, and a UTF-8 decoder (even replacing bad bytes) never joins an ASCII
byte to its neighbours, so the same split done on the bytes finds the same segments; a name is
compared byte for byte (TAGS, KEYS and UNIQ_KEY are ASCII: no other bytes decode to them).

Java's `String.hashCode` over UTF-16 units equals the same sum over bytes when every byte is
ASCII; values or topics with other bytes are decoded and hashed in Python, one by one.
"""

from __future__ import annotations

import numpy as np

from .record import LEGACY_PROPERTY_UNIQ_KEY, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, java_string_hash

INT_MAX = 0x7FFFFFFF
TAGS = PROPERTY_TAGS.encode()
KEYS = PROPERTY_KEYS.encode()
UNIQ_KEY = PROPERTY_UNIQ_KEY.encode()
LEGACY_UNIQ_KEY = LEGACY_PROPERTY_UNIQ_KEY.encode()

_POWERS = np.ones(1, dtype=np.uint32)


def powers_of_31(n: int) -> np.ndarray:
    """31**i mod 2**32 for i < n (uint32)."""
    global _POWERS
    if len(_POWERS) < n:
        size = max(n, 2 * len(_POWERS), 64)
        values = [1] * size
        for i in range(1, size):
            values[i] = (values[i - 1] * 31) & 0xFFFFFFFF
        _POWERS = np.array(values, dtype=np.uint32)
    return _POWERS


def _gather(b: np.ndarray, firsts: np.ndarray, lasts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bytes of every range [first, last), back to back, with where each one starts and ends
    in the result."""
    lengths = lasts - firsts
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    index = np.arange(total, dtype=np.int64) + np.repeat(firsts - starts, lengths)
    return b[index], starts, ends


def _next(positions: np.ndarray, at: np.ndarray, default: int) -> np.ndarray:
    """For each of `at`: the first of the sorted `positions` at or after it, else `default`."""
    if not len(positions):
        return np.full(len(at), default, dtype=np.int64)
    after = np.searchsorted(positions, at)
    return np.where(after < len(positions), positions[np.minimum(after, len(positions) - 1)], default)


def property_ranges(
    b: np.ndarray, starts: np.ndarray, ends: np.ndarray, names: list[bytes]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each name: per record, the [first, last) buffer range of its value (the last property
    of that name, as a dict keeps it), or (-1, -1).  `starts`/`ends`: each record's properties,
    in increasing buffer order.  The separators are found in one pass over the buffer span the
    records cover (bodies included: a compare is cheaper than gathering the properties)."""
    n = len(starts)
    out = [(np.full(n, -1, np.int64), np.full(n, -1, np.int64)) for _ in names]
    keep = np.flatnonzero(ends > starts)
    if not len(keep):
        return out
    starts, ends = starts[keep], ends[keep]
    low = int(starts[0])
    span = b[low : int(ends[-1])]
    # separators anywhere in the span: one in a body or header only makes a segment that ends
    # before it starts (clipped to its record's properties), which names nothing
    seconds = np.flatnonzero(span == 2) + low
    firsts = np.flatnonzero(span == 1) + low
    # a segment starts where a record's properties do and after each \x02
    # (two sorted runs: a stable sort merges them; a start doubled by a \x02 before it is harmless)
    segments = np.sort(np.concatenate([starts, seconds + 1]), kind="stable")
    record_of = np.searchsorted(starts, segments, side="right") - 1
    big = int(ends[-1]) + 1
    segment_ends = np.minimum(_next(seconds, segments, big), ends[record_of])
    name_ends = _next(firsts, segments, big)
    has_name = (name_ends < segment_ends) & (segments < segment_ends)
    for (value_firsts, value_lasts), name in zip(out, names):
        width = len(name)
        candidates = np.flatnonzero(has_name & (name_ends - segments == width))
        if not len(candidates):
            continue
        text = b[segments[candidates][:, None] + np.arange(width)].view(f"V{width}").ravel()
        match = candidates[text == np.void(name)]
        if not len(match):
            continue
        records = record_of[match]
        last = np.ones(len(match), dtype=bool)
        last[:-1] = records[1:] != records[:-1]  # segments are in order: keep each record's last
        match, records = match[last], records[last]
        rows = keep[records]
        value_firsts[rows] = name_ends[match] + 1
        value_lasts[rows] = segment_ends[match]
    return out


def unique_key_ranges(
    b: np.ndarray, starts: np.ndarray, ends: np.ndarray, names: list[bytes]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`property_ranges` where UNIQ_KEY in `names` is read as `record.decode_properties` reads
    it: the legacy-named value for a record without a UNIQ_KEY."""
    if UNIQ_KEY not in names:
        return property_ranges(b, starts, ends, names)
    ranges = property_ranges(b, starts, ends, [*names, LEGACY_UNIQ_KEY])
    legacy_firsts, legacy_lasts = ranges.pop()
    if (legacy_firsts >= 0).any():
        firsts, lasts = ranges[names.index(UNIQ_KEY)]
        missing = firsts < 0
        firsts[missing], lasts[missing] = legacy_firsts[missing], legacy_lasts[missing]
    return ranges


def range_hashes(b: np.ndarray, firsts: np.ndarray, lasts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Java hash (uint32) of the bytes of each non-empty range as ASCII text, whether the range
    is all ASCII (else the hash is meaningless), and each range's length."""
    chars, starts, ends = _gather(b, firsts, lasts)
    lengths = ends - starts
    if not len(chars):
        return np.zeros(len(firsts), np.uint32), np.ones(len(firsts), bool), lengths
    wide = chars.astype(np.uint32)
    powers = powers_of_31(int(lengths.max()) + 1)
    weights = powers[np.repeat(ends, lengths) - 1 - np.arange(len(chars), dtype=np.int64)]
    hashes = np.add.reduceat(wide * weights, starts, dtype=np.uint32)
    ascii_ranges = np.ones(len(firsts), dtype=bool)
    if (chars >= 0x80).any():
        ascii_ranges = np.logical_and.reduceat(chars < 0x80, starts)
    return hashes, ascii_ranges, lengths


def _decoded(buf, first: int, last: int) -> str:
    return bytes(buf[first:last]).decode("utf-8", "replace")


def tags_codes(buf, b: np.ndarray, firsts: np.ndarray, lasts: np.ndarray) -> np.ndarray:
    """Per record: Java hash of its TAGS value (range [first, last), -1 if none), sign-extended
    (the ConsumeQueue tags code); 0 without TAGS or with an empty one."""
    codes = np.zeros(len(firsts), dtype=np.int64)
    rows = np.flatnonzero(lasts > firsts)
    if not len(rows):
        return codes
    hashes, ascii_ranges, _ = range_hashes(b, firsts[rows], lasts[rows])
    codes[rows] = hashes.view(np.int32)
    for k in np.flatnonzero(~ascii_ranges).tolist():
        text = _decoded(buf, int(firsts[rows[k]]), int(lasts[rows[k]]))
        codes[rows[k]] = java_string_hash(text) if text else 0
    return codes


def index_entries(
    buf,
    b: np.ndarray,
    uniq: tuple[np.ndarray, np.ndarray],
    keys: tuple[np.ndarray, np.ndarray],
    tags: tuple[np.ndarray, np.ndarray],
    indexed: np.ndarray,
    topic_ids: np.ndarray,
    topic_names: list[str],
    offsets: np.ndarray,
    timestamps: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The key index's entries of the records where `indexed`, in order: (abs Java hash of
    "topic#key" as IndexFile keeps it, commit-log offset, store time) for the UNIQ_KEY, each
    non-empty space-separated KEYS entry, then the non-empty TAGS value as "T#tag" (`uniq`,
    `keys`, `tags`: the value ranges per record)."""
    (uniq_firsts, uniq_lasts), (keys_firsts, keys_lasts), (tags_firsts, tags_lasts) = uniq, keys, tags
    # every key as a byte range, tagged with its record and its order within the record
    uniq_rows = np.flatnonzero(indexed & (uniq_lasts > uniq_firsts))
    keys_rows = np.flatnonzero(indexed & (keys_lasts > keys_firsts))
    token_rows = np.zeros(0, np.int64)
    token_firsts = token_lasts = token_rows
    if len(keys_rows):
        chars, cat_starts, cat_ends = _gather(b, keys_firsts[keys_rows], keys_lasts[keys_rows])
        word = chars != 0x20
        # a token starts at a non-space that begins a value or follows a space; ends likewise
        begins = word.copy()
        begins[1:] &= ~word[:-1]
        begins[cat_starts] = word[cat_starts]
        stops = word.copy()
        stops[:-1] &= ~word[1:]
        stops[cat_ends - 1] = word[cat_ends - 1]
        token_starts = np.flatnonzero(begins)
        token_stops = np.flatnonzero(stops) + 1
        owner = np.searchsorted(cat_starts, token_starts, side="right") - 1
        shift = keys_firsts[keys_rows] - cat_starts
        token_rows = keys_rows[owner]
        token_firsts = token_starts + shift[owner]
        token_lasts = token_stops + shift[owner]
    tag_rows = np.flatnonzero(indexed & (tags_lasts > tags_firsts))
    rows = np.concatenate([uniq_rows, token_rows, tag_rows])
    if not len(rows):
        return np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)
    firsts = np.concatenate([uniq_firsts[uniq_rows], token_firsts, tags_firsts[tag_rows]])
    lasts = np.concatenate([uniq_lasts[uniq_rows], token_lasts, tags_lasts[tag_rows]])
    is_tag = np.zeros(len(rows), dtype=bool)
    is_tag[len(rows) - len(tag_rows) :] = True
    # record order; within a record UNIQ_KEY, the KEYS entries in their order, then the tag
    order = np.lexsort((np.arange(len(rows)), rows))
    rows, firsts, lasts, is_tag = rows[order], firsts[order], lasts[order], is_tag[order]
    key_sums, ascii_keys, lengths = range_hashes(b, firsts, lasts)
    # hash("topic#key") = hash("topic#") * 31**len(key) + hash(key), all mod 2**32; a tag's key
    # "topic#T#tag" has the prefix "topic#T#"
    prefix = np.array([java_string_hash(t + "#") & 0xFFFFFFFF for t in topic_names], dtype=np.uint32)
    tag_prefix = np.array([java_string_hash(t + "#T#") & 0xFFFFFFFF for t in topic_names], dtype=np.uint32)
    ids = topic_ids[rows]
    hashes = np.where(is_tag, tag_prefix[ids], prefix[ids]) * powers_of_31(int(lengths.max()) + 1)[lengths] + key_sums
    ascii_topics = np.array([t.isascii() for t in topic_names], dtype=bool)
    for k in np.flatnonzero(~(ascii_keys & ascii_topics[ids])).tolist():
        text = _decoded(buf, int(firsts[k]), int(lasts[k]))
        key = f"T#{text}" if is_tag[k] else text
        hashes[k] = java_string_hash(f"{topic_names[ids[k]]}#{key}") & 0xFFFFFFFF
    signed = np.abs(hashes.view(np.int32).astype(np.int64))
    signed[signed > INT_MAX] = 0  # abs(Integer.MIN_VALUE) stays negative in Java: RocketMQ uses 0
    return signed.astype(np.int32), offsets[rows], timestamps[rows]
