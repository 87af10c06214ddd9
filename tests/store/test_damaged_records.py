"""A record damaged in the middle of the log (a bit flipped in its body or, for a record carrying
RocketMQ's whole-record CRC property, in its header): reads never hand it out as intact (skipped,
logged with its offset, counted); `check` reports it once; `repair` replaces it by a placeholder
of its size, keeping the valid records after it and the damaged bytes under repair/."""

import logging
import os

from tidemq.store import Message, MessageStore, StoreConfig, record
from tidemq.store.recovery.check import check


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
