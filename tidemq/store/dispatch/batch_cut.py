"""Where a parallel-dispatch batch ends (see parallel_dispatch), found without walking every
record: a batch starts at a known record boundary, its first header checked (a whole record; the
blank that closes a segment the coordinator handles itself), and ends at the first record header
past the target size that names its own position (magic code and PHYSICALOFFSET), or at the
limit.  Such a header is only a candidate boundary (a body could hold those bytes); the worker's
walk over the batch confirms it, and a walk that ends short makes the coordinator cut again from
where it stopped.

Positions here are offsets into one segment's mapping; the segment starts at commit-log offset
`base`.
"""

from __future__ import annotations

import struct

from ..format import record
from ..format.scan import MIN_RECORD_SIZE

_SIZE_MAGIC = struct.Struct(">ii")
_MESSAGE_MAGICS = (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2)
_MAGIC_BYTES = [struct.pack(">i", magic) for magic in _MESSAGE_MAGICS]
_MAGIC_PREFIX = _MAGIC_BYTES[0][:3]  # the first three bytes, which both message magic codes share
_MAGIC_LAST = {magic[3] for magic in _MAGIC_BYTES}
assert all(magic[:3] == _MAGIC_PREFIX for magic in _MAGIC_BYTES)
_I64 = struct.Struct(">q")


def record_after(mm, base: int, pos: int, stop: int) -> int | None:
    """The first position at or after `pos` (and before `stop`) holding what looks like a record
    header: a message magic code and a PHYSICALOFFSET equal to its own commit-log offset.  A
    candidate, not a proof: bytes inside a body could pass; the walk over the batch before it
    confirms the boundary."""
    find = mm.find
    while True:
        at = find(_MAGIC_PREFIX, pos + 4, stop)
        if at < 0:
            return None
        start = at - 4
        if start + 36 <= stop and mm[at + 3] in _MAGIC_LAST and _I64.unpack_from(mm, start + 28)[0] == base + start:
            return start
        pos = start + 1


def batch_end(mm, base: int, pos: int, stop: int, size: int) -> int | None:
    """Where the batch of about `size` bytes starting at `pos` (a record boundary, not the blank)
    ends, at `stop` at the most: the first candidate record header at or after `size` bytes (and
    past the first record), or `stop` when none is there or the rest past `size` would be a sliver
    (under a quarter of `size`).  None if no whole record starts at `pos`: not written yet, or
    damage the sequential walk reports; never skipped past."""
    total, magic = _SIZE_MAGIC.unpack_from(mm, pos)
    if magic not in _MESSAGE_MAGICS or total < MIN_RECORD_SIZE or pos + total > stop:
        return None
    if pos + size < stop - (size >> 2):
        boundary = record_after(mm, base, max(pos + size, pos + total), stop)
        if boundary is not None:
            return boundary
    return stop
