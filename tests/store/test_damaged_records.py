"""A record damaged in the middle of the log (a bit flipped in its body or, for a record carrying
RocketMQ's whole-record CRC property, in its header): reads never hand it out as intact (skipped,
logged with its offset, counted); `check` reports it once; `repair` replaces it by a placeholder
of its size, keeping the valid records after it and the damaged bytes under repair/."""

import logging
import os
import zlib

import pytest

from tidemq.store import Message, MessageStore, StoreConfig, record
from tidemq.store.recovery.check import check

from test_append_loop import python_only


def write_store(directory, count=6):
    with MessageStore(directory, StoreConfig(segment_size=1 << 20)) as store:
        puts = [store.put(Message(topic="T", body=b"body %d" % i, queue_id=0, tags="t")) for i in range(count)]
        store.wait_dispatched()
    return puts


def flip(directory, commit_log_offset: int, byte: int) -> None:
    """Flip one bit of the byte `byte` bytes into the record at `commit_log_offset`."""
    path = directory / "commitlog" / f"{commit_log_offset - commit_log_offset % (1 << 20):020d}"
    fd = os.open(path, os.O_RDWR)
    try:
        at = commit_log_offset % (1 << 20) + byte
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x10]), at)
    finally:
        os.close(fd)


def bodies(store):
    return [bytes(m.body) for m in store.get("T", 0, 0, 32).messages]


def test_a_damaged_body_is_skipped_logged_and_counted_never_delivered(tmp_path, caplog):
    directory = tmp_path / "store"
    puts = write_store(directory)
    with MessageStore(directory, StoreConfig(segment_size=1 << 20)) as store:
        damaged = puts[2]
        flip(directory, damaged.commit_log_offset, record.header_struct(False, False).size + 1)  # bit rot while open
        with caplog.at_level(logging.ERROR):
            assert bodies(store) == [b"body %d" % i for i in (0, 1, 3, 4, 5)]
            assert bodies(store) == [b"body %d" % i for i in (0, 1, 3, 4, 5)]
        assert store.damaged_records == {damaged.commit_log_offset}
        assert caplog.text.count(f"damaged record at commit-log offset {damaged.commit_log_offset}") == 1


def test_check_reports_the_damaged_record_once_and_repair_keeps_the_records_after_it(tmp_path):
    directory = tmp_path / "store"
    puts = write_store(directory)
    damaged = puts[2]
    header = record.header_struct(False, False).size
    flip(directory, damaged.commit_log_offset, header + 1)  # a bit of its body
    original = (directory / "commitlog" / f"{0:020d}").read_bytes()[damaged.commit_log_offset:][:damaged.size]

    report = check(directory)
    assert report.problems == [f"invalid record at commit-log offset {damaged.commit_log_offset}: body CRC mismatch"]
    assert report.records == 5

    with MessageStore(directory, StoreConfig(segment_size=1 << 20, repair=True)) as store:
        assert any("replaced by a placeholder" in m for m in store.recovery.messages)
        assert bodies(store) == [b"body %d" % i for i in (0, 1, 3, 4, 5)]
        assert store.max_offset("T", 0) == 6  # the queue keeps its slots
    kept = directory / "repair" / f"{damaged.commit_log_offset:020d}.damaged"
    assert kept.read_bytes() == original
    assert check(directory).sound
    with MessageStore(directory, StoreConfig(segment_size=1 << 20)) as store:  # opens as any sound store
        assert bodies(store) == [b"body %d" % i for i in (0, 1, 3, 4, 5)]
        store.put(Message(topic="T", body=b"body 6", queue_id=0))
        store.wait_dispatched()
        assert bodies(store)[-1] == b"body 6"


def with_crc_property(raw: bytes) -> bytes:
    """`raw` re-encoded carrying RocketMQ's whole-record CRC property, filled in as its store does."""
    rec = record.decode(raw, 0, check_crc=False, check_position=False)
    encoded = bytearray(record.encode(
        topic=rec.topic, body=bytes(rec.body), queue_id=rec.queue_id, queue_offset=rec.queue_offset,
        commit_log_offset=rec.commit_log_offset, store_timestamp=rec.store_timestamp,
        properties={**rec.properties, record.CRC32_PROPERTY: "0" * 10}))
    crc = record.crc32(bytes(encoded[: -record.CRC32_PROPERTY_SIZE])) & 0x7FFFFFFF
    encoded[-11:-1] = str(crc).zfill(10)[::-1].encode()  # least significant digit first
    return bytes(encoded)


def test_the_whole_record_crc_property_catches_a_flipped_header_byte():
    raw = with_crc_property(record.encode(topic="T", body=b"payload", queue_id=1, queue_offset=5, store_timestamp=7,
                                          properties={"TAGS": "a"}))
    assert raw[-record.CRC32_PROPERTY_SIZE:].startswith(b"__CRC32#\x01")
    assert type(record.decode(raw, 0, check_position=False)) is record.Record
    for position in (24, 60):  # QUEUEOFFSET and BORNTIMESTAMP: outside the body CRC
        damaged = bytearray(raw)
        damaged[position] ^= 0x01
        result = record.decode(bytes(damaged), 0, check_position=False)
        assert type(result) is record.Invalid and "__CRC32#" in result.reason
    # without the property, the same flip passes the body CRC: what the property is for
    plain = bytearray(record.encode(topic="T", body=b"payload", queue_id=1, queue_offset=5, store_timestamp=7))
    plain[24] ^= 0x01
    assert type(record.decode(bytes(plain), 0, check_position=False)) is record.Record


BORN_TIMESTAMP = 40  # BORNTIMESTAMP's first byte: outside the body CRC


def crc_property_holds(raw: bytes) -> bool:
    """Whether `raw` (one whole record) ends with RocketMQ's `__CRC32#` property and its ten digits
    (least significant first) are zlib's CRC-32 of every byte before the property."""
    tail = raw[-record.CRC32_PROPERTY_SIZE:]
    if not tail.startswith(b"__CRC32#\x01") or tail[-1:] != b"\x02":
        return False
    return int(tail[9:19][::-1]) == zlib.crc32(raw[: -record.CRC32_PROPERTY_SIZE]) & 0x7FFFFFFF


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_appended_records_carry_a_valid_whole_record_crc_property(tmp_path, compiled, monkeypatch):
    if not compiled:
        python_only(monkeypatch)
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=0)) as store:
        puts = [store.put(Message(topic="T", body=b"common %d" % i, tags="t")) for i in range(3)]  # the common case
        puts.append(store.put(Message(topic="T", body=b"keys", keys=["k1", "k2"])))
        # a stale CRC copied with a record's properties is replaced, never kept beside the new one
        puts.append(store.put(Message(topic="T", body=b"copied", properties={"a": "1", record.CRC32_PROPERTY: "1234567890"})))
        puts += store.put_batch([Message(topic="T", body=b"batch %d" % i, queue_id=i % 2) for i in range(4)])
        segment = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
        for put in puts:
            raw = segment[put.commit_log_offset : put.commit_log_offset + put.size]
            assert crc_property_holds(raw), put
            assert raw.count(b"__CRC32#") == 1
            assert type(store.commit_log.read_record(put.commit_log_offset)) is record.Record


def test_appending_the_crc_property_can_be_switched_off(tmp_path):
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, append_crc_property=False)) as store:
        puts = [store.put(Message(topic="T", body=b"plain", tags="t")),
                store.put(Message(topic="T", body=b"copied", properties={record.CRC32_PROPERTY: "1234567890"}))]
        segment = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
        assert all(b"__CRC32#" not in segment[p.commit_log_offset : p.commit_log_offset + p.size] for p in puts)


def test_a_flipped_header_byte_of_an_appended_record_is_caught_by_reads_check_and_repair(tmp_path, caplog):
    directory = tmp_path / "store"
    puts = write_store(directory)
    damaged = puts[2]
    with MessageStore(directory, StoreConfig(segment_size=1 << 20)) as store:
        flip(directory, damaged.commit_log_offset, BORN_TIMESTAMP)  # passes the body CRC
        with caplog.at_level(logging.ERROR):
            assert bodies(store) == [b"body %d" % i for i in (0, 1, 3, 4, 5)]
        assert store.damaged_records == {damaged.commit_log_offset}
    report = check(directory)
    assert report.problems == [f"invalid record at commit-log offset {damaged.commit_log_offset}: "
                               f"whole-record CRC ({record.CRC32_PROPERTY}) mismatch"]
    with MessageStore(directory, StoreConfig(segment_size=1 << 20, repair=True)) as store:
        assert bodies(store) == [b"body %d" % i for i in (0, 1, 3, 4, 5)]
    assert check(directory).sound
