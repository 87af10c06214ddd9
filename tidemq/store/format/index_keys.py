"""The key index's keys (RocketMQ 5.5.0's IndexService): which keys a record is indexed under, and
their hashes as an IndexFile stores them.  Pure functions."""

from __future__ import annotations

import numpy as np

from .record import java_string_hash

TAG_KEY_PREFIX = "T#"  # a record's tag is indexed as the key "T#tag" ("topic#T#tag")


def index_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def record_index_keys(unique_key: str | None, keys, tags: str | None) -> list[str]:
    """The keys a record is indexed under, in order (RocketMQ 5.5.0's IndexService): its
    UNIQ_KEY, each KEYS entry, then its tag as "T#tag"; empty values are skipped."""
    found = [unique_key] if unique_key else []
    found.extend(k for k in keys if k)
    if tags:
        found.append(TAG_KEY_PREFIX + tags)
    return found


# ---------------------------------------------------------------------------------------------
# Key hashes

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


def key_hash(text: str) -> int:
    """abs(Java hashCode) as IndexFile stores it; Integer.MIN_VALUE maps to 0.  Message keys
    are mostly unique: they bypass java_string_hash's cache, which is for tags."""
    h = java_string_hash.__wrapped__(text)
    return 0 if h == -0x80000000 else abs(h)


def key_hashes(texts: list[str]) -> np.ndarray:
    """`key_hash` of many strings at once (int32): NumPy for ASCII strings, one by one otherwise."""
    n = len(texts)
    out = np.zeros(n, dtype=np.int64)
    if not n:
        return out.astype(np.int32)
    ascii_positions = [i for i, t in enumerate(texts) if t and t.isascii()]
    if len(ascii_positions) != n:
        for i, t in enumerate(texts):
            if not (t and t.isascii()):
                out[i] = java_string_hash(t)
    if ascii_positions:
        chosen = texts if len(ascii_positions) == n else [texts[i] for i in ascii_positions]
        lengths = np.fromiter((len(t) for t in chosen), dtype=np.int64, count=len(chosen))
        chars = np.frombuffer("".join(chosen).encode("ascii"), dtype=np.uint8).astype(np.uint32)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        # weight of a character: 31 ** (characters after it in its string), all mod 2**32
        after = np.repeat(ends, lengths) - 1 - np.arange(len(chars), dtype=np.int64)
        products = chars * powers_of_31(int(lengths.max()))[after]
        sums = np.add.reduceat(products, starts, dtype=np.uint32)
        out[np.asarray(ascii_positions, dtype=np.int64)] = sums.view(np.int32)
    signed = out.astype(np.uint32).view(np.int32).astype(np.int64)
    signed = np.abs(signed)
    signed[signed > 0x7FFFFFFF] = 0  # abs(Integer.MIN_VALUE) is negative in Java: RocketMQ uses 0
    return signed.astype(np.int32)
