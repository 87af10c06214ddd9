"""ConsumeQueue files: 20-byte units, file roll-over, ranges, frontier, time search, truncation."""

import struct

from tidemq.store.consume_queue import BLANK_UNIT_SIZE, UNIT_SIZE, ConsumeQueue, file_name


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


def test_frontier_hides_entries_written_out_of_order(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 1, units_per_file=8)
    cq.initialize_at(0)
    for q in (0, 1, 4):
        cq.write(q, q * 10, 10, 0)
        cq.commit(q)
    assert cq.max_offset == 2
    assert [u.queue_offset for u in cq.read(0, 10)] == [0, 1]
    for q in (2, 3):
        cq.write(q, q * 10, 10, 0)
        cq.commit(q)
    assert cq.max_offset == 5
    assert [u.queue_offset for u in cq.read(0, 10)] == [0, 1, 2, 3, 4]


def test_rewriting_a_committed_slot_is_a_no_op(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=8)
    assert cq.put(0, 0, 10, 0)
    assert not cq.put(0, 999, 10, 0)
    assert cq.read(0, 1)[0].commit_log_offset == 0


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


def test_offset_for_timestamp(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=16)
    times = {}
    stamps = [100, 200, 200, 200, 300, 400]
    for q, ts in enumerate(stamps):
        cq.put(q, q * 10, 10, 0)
        times[q * 10] = ts
    look = times.get
    assert cq.offset_for_timestamp(200, look) == 1
    assert cq.offset_for_timestamp(200, look, upper=True) == 3
    assert cq.offset_for_timestamp(250, look) == 4
    assert cq.offset_for_timestamp(250, look, upper=True) == 3
    assert cq.offset_for_timestamp(50, look) == 0
    assert cq.offset_for_timestamp(999, look) == 6  # clamped to max


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
