"""CommitLog appends: records land back to back, warmed ahead in chunks, and roll to the next
segment with a blank, whatever the warm-ahead setting."""

import pytest

from tidemq.store import record
from tidemq.store.commit_log import CommitLog

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


@pytest.mark.parametrize("warm_ahead", [0, 4096, 64 << 10])
def test_appends_across_warm_chunks_and_segments_decode_in_order(tmp_path, warm_ahead):
    log = CommitLog(tmp_path / "commitlog", SEGMENT, warm_ahead)
    placed = []
    for i in range(1500):  # about 0.9 MB: several segments, many warm chunks each
        message = encoded(i)
        offset = log.append(message, i, 1_700_000_000_000 + i)
        placed.append((offset, message.total_size))
        assert log.write_position == offset + message.total_size
    assert len(log.segments) >= 3
    if warm_ahead:
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
