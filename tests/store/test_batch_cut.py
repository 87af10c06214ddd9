"""Where parallel dispatch cuts its batches (`batch_cut`): candidate record headers found without a
walk, and bodies that hold bytes shaped like a header naming its own position."""

from __future__ import annotations

from pathlib import Path

from test_parallel_dispatch import build_log, iter_records, two_workers_against_one_thread

from tidemq.store import record
from tidemq.store.dispatch.batch_cut import batch_end
from tidemq.store.log.commit_log import CommitLog


def _log_with_header_shaped_bodies(directory: Path, count: int, lying: set[int], honest: set[int]) -> tuple[CommitLog, list[int]]:
    """`count` records of 3 queues, bodies of 64 to 213 bytes; the body of record i in `honest`
    starts with a message magic code and, where a header's PHYSICALOFFSET is, the body's own
    commit-log offset; in `lying`, with another offset.  Returns the log and the records' offsets."""
    log, _ = build_log(directory, [("t", i % 3) for i in range(count)], 1 << 20,
                       body_of=lambda i: b"BODY%06d" % i + b"." * (54 + i * 37 % 150))
    segment = log.segment_for(0)
    for i in honest | lying:
        at = segment.mm.find(b"BODY%06d" % i)
        segment.mm[at : at + 8] = (200).to_bytes(4, "big") + record.MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True)
        named = segment.start + at + (0 if i in honest else 1)
        segment.mm[at + 28 : at + 36] = named.to_bytes(8, "big")
    return log, [r.commit_log_offset for r in iter_records(log)]


def test_a_batch_ends_at_the_first_header_past_its_size_that_names_its_own_position(tmp_path):
    log, offsets = _log_with_header_shaped_bodies(tmp_path, 40, lying={10}, honest={25})
    mm = log.segment_for(0).mm
    stop = log.write_position
    # from record 0, about 5 records' worth: the next record boundary past that
    size = offsets[5] - 3
    assert batch_end(mm, 0, 0, stop, size) == offsets[5]
    # a body whose header-shaped bytes name another offset is no boundary: the search goes on
    size = offsets[10] + 20 - offsets[8]
    assert batch_end(mm, 0, offsets[8], stop, size) == offsets[11]
    # one naming its own position is a candidate (the worker's walk then ends short of it)
    fake = mm.find(b"\xda\xa3\x20\xa7", offsets[25] + 8) - 4  # the bytes planted in record 25's body
    assert offsets[25] < fake < offsets[26]
    assert batch_end(mm, 0, offsets[22], stop, offsets[25] + 1 - offsets[22]) == fake
    # the rest past the size is a sliver (under a quarter of it), or there is no header past it:
    # the batch takes everything to the stop
    assert batch_end(mm, 0, offsets[30], stop, stop - offsets[30] - 10) == stop
    assert batch_end(mm, 0, offsets[30], offsets[33], 1 << 20) == offsets[33]
    # no whole record at the start: not written yet, or cut off by the stop
    assert batch_end(mm, 0, stop, stop + 4096, 1000) is None
    assert batch_end(mm, 0, offsets[30], offsets[31] - 1, 100) is None
    log.close()


def test_workers_cut_again_where_a_batch_ended_on_a_header_shaped_body(tmp_path):
    # three bodies in four name their own position, so that most cuts land inside a record: each
    # such batch's walk ends at the start of the record holding the bytes, dispatch stops there
    # (as at any walk that ends short) and the next call cuts again from there
    count = 600
    lying = set(range(0, count, 4))
    log, _ = _log_with_header_shaped_bodies(tmp_path / "log", count, lying=lying, honest=set(range(count)) - lying)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=4096) as dispatcher:
        calls, dispatched = 0, 0
        while dispatcher.dispatched_offset < log.write_position and calls < 100:
            dispatched += dispatcher.dispatch_until(log.write_position)
            calls += 1
        assert dispatched == count
        assert calls > 5  # cuts landed on header-shaped bodies
    log.close()
