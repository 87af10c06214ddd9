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


def key_hash(text: str) -> int:
    """abs(Java hashCode) as IndexFile stores it; Integer.MIN_VALUE maps to 0.  Message keys
    are mostly unique: they bypass java_string_hash's cache, which is for tags."""
    h = java_string_hash.__wrapped__(text)
    return 0 if h == -0x80000000 else abs(h)


def key_hashes(texts: list[str]) -> np.ndarray:
    """`key_hash` of many strings (int32)."""
    return np.fromiter(map(key_hash, texts), dtype=np.int32, count=len(texts))
