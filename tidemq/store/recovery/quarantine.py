"""Damaged records in the middle of the log: never delivered as intact, and set aside by repair.

A record whose body CRC (or whole-record CRC property) fails is not handed to readers: the
store's reads verify it, log its offset once, count it, and answer "no record" (the broker skips
it as it skips a record gone to retention).

`tidemq store repair` replaces such a record, when its size field still holds (the record after
it decodes), by a **placeholder** of the same size: the damaged record's queue identity (topic,
queue id, queue offset, store time) and tags, a property `TIDEMQ_DAMAGED`, and padding to fill
the size.  The log stays one valid chain, the queue keeps its slot, no valid record after it is
dropped, and the damaged bytes are kept under `{store}/repair/{offset}.damaged`.  Reads skip
placeholders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..format import record

DAMAGED_PROPERTY = "TIDEMQ_DAMAGED"  # reserved: a user property may not take this name
_MAX_PROPERTIES = 32767  # PROPLENGTH is a signed 16-bit field


def is_placeholder(rec: record.Record) -> bool:
    return DAMAGED_PROPERTY in rec.properties


def placeholder(damaged: bytes, offset: int) -> bytes | None:
    """A valid record of `len(damaged)` bytes standing for the damaged record at `offset`, or
    None if its header is unusable (then repair cuts the log there instead)."""
    fields = record.decode(damaged, 0, base_offset=offset, check_crc=False, read_body=False)
    if type(fields) is not record.Record:
        return None
    kept = {DAMAGED_PROPERTY: ""}  # and its tags, if they read: its consume-queue unit's tags code stays true
    if fields.properties.get("TAGS"):
        kept["TAGS"] = fields.properties["TAGS"]
    size = len(damaged)
    common: dict[str, Any] = dict(
        topic=fields.topic,
        queue_id=fields.queue_id,
        queue_offset=fields.queue_offset,
        commit_log_offset=offset,
        store_timestamp=fields.store_timestamp,
        born_timestamp=fields.born_timestamp,
        sysflag=fields.sysflag & ~record.FLAG_COMPRESSED,
    )
    try:
        common["born_host"], common["store_host"] = fields.born_host, fields.store_host
        bare = record.encode(body=b"", properties=kept, **common)
    except Exception:  # a header whose hosts or topic do not encode again
        return None
    room = size - len(bare)
    if room < 0:
        return None  # too small to say what it is
    # the room goes into the properties, past what their 16-bit length allows into the body
    pad = min(room, _MAX_PROPERTIES - len(record.encode_properties(kept)) - 8)
    properties = {**kept, "PAD": "x" * (pad - 5)} if pad >= 5 else kept
    body = b"\0" * (room - (pad if pad >= 5 else 0))
    encoded = record.encode(body=body, properties=properties, **common)
    return encoded if len(encoded) == size else None


def keep_damaged(store_dir: Path, offset: int, damaged: bytes) -> Path:
    repair_dir = Path(store_dir) / "repair"
    repair_dir.mkdir(exist_ok=True)
    path = repair_dir / f"{offset:020d}.damaged"
    path.write_bytes(damaged)
    return path
