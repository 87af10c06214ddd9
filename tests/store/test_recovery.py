"""Recovery as ordinary tests: damage the files, reopen, assert exactly what survived."""

import logging
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scan import encode, messages

from tidemq.cli import main as cli_main
from tidemq.store import CorruptStoreError, Message, MessageStore, StoreConfig, record
from tidemq.store import _dispatch
from tidemq.store.log.checkpoint import Checkpoint
from tidemq.store.log.commit_log import CommitLog
from tidemq.store.recovery import recover as recovery
from tidemq.store.recovery.check import check

CFG = dict(segment_size=16384, consume_queue_units=8)


def fill(path, count=60, queues=3):
    results = []
    with MessageStore(path, StoreConfig(**CFG)) as store:
        for i in range(count):
            results.append(store.put(Message(topic="t", body=b"body-%04d" % i * 20, queue_id=i % queues, tags="k%d" % (i % 2))))
        assert store.wait_dispatched()
    return results


def snapshot_queues(path):
    root = path / "consumequeue"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def bodies(store, queues=3):
    out = {}
    for q in range(queues):
        out[q] = [bytes(m.body) for m in store.get("t", q, 0, 1000).messages]
    return out


def segment_file(path, offset):
    name = f"{offset - offset % CFG['segment_size']:020d}"
    return path / "commitlog" / name, offset % CFG["segment_size"]


def test_clean_restart_keeps_everything(tmp_path):
    results = fill(tmp_path)
    before = snapshot_queues(tmp_path)
    assert not (tmp_path / "abort").exists()
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert not store.recovery.abnormal
        assert store.recovery.redispatched_from == store.recovery.end  # nothing to rebuild
        assert [store.max_offset("t", q) for q in range(3)] == [20, 20, 20]
        assert store.read_record(results[-1].commit_log_offset).queue_offset == 19
    assert snapshot_queues(tmp_path) == before


def test_torn_tail_is_cut_and_logged(tmp_path, caplog):
    results = fill(tmp_path)
    last = results[-1]
    path, pos = segment_file(tmp_path, last.commit_log_offset)
    data = bytearray(path.read_bytes())
    half = last.size // 2
    data[pos + half : pos + last.size] = bytes(last.size - half)  # the write was torn half way
    path.write_bytes(bytes(data))
    (tmp_path / "abort").write_text("12345")  # and the process died
    with caplog.at_level(logging.WARNING, logger="tidemq"):
        with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
            assert store.recovery.abnormal
            assert store.recovery.end == last.commit_log_offset
            assert store.max_offset("t", 2) == 19  # message 59 (queue 2, offset 19) is gone
            assert store.max_offset("t", 0) == 20 and store.max_offset("t", 1) == 20
            assert store.put(Message(topic="t", body=b"again", queue_id=2)).queue_offset == 19
    assert any("torn tail" in r.message and str(last.commit_log_offset) in r.message for r in caplog.records)
    assert check(tmp_path).sound


def test_consume_queue_entries_past_the_log_end_are_dropped(tmp_path):
    results = fill(tmp_path)
    cut = results[-5]
    path, pos = segment_file(tmp_path, cut.commit_log_offset)
    data = bytearray(path.read_bytes())
    data[pos:] = bytes(len(data) - pos)  # the last 5 records never reached the disk
    path.write_bytes(bytes(data))
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert sum(store.max_offset("t", q) for q in range(3)) == 55
        got = bodies(store)
        assert sum(len(v) for v in got.values()) == 55
    assert check(tmp_path).sound


def test_flipped_bit_in_the_middle_refuses_to_open_until_repaired_which_keeps_the_records_after_it(tmp_path, capsys):
    results = fill(tmp_path)
    # the process died when the checkpoint vouched for records 0-5 only: the log is validated from there
    cp = Checkpoint.load(tmp_path / "checkpoint")
    cp.logics_physical_offset = results[5].commit_log_offset
    cp.confirm_phy_offset = cp.index_physical_offset = results[5].commit_log_offset + results[5].size
    cp.save(tmp_path / "checkpoint")
    (tmp_path / "abort").write_text("12345")
    victim = results[10]
    path, pos = segment_file(tmp_path, victim.commit_log_offset)
    data = bytearray(path.read_bytes())
    data[pos + 95] ^= 0x04  # one bit of the body
    path.write_bytes(bytes(data))
    assert cli_main(["store", "check", str(tmp_path)]) == 1
    assert f"invalid record at commit-log offset {victim.commit_log_offset}" in capsys.readouterr().out
    with pytest.raises(CorruptStoreError) as err:
        MessageStore(tmp_path, StoreConfig(**CFG))
    assert err.value.offset == victim.commit_log_offset
    assert "tidemq store repair" in str(err.value)
    assert cli_main(["store", "repair", str(tmp_path)]) == 0
    assert f"damaged record at commit-log offset {victim.commit_log_offset}" in capsys.readouterr().out
    saved = list((tmp_path / "repair").iterdir())
    assert saved and saved[0].read_bytes()[:4] == victim.size.to_bytes(4, "big")  # the damaged bytes are kept
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert sum(store.max_offset("t", q) for q in range(3)) == 60  # nothing after it was dropped
        got = [body for queue in bodies(store).values() for body in queue]
        assert len(got) == 59 and b"body-0010" * 20 not in got  # the damaged one is never read
        assert store.put(Message(topic="t", body=b"x", queue_id=victim.queue_offset % 3)).size > 0
    assert cli_main(["store", "check", str(tmp_path)]) == 0


def test_deleted_consume_queues_are_rebuilt_byte_for_byte(tmp_path):
    fill(tmp_path)
    before = snapshot_queues(tmp_path)
    shutil.rmtree(tmp_path / "consumequeue")
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert bodies(store)[1][0] == b"body-0001" * 20
    assert snapshot_queues(tmp_path) == before
    shutil.rmtree(tmp_path / "consumequeue" / "t" / "1")  # one queue only
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert any("rebuilding" in m for m in store.recovery.messages)
    assert snapshot_queues(tmp_path) == before
    middle = sorted((tmp_path / "consumequeue" / "t" / "0").iterdir())[1]
    middle.unlink()  # a file in the middle of a queue
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert [int(bytes(b)[5:9]) for b in bodies(store)[0]] == list(range(0, 60, 3))
    assert snapshot_queues(tmp_path) == before


@pytest.mark.parametrize("workers", [0, 2])
def test_a_deleted_queue_met_past_its_first_slot_is_rebuilt_from_the_whole_log(tmp_path, workers):
    """The queue of the newest record lost its files: the other queues cover the log up to that
    record, so the redispatch starts there, at the queue's slot 19.  Recovery must not start the
    queue at 19; it rebuilds it from the start of the log."""
    results = fill(tmp_path)
    before = snapshot_queues(tmp_path)
    shutil.rmtree(tmp_path / "consumequeue" / "t" / "2")
    with MessageStore(tmp_path, StoreConfig(**CFG, dispatch_workers=workers)) as store:
        assert store.recovery.redispatched_from == results[-1].commit_log_offset
        assert any("rebuilding" in m for m in store.recovery.messages)
        assert store.min_offset("t", 2) == 0
        assert bodies(store)[2] == [b"body-%04d" % i * 20 for i in range(2, 60, 3)]
    assert snapshot_queues(tmp_path) == before


def test_stale_abort_marker(tmp_path):
    fill(tmp_path)
    before = snapshot_queues(tmp_path)
    (tmp_path / "abort").write_text("999999")
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert store.recovery.abnormal
        assert sum(store.max_offset("t", q) for q in range(3)) == 60
    assert not (tmp_path / "abort").exists()
    assert snapshot_queues(tmp_path) == before


def test_inspect_reports_segments_queues_and_lag(tmp_path, capsys):
    results = fill(tmp_path, count=30)
    assert cli_main(["store", "inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"end offset {results[-1].commit_log_offset + results[-1].size}" in out
    assert "t/0  min 0  max 10" in out and "dispatch lag: 0 bytes" in out


def test_empty_store_opens_and_checks(tmp_path):
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert store.queues() == [] and store.get("t", 0, 0, 10).messages == []
    assert check(tmp_path).sound
    assert record.decode(b"", 0) == record.EndOfData(0)


def decoded_one_by_one(log: CommitLog, start: int) -> tuple:
    """What validating the log one `record.decode` at a time finds from `start`."""
    offset = end = start
    records, last_timestamp, queue_ends, invalid = 0, 0, {}, None
    while (segment := log.segment_for(offset)) is not None:
        got = record.decode(segment.mm, offset - segment.start, base_offset=segment.start, read_properties=False)
        if type(got) is record.Record:
            offset = end = offset + got.total_size
            records, last_timestamp = records + 1, got.store_timestamp
            if got.sysflag & record.TRANSACTION_TYPE_MASK in (record.TRANSACTION_NOT, record.TRANSACTION_COMMIT):
                queue_ends[(got.topic, got.queue_id)] = got.queue_offset + 1
        elif type(got) is record.EndOfSegment:
            offset = segment.end
            if log.segment_for(offset) is None:
                break
            end = offset
        else:
            invalid = got if type(got) is record.Invalid else None
            break
    return end, records, last_timestamp, queue_ends, invalid


SEGMENT = 4096


def write_segments(directory: Path, items: list[dict]) -> list[int]:
    """`items` as records in 4 KiB segment files (each closed by a blank when the next record
    does not fit); returns where each record starts."""
    directory.mkdir()
    segments, starts, current = [], [], bytearray()
    for m in items:
        size = len(encode(m, 0))
        if len(current) + size > SEGMENT - record.BLANK_SIZE:
            current += record.encode_blank(SEGMENT - len(current))
            segments.append(current)
            current = bytearray()
        at = len(segments) * SEGMENT + len(current)
        starts.append(at)
        current += encode(m, at)
    segments.append(current)
    for number, data in enumerate(segments):
        (directory / f"{number * SEGMENT:020d}").write_bytes(bytes(data) + bytes(SEGMENT - len(data)))
    return starts


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(messages, min_size=1, max_size=40),
    flips=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 1 << 16), st.integers(0, 255)), max_size=2),
    first=st.integers(0, 3),
    chunk=st.sampled_from([1, 300, 5000, recovery.SCAN_CHUNK_BYTES]),
)
def test_validating_by_columns_finds_what_decoding_one_by_one_does(items, flips, first, chunk):
    """Across segments, with IPv6 hosts, transaction records, flipped bytes in any field or body
    (torn records among them) and scans cut into chunks of any size: the same end, records,
    newest time, queue ends and invalid record."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "commitlog"
        starts = write_segments(directory, items)
        for index, at, value in flips:
            where = starts[index % len(starts)] + at % len(encode(items[index % len(items)], 0))
            path = directory / f"{where - where % SEGMENT:020d}"
            data = bytearray(path.read_bytes())
            data[where % SEGMENT] = value
            path.write_bytes(bytes(data))
        log = CommitLog(directory, SEGMENT)
        start = starts[min(first, len(starts) - 1)]
        default = recovery.SCAN_CHUNK_BYTES
        recovery.SCAN_CHUNK_BYTES = chunk
        try:
            found = recovery.scan_log(log, start)
        finally:
            recovery.SCAN_CHUNK_BYTES = default
        end, records, last_timestamp, queue_ends, invalid = decoded_one_by_one(log, start)
        log.close()
    assert (found.end, found.records, found.last_store_timestamp, found.queue_ends) == (end, records, last_timestamp, queue_ends)
    assert (found.invalid.offset, found.invalid.reason) == (invalid.offset, invalid.reason) if invalid else found.invalid is None


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=3000),
    spans=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000), st.booleans()), max_size=30),
    crc32=st.sampled_from([zlib.crc32, record.crc32]),
)
def test_the_compiled_body_crc_check_agrees_with_zlib(data, spans, crc32):
    """`_dispatch.crc_prefix` stops at the first body whose CRC-32 masked to 31 bits differs from
    the stored one: bodies of any length at any alignment, empty ones included."""
    body_at, lengths, crcs, expected = [], [], [], None
    for i, (at, length, damaged) in enumerate(spans):
        at %= len(data) + 1
        length %= len(data) - at + 1
        crc = zlib.crc32(data[at : at + length]) & 0x7FFFFFFF
        if damaged:
            crc ^= 1 << (i % 31)
            expected = i if expected is None else expected
        body_at.append(at)
        lengths.append(length)
        crcs.append(crc)
    columns = [np.array(values, dtype=np.int64) for values in (body_at, lengths, crcs)]
    got = _dispatch.crc_prefix(data, *columns, crc32)
    assert got == (len(spans) if expected is None else expected)


def test_a_body_outside_the_buffer_is_named():
    column = np.array([90], dtype=np.int64)
    with pytest.raises(ValueError, match="record 0's body \\(20 bytes at 90\\) lies outside the 100-byte buffer"):
        _dispatch.crc_prefix(bytes(100), column, np.array([20], dtype=np.int64), column, zlib.crc32)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_damaged_body_of_any_size_ends_the_valid_records(tmp_path, monkeypatch, compiled):
    """Bodies from empty to 3,000 bytes, one byte of one body flipped: the compiled check and the
    Python loop both stop the log just before that record."""
    if not compiled:
        monkeypatch.setattr(recovery, "_compiled_crc_prefix", None)
    sizes = [0, 1, 127, 128, 129, 700, 3000, 5, 2048, 64]
    body = [bytes(range(256)) * (size // 256) + b"x" * (size % 256) for size in sizes]
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 16)) as store:
        offsets = [store.put(Message(topic="t", body=b)).commit_log_offset for b in body]
    damaged = sizes.index(700)
    path = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[data.index(body[damaged], offsets[damaged]) + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    log = CommitLog(tmp_path / "commitlog", 1 << 16)
    try:
        found = recovery.scan_log(log, 0)
        assert (found.records, found.end) == (damaged, offsets[damaged])
        assert found.invalid is not None and found.invalid.offset == offsets[damaged]
        assert "crc" in found.invalid.reason.lower()
        assert recovery.scan_log(log, offsets[damaged + 1]).records == len(sizes) - damaged - 1  # the rest are sound
    finally:
        log.close()
