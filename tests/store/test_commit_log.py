"""CommitLog appends: records land back to back, warmed ahead in chunks (inline or by the
background PageWarmer), and roll to the next segment with a blank, whatever the warm-ahead
setting."""

import time

import pytest

from tidemq.store import record
from tidemq.store.log.commit_log import CommitLog

SEGMENT = 256 << 10
HOST = ("127.0.0.1", 10911)


def encoded(i: int) -> record.EncodedMessage:
    return record.prepare(
        topic="warm",
        body=bytes([i % 251]) * (100 + (i * 37) % 900),
        queue_id=0,
        properties_bytes=record.encode_properties({record.PROPERTY_UNIQ_KEY: f"K{i:08d}"}),
        store_host=HOST,
        born_host=("127.0.0.1", 0),
        born_timestamp=1_700_000_000_000,
    )


def wait_until(condition, timeout: float = 10.0) -> bool:
    """A bound on how long a test waits for the warmer thread, not a timing assertion."""
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.001)
    return True


@pytest.mark.parametrize("warm_ahead,background", [(0, False), (4096, False), (64 << 10, False), (64 << 10, True)])
def test_appends_across_warm_chunks_and_segments_decode_in_order(tmp_path, warm_ahead, background):
    log = CommitLog(tmp_path / "commitlog", SEGMENT, warm_ahead, background_warm=background)
    placed = []
    for i in range(1500):  # about 0.9 MB: several segments, many warm chunks each
        message = encoded(i)
        offset = log.append(message, i, 1_700_000_000_000 + i)
        placed.append((offset, message.total_size))
        assert log.write_position == offset + message.total_size
    assert len(log.segments) >= 3
    if background:
        # the warmer thread (appends never warm in this mode) maps the active segment to its
        # end: it is smaller than the warm-ahead distance
        active = log.segments[-1]
        assert wait_until(lambda: active.warm_end == active.size)
        assert log._warmer.chunks >= 1
    elif warm_ahead:
        active = log.segments[-1]
        assert active.warm_end % warm_ahead == 0 or active.warm_end == active.size
        assert active.warm_end >= log.write_position - active.start
    # every record is where append said, whole, in order; a segment ends with a blank
    for i, (offset, size) in enumerate(placed):
        rec = log.read_record(offset)
        assert type(rec) is record.Record, (i, rec)
        assert (rec.total_size, rec.queue_offset, rec.commit_log_offset) == (size, i, offset)
        assert rec.properties[record.PROPERTY_UNIQ_KEY] == f"K{i:08d}"
        following = offset + size
        if i + 1 < len(placed) and placed[i + 1][0] != following:
            assert placed[i + 1][0] % SEGMENT == 0
            assert type(log.read_record(following)) is record.EndOfSegment
    log.close()


def test_reopened_log_appends_after_its_last_record(tmp_path):
    log = CommitLog(tmp_path / "commitlog", SEGMENT, 4096)
    first = [log.append(encoded(i), i, 1) for i in range(10)]
    end = log.write_position
    log.close()
    log = CommitLog(tmp_path / "commitlog", SEGMENT, 4096)
    log.write_position = end  # what recovery sets
    offset = log.append(encoded(10), 10, 2)
    assert offset == end and first[0] == 0
    assert log.read_record(offset).queue_offset == 10
    assert type(log.read_record(first[-1])) is record.Record
    log.close()


def test_segments_the_warmer_works_on_can_be_deleted_truncated_and_closed(tmp_path):
    log = CommitLog(tmp_path / "commitlog", SEGMENT, 64 << 10, background_warm=True)
    offsets = [log.append(encoded(i), i, 1) for i in range(1500)]
    segments = list(log.segments)
    deleted = log.delete_segments_before(segments[2].start)
    assert deleted == segments[:2] and all(s.mm.closed for s in deleted)
    log.truncate(offsets[800])  # drops the later segments, the active one among them
    assert all(s.mm.closed for s in segments if s.start > offsets[800])
    offset = log.append(encoded(9999), 800, 2)  # warming resumes in the segment appended to now
    assert offset == offsets[800]
    assert log.read_record(offset).properties[record.PROPERTY_UNIQ_KEY] == "K00009999"
    active = log.segment_for(offset)
    assert wait_until(lambda: active.warm_end == active.size)
    warmer_thread = log._warmer._thread
    log.close()
    assert not warmer_thread.is_alive() and all(s.mm.closed for s in segments[2:])
