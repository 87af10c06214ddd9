"""Every ConsumeQueue of the store (`ConsumeQueueStore`, the topic ConsumeQueue sink of dispatch),
and the layout of their directory on the file system (`spread_topic_directories`)."""

from __future__ import annotations

import fcntl
import logging
import os
import struct
from pathlib import Path

from ..dispatch.requests import DispatchBatch, DispatchRequest, QueueKey, group_by_queue, queue_rows
from .consume_queue import DEFAULT_UNITS_PER_FILE, ConsumeQueue, FrontierTable

log = logging.getLogger(__name__)


# ext2/3/4's "top of directory hierarchy" inode flag (chattr +T), read and set with the
# FS_IOC_GETFLAGS / FS_IOC_SETFLAGS ioctls (Linux's uapi linux/fs.h)
FS_TOPDIR_FL = 0x00020000
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602


def _flags(fd: int) -> int:
    """The inode flags of the open directory `fd` (OSError where its file system has none)."""
    return struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(4)))[0]


def inode_flags(directory: Path) -> int | None:
    """The directory's ext2/3/4 inode flags (`lsattr`), None where it is missing or its file
    system has none."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        return _flags(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def spread_topic_directories(root: Path) -> bool:
    """Mark `root` (the ConsumeQueues' directory) as a top of a directory hierarchy, so that
    ext2/3/4 spread its subdirectories, one per topic, over the file system's block groups as it
    does top-level directories (Orlov), instead of keeping them all in root's group: a queue's
    directory and files are allocated near their topic's, so dispatch workers making new queues of
    different topics at once then take different groups' bitmap and inode-table locks and blocks
    (bench/dispatch.py times making 10,000 queues with one and with N processes).
    Returns whether the flag is set; a file system without such flags (tmpfs, XFS: the ioctl
    fails) is left as it is, since the flag only steers where new directories go."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        flags = _flags(fd)
        if not flags & FS_TOPDIR_FL:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags | FS_TOPDIR_FL))
        return True
    except OSError as exc:
        log.debug("cannot mark %s as a top directory: %s", root, exc)
        return False
    finally:
        os.close(fd)


class ConsumeQueueStore:
    """Every ConsumeQueue of the store, created on first use; the topic ConsumeQueue sink.
    Its directory's subdirectories are spread over the file system (`spread_topic_directories`)."""

    name = "consume_queue"

    def __init__(self, root: Path, units_per_file: int = DEFAULT_UNITS_PER_FILE) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.root_name = str(self.root)  # one string for every queue's (ConsumeQueue.root): a store may hold millions
        spread_topic_directories(self.root)
        self.units_per_file = units_per_file
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        self.frontiers = FrontierTable()  # every queue's commit frontier, one row each
        self.logics_msg_timestamp = 0
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.lstrip("-").isdigit():
                    key = (topic_dir.name, int(queue_dir.name))
                    cq = ConsumeQueue(self.root_name, key[0], key[1], units_per_file, table=self.frontiers)
                    if cq.is_empty:
                        cq.close()
                    else:
                        self.queues[key] = cq

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def file_sizes(self) -> dict[QueueKey, int]:
        """Units per file of the queues whose files are not of the default size (written with
        another setting); every other queue, and every queue made from now on, has the default."""
        default = self.units_per_file
        return {key: cq.units_per_file for key, cq in self.queues.items() if cq.units_per_file != default}

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root_name, topic, queue_id, self.units_per_file, table=self.frontiers)
            self.queues[key] = cq
        return cq

    def dispatch(self, requests: list[DispatchRequest], changes: dict[QueueKey, int]) -> None:
        queues = self.queues
        for req in requests:
            if not req.builds_queue_entry:
                continue
            key = (req.topic, req.queue_id)
            cq = queues.get(key)
            if cq is None:
                cq = self.get_or_create(req.topic, req.queue_id)
            if cq.is_empty:
                cq.initialize_at(req.queue_offset)
            if cq.put(req.queue_offset, req.commit_log_offset, req.size, req.tags_code):
                changes[key] = cq.commit_frontier
            self.logics_msg_timestamp = req.store_timestamp

    # a queue's run of at least this many units in a batch is written with one bulk copy
    BULK_UNITS = 8

    def dispatch_batch(self, batch: DispatchBatch, changes: dict[QueueKey, int]) -> None:
        """`dispatch` in columnar form: each queue's units of the batch written together (one
        copy of a big-endian unit array when their slots are contiguous), in log order within
        the queue."""
        columns = batch.columns
        rows = queue_rows(columns)
        if not len(rows):
            return
        rows, starts, stops, slots, units = group_by_queue(columns, rows)
        names = columns.topic_names
        topic_ids = columns.topic_ids[rows].tolist()
        queue_ids = columns.queue_ids[rows].tolist()
        slot_list = slots.tolist()
        queues = self.queues
        last_row = -1
        bulk = self.BULK_UNITS
        for start, stop in zip(starts.tolist(), stops.tolist()):
            key = (names[topic_ids[start]], queue_ids[start])
            cq = queues.get(key)
            if cq is None:
                cq = self.get_or_create(*key)
            if cq.is_empty:
                cq.initialize_at(slot_list[start])
            if stop - start >= bulk:
                moved = cq.put_run(slots[start:stop], units[start:stop])
            else:
                moved = False
                put = cq.put
                for slot, (offset, size, tags_code) in zip(slot_list[start:stop], units[start:stop].tolist()):
                    moved = put(slot, offset, size, tags_code) or moved
            if moved:
                changes[key] = cq.commit_frontier
            last_row = max(last_row, int(rows[stop - 1]))
        if last_row >= 0:
            self.logics_msg_timestamp = int(columns.store_timestamps[last_row])

    def covered_offset(self) -> int:
        return max((cq.max_physical_offset for cq in self.queues.values()), default=0)

    def has_holes(self) -> bool:
        return any(cq._pending for cq in self.queues.values())

    def truncate(self, commit_log_end: int) -> None:
        for key, cq in list(self.queues.items()):
            dropped = cq.truncate(commit_log_end)
            if dropped:
                log.info(
                    "consume queue %s/%d: dropped %d entries past commit-log offset %d",
                    key[0],
                    key[1],
                    dropped,
                    commit_log_end,
                )

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        for cq in self.queues.values():
            cq.correct_min_offset(min_commit_log_offset)

    def flush(self) -> None:
        for cq in list(self.queues.values()):
            cq.flush()

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
