"""The store checkpoint: where recovery may start.  RocketMQ-compatible, 4096 bytes:

    0  physicMsgTimestamp   i64   store time of the newest flushed commit-log record
    8  logicsMsgTimestamp   i64   store time of the newest record in a ConsumeQueue
   16  indexMsgTimestamp    i64   store time covered by the key index
   24  masterFlushedOffset  i64
   32  confirmPhyOffset     i64   commit-log offset known durable and dispatched
   40  logicsPhysicalOffset i64   commit-log offset of the newest record in the ConsumeQueues
                                  as last flushed (RocketMQ 5.5.0 recovers its dispatch from it)
   48  indexPhysicalOffset  i64   tidemq's own: the commit-log offset below which every record's
                                  key-index entries were flushed; 0 = unknown (RocketMQ reads
                                  and writes neither this field nor the next)
   56  logicsUnitCount      i64   tidemq's own: the units the ConsumeQueues held, summed over the
                                  queues (each queue's next offset); fewer at open means queue
                                  files were lost, and recovery does not trust the offsets above

Each offset, when known, is one the log, the queues and the index had made durable before the
checkpoint was saved: recovery validates and re-dispatches from there, not from the log's start.

Written by the flush service and at shutdown (write to a temporary file, fsync, rename), so a
crash leaves either the old or the new checkpoint, never a torn one.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path

FILE_SIZE = 4096
LAYOUT = struct.Struct(">qqqqqqqq")  # 8 × 8 = 64 bytes used
FIVE_FIELDS = struct.Struct(">qqqqq")  # the layout before 5.5.0 (40 bytes)
SAFETY_MARGIN_MS = 3000


@dataclass(slots=True)
class Checkpoint:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    logics_physical_offset: int = 0
    index_physical_offset: int = 0
    logics_unit_count: int = 0

    @property
    def min_timestamp(self) -> int:
        """A store time before which everything was both flushed and dispatched."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - SAFETY_MARGIN_MS)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            return cls()
        if len(data) >= LAYOUT.size:
            return cls(*LAYOUT.unpack_from(data, 0))
        if len(data) >= FIVE_FIELDS.size:
            return cls(*FIVE_FIELDS.unpack_from(data, 0))
        return cls()

    def save(self, path: Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        data = LAYOUT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
            self.logics_physical_offset,
            self.index_physical_offset,
            self.logics_unit_count,
        ).ljust(FILE_SIZE, b"\0")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            written = os.write(fd, data)
            if written != len(data):  # a full disk: the old checkpoint stays
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({written} of {len(data)} bytes of {tmp})")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
