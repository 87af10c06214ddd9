"""Dispatch of a trickle: the few records of a light stream of sends, built straight into the
ConsumeQueues and the key index on the dispatching thread, one record at a time.

At light load a dispatch round holds one to a few dozen records.  Through the batch path
(columnar `scan`, `BatchBuilder`, `QueueRuns`, the commit of runs, the index append) such a round
is dozens of NumPy and pipeline calls with fixed costs, and the dispatch thread runs it with
cold caches after sleeping between rounds; one record at a time costs less up to MAX_RECORDS.

`dispatch_trickle` takes the records from `begin` while each passes `scan`'s checks
(`scan.dispatch_fields`) and ends at or before `stop`, and the blank that closes the segment after
them; it stops at anything else (damage, a record not yet whole) and leaves it to the batch
path, which reports it.  More than MAX_RECORDS whole records below `stop` are a batch: it takes
none of them.  Each record's unit is written at its slot and committed (`ConsumeQueue.put`), and
its key-index entries (UNIQ_KEY, then each KEYS entry; none for a ROLLBACK) are appended after
the others, so the files are those the batch path writes.  The caller guarantees that nothing
before `begin` is still being built.
"""

from __future__ import annotations

from collections.abc import Callable

from ..format import record
from ..format.index_keys import index_key, key_hash
from ..format.scan import dispatch_fields, properties_index_keys, walk
from ..format.special_queues import PROPERTY_DELAY, SCHEDULE_TOPIC, queue_tags_code
from ..queues.consume_queue import ConsumeQueue
from .requests import QueueKey

MAX_RECORDS = 32  # more is a batch: past this a round costs the batch path no more than a trickle
MAX_BYTES = 64 << 10  # a larger backlog is not looked at (it holds more than MAX_RECORDS records)


def dispatch_trickle(
    buf,
    base_offset: int,
    begin: int,
    stop: int,
    queue_at: Callable[[QueueKey, int], ConsumeQueue],
    key_index,
    changes: dict[QueueKey, int],
) -> tuple[int, int, int]:
    """Dispatch the records of `buf` (a segment's mapping, `base_offset` its first byte's
    commit-log offset) from commit-log offset `begin` up to `stop` as described above.
    `queue_at(key, slot)` gives the queue of `key`, started at `slot` if it has no files yet.
    Queues whose frontier moved are put in `changes`.  Returns (commit-log offset where it
    stopped, records dispatched, store time of the last one, 0 if none).  `buf` must be the
    whole segment (the blank that closes it ends at its end)."""
    end = begin
    count = 0
    last_timestamp = 0
    hashes: list[int] = []
    phys: list[int] = []
    times: list[int] = []
    positions = walk(buf, begin - base_offset, stop - base_offset, MAX_RECORDS + 1)
    if len(positions) > MAX_RECORDS:
        return begin, 0, 0
    for pos in positions:
        fields = dispatch_fields(buf, pos, base_offset)
        if fields is None:
            break
        size, queue_id, queue_offset, sysflag, store_timestamp, topic, properties, _, record_end = fields
        offset = base_offset + pos
        kind = sysflag & record.TRANSACTION_TYPE_MASK
        if kind in record.QUEUE_ENTRY_KINDS:
            key = (topic, queue_id)
            cq = queue_at(key, queue_offset)
            code = record.tags_code(properties.get(record.PROPERTY_TAGS))
            if topic == SCHEDULE_TOPIC:
                code = queue_tags_code(topic, properties.get(PROPERTY_DELAY), store_timestamp, code)
            if cq.put(queue_offset, offset, size, code):
                changes[key] = cq.commit_frontier
        if key_index is not None and kind != record.TRANSACTION_ROLLBACK:
            for k in properties_index_keys(properties):
                hashes.append(key_hash(index_key(topic, k)))
                phys.append(offset)
                times.append(store_timestamp)
        end = base_offset + record_end
        count += 1
        last_timestamp = store_timestamp
    if record.closes_segment(buf, end - base_offset, len(buf)):
        end = base_offset + len(buf)  # dispatch moves past the blank
    if key_index is not None and end > begin:
        key_index.append_entries(hashes, phys, times, end)
    return end, count, last_timestamp
