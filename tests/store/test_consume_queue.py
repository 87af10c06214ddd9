"""ConsumeQueue files: 20-byte units, file roll-over, blank padding, truncation, directories.  What
every queue store does (frontier, reads, time search) is in test_queue_store_contract.py; what a
write reads into the page cache, in bench/queue_files.py."""

import struct

import pytest

from tidemq.store.queues.consume_queue import BLANK_UNIT_SIZE, UNIT_SIZE, ConsumeQueue, file_name
from tidemq.store.queues.queue_set import FS_TOPDIR_FL, ConsumeQueueStore, inode_flags, spread_topic_directories


def test_units_are_rocketmq_bytes_and_files_roll(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=4)
    for q in range(10):
        assert cq.put(q, 1000 + 100 * q, 100, -5 + q)
    assert cq.max_offset == 10 and cq.min_offset == 0
    names = sorted(p.name for p in (tmp_path / "t" / "0").iterdir())
    assert names == [file_name(0), file_name(80), file_name(160)]  # 4 units * 20 bytes per file
    first = (tmp_path / "t" / "0" / file_name(0)).read_bytes()
    assert len(first) == 4 * UNIT_SIZE
    assert first[:20] == struct.pack(">qiq", 1000, 100, -5)
    units = cq.read(3, 4)
    assert [(u.queue_offset, u.commit_log_offset, u.tags_code) for u in units] == [(3, 1300, -2), (4, 1400, -1), (5, 1500, 0), (6, 1600, 1)]
    cq.close()
    reopened = ConsumeQueue(tmp_path, "t", 0, units_per_file=4)
    assert (reopened.min_offset, reopened.max_offset, reopened.max_physical_offset) == (0, 10, 2000)


def test_late_first_entry_is_padded_with_blank_units(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=4)
    cq.initialize_at(6)
    cq.put(6, 500, 50, 0)
    path = tmp_path / "t" / "0" / file_name(4 * UNIT_SIZE)
    raw = path.read_bytes()
    assert raw[:40] == struct.pack(">qiq", 0, BLANK_UNIT_SIZE, 0) * 2
    assert (cq.min_offset, cq.max_offset) == (6, 7)
    cq.close()
    reopened = ConsumeQueue(tmp_path, "t", 0)
    assert reopened.units_per_file == 4  # taken from the file size
    assert (reopened.min_offset, reopened.max_offset) == (6, 7)
    assert [u.queue_offset for u in reopened.read(0, 10)] == [6]


def test_truncate_and_correct_min(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=4)
    for q in range(10):
        cq.put(q, q * 100, 100, 0)
    assert cq.truncate(650) == 3  # records at 700, 800, 900 are gone
    assert cq.max_offset == 7 and cq.max_physical_offset == 700
    assert not (tmp_path / "t" / "0" / file_name(160)).exists()
    cq.correct_min_offset(450)
    assert cq.min_offset == 5
    assert not (tmp_path / "t" / "0" / file_name(0)).exists()  # wholly below the minimum
    assert [u.queue_offset for u in cq.read(0, 10)] == [5, 6]
    cq.close()
    reopened = ConsumeQueue(tmp_path, "t", 0)
    assert (reopened.min_offset, reopened.max_offset) == (4, 7)  # a restart re-derives min from files


def test_the_queue_directory_is_marked_so_that_topic_directories_spread(tmp_path):
    """ConsumeQueueStore marks its directory FS_TOPDIR_FL (chattr +T) where the file system has
    inode flags, keeping the others; a directory it cannot mark is used as it is."""
    root = tmp_path / "consumequeue"
    root.mkdir()
    before = inode_flags(root)
    if before is None:
        pytest.skip("the temporary directory's file system has no inode flags")
    assert not before & FS_TOPDIR_FL
    store = ConsumeQueueStore(root)
    store.get_or_create("t", 0).put(0, 100, 10, 0)
    store.close()
    assert inode_flags(root) == before | FS_TOPDIR_FL
    reopened = ConsumeQueueStore(root)
    assert reopened.get("t", 0).max_offset == 1
    assert inode_flags(root) == before | FS_TOPDIR_FL
    reopened.close()
    assert spread_topic_directories(tmp_path / "missing") is False
