"""The store's files as Apache RocketMQ 5.5.0 writes them: the message-id property's key, the index
header and tag entries, delay-level and LMQ units, the checkpoint's sixth field, sparse segments.
(tests/compat runs the real RocketMQ on the same directories.)"""

from __future__ import annotations

import errno
import itertools
import os
import struct

import pytest

from tidemq.store import Message, MessageStore, StoreConfig, record
from tidemq.store.errors import StoreIOError
from tidemq.store.format.index_keys import key_hash
from tidemq.store.format.special_queues import DELAY_LEVELS_MS
from tidemq.store.index.index_file import IndexFile
from tidemq.store.index.key_index import KeyIndex, find_by_id, query_directory
from tidemq.store.log.checkpoint import Checkpoint
from tidemq.store.queues.consume_queue import UNIT_DTYPE
from tidemq.store.recovery import check

BASE_TS = 1_700_000_000_000


def config(**overrides) -> StoreConfig:
    clock = itertools.count(BASE_TS, 250)
    options = dict(segment_size=64 * 1024, consume_queue_units=200, index_hash_slots=64, index_max_entries=400,
                   dispatch_workers=0, clock=lambda: next(clock))
    options.update(overrides)
    return StoreConfig(**options)


def write_log(store_dir, records: list[dict]) -> list[int]:
    """A one-segment commit log of `records` (record.encode fields), as another broker wrote it."""
    (store_dir / "commitlog").mkdir(parents=True)
    data = bytearray()
    offsets = []
    for i, fields in enumerate(records):
        fields = dict(dict(store_timestamp=BASE_TS + 1000 * i, born_timestamp=BASE_TS, queue_id=0, queue_offset=i,
                           store_host=("127.0.0.1", 10911), born_host=("127.0.0.1", 5000)), **fields)
        offsets.append(len(data))
        data += record.encode(**fields, commit_log_offset=len(data))
    (store_dir / "commitlog" / f"{0:020d}").write_bytes(bytes(data) + bytes(64 * 1024 - len(data)))
    return offsets


def queue_units(store_dir, topic: str, queue_id: int) -> list[tuple[int, int, int]]:
    path = store_dir / "consumequeue" / topic / str(queue_id) / f"{0:020d}"
    units = [tuple(u) for u in __import__("numpy").frombuffer(path.read_bytes(), UNIT_DTYPE).tolist()]
    return [u for u in units if u[1] > 0]


# ---------------------------------------------------------------------------------------------
# 1. the message-id property


def test_the_client_message_id_is_written_under_the_key_UNIQ_KEY(tmp_path):
    with MessageStore(tmp_path, config()) as store:
        result = store.put(Message(topic="t", body=b"x", properties={"color": "blue"}))
    data = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
    assert f"UNIQ_KEY\x01{result.unique_key}\x02".encode() in data
    assert b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX" not in data


def test_a_store_written_under_the_constants_name_reads_it_as_UNIQ_KEY(tmp_path):
    legacy = record.LEGACY_PROPERTY_UNIQ_KEY
    write_log(tmp_path, [dict(topic="t", body=b"old", properties={"TAGS": "a", legacy: "ID-OLD"}),
                         dict(topic="t", body=b"both", properties={legacy: "ID-LEGACY", "UNIQ_KEY": "ID-NEW"})])
    with MessageStore(tmp_path, config()) as store:
        assert store.wait_dispatched()
        got = store.get("t", 0, 0, 10).messages
        assert [m.properties.get("UNIQ_KEY") for m in got] == ["ID-OLD", "ID-NEW"]
        assert all(legacy not in m.properties for m in got)
    assert [r.body for r in find_by_id(tmp_path, "ID-OLD", "t")] == [b"old"]  # indexed as the unique key
    assert [r.body for r in find_by_id(tmp_path, "ID-NEW", "t")] == [b"both"]


# ---------------------------------------------------------------------------------------------
# 2. the index: slots in use, tags


def test_the_index_header_counts_slots_in_use_and_tags_are_indexed(tmp_path):
    with MessageStore(tmp_path, config()) as store:
        for i in range(12):
            store.put(Message(topic="t", body=b"%d" % i, tags=["red", "blue", "🍎"][i % 3], keys=[f"k{i}"]))
    (path,) = (tmp_path / "index").iterdir()
    f = IndexFile(path, 64, 400, create=False, read_only=True)
    begin_ts, end_ts, begin_phy, end_phy, slots_in_use, count = f.header()
    # 12 records: UNIQ_KEY, one key and the tag "T#tag" each
    assert count == 1 + 36
    assert slots_in_use == len(set(int(h) % 64 for h in f.entries["hash"][1:count]))  # slots with a chain
    assert slots_in_use < 64
    entries = f.entries[1:count]
    assert int(entries["hash"][2]) == key_hash("t#T#red")  # after UNIQ_KEY and k0
    f.close()
    assert [r.body for r in query_directory(tmp_path, "t", "T#🍎")] == [b"11", b"8", b"5", b"2"]


def test_an_index_file_of_another_geometry_opens_with_its_own(tmp_path):
    with MessageStore(tmp_path, config(index_hash_slots=97, index_max_entries=300)) as store:
        for i in range(20):
            store.put(Message(topic="t", body=b"%d" % i, keys=[f"k{i}"]))
    index = KeyIndex(tmp_path / "index", 64, 400, read_only=True)  # configured otherwise
    assert [(f.hash_slots, f.max_entries) for f in index.files] == [(97, 300)]
    assert len(index.lookup("t", "k7")) == 1
    index.close()


def test_a_legacy_header_holding_the_table_size_is_recounted(tmp_path):
    with MessageStore(tmp_path, config()) as store:
        for i in range(5):
            store.put(Message(topic="t", body=b"%d" % i, keys=[f"k{i}"]))
    (path,) = (tmp_path / "index").iterdir()
    f = IndexFile(path, 64, 400, create=False)
    in_use = f.header()[4]
    header = list(f.header())
    header[4] = 64  # what earlier tidemq versions wrote there
    struct.pack_into(">qqqqii", f.mm, 0, *header)
    f.close()
    f = IndexFile(path, 64, 400, create=False)
    assert f.header()[4] == in_use
    f.close()


# ---------------------------------------------------------------------------------------------
# 3 and 4. delay-level units, LMQ units


def test_delay_level_units_carry_their_due_time(tmp_path):
    schedule = "SCHEDULE_TOPIC_XXXX"
    records = [dict(topic=schedule, queue_id=level - 1, queue_offset=0, body=b"d",
                    properties={"TAGS": "x", "DELAY": str(level), "REAL_TOPIC": "t", "REAL_QID": "0"})
               for level in (3, 18)]
    records += [dict(topic=schedule, queue_id=2, queue_offset=1, body=b"d", properties={"DELAY": "99"})]
    # enough records for the vectorized dispatch paths too
    records += [dict(topic=schedule, queue_id=5, queue_offset=i, body=b"d", properties={"DELAY": "6"})
                for i in range(40)]
    write_log(tmp_path, records)
    with MessageStore(tmp_path, config()) as store:
        assert store.wait_dispatched()
    stamps = [BASE_TS + 1000 * i for i in range(len(records))]
    assert queue_units(tmp_path, schedule, 2)[0][2] == stamps[0] + DELAY_LEVELS_MS[2]  # level 3: 10 s
    assert queue_units(tmp_path, schedule, 17)[0][2] == stamps[1] + 2 * 3600 * 1000  # level 18: 2 h
    assert queue_units(tmp_path, schedule, 2)[1][2] == stamps[2] + 2 * 3600 * 1000  # above 18: as 18
    assert [u[2] for u in queue_units(tmp_path, schedule, 5)] == [s + 120_000 for s in stamps[3:]]  # level 6: 2 min
    report = check.check(tmp_path)
    assert report.sound, report.problems


def lmq_store(tmp_path, lmq_offset_shift: int = 0):
    """RocketMQ's layout of a parent topic multi-dispatched to two light queues, its units
    written as RocketMQ writes them."""
    records = []
    for i in range(4):
        names = "%LMQ%a,%LMQ%b" if i % 2 == 0 else "%LMQ%b"
        offsets = f"{i // 2},{i}" if i % 2 == 0 else f"{i}"
        records.append(dict(topic="parent", queue_id=0, queue_offset=i, body=b"m%d" % i,
                            properties={"TAGS": "lmq", "INNER_MULTI_DISPATCH": names, "INNER_MULTI_QUEUE_OFFSET": offsets}))
    offsets = write_log(tmp_path, records)
    sizes = [len(record.encode(**dict(r, store_host=("127.0.0.1", 10911), born_host=("127.0.0.1", 5000)))) for r in records]
    code = record.tags_code("lmq")

    def write_queue(topic, rows):
        directory = tmp_path / "consumequeue" / topic / "0"
        directory.mkdir(parents=True)
        (directory / f"{0:020d}").write_bytes(b"".join(struct.pack(">qiq", offsets[r], sizes[r], code) for r in rows))

    write_queue("parent", [0, 1, 2, 3])
    write_queue("%LMQ%a", [0, 2][lmq_offset_shift:])
    write_queue("%LMQ%b", [0, 1, 2, 3])


def test_lmq_units_pointing_at_their_parents_records_check_sound(tmp_path):
    lmq_store(tmp_path)
    report = check.check(tmp_path)
    assert report.sound, report.problems
    assert report.units == 4 + 2 + 4


def test_an_lmq_unit_at_the_wrong_offset_is_a_problem(tmp_path):
    lmq_store(tmp_path, lmq_offset_shift=1)  # %LMQ%a's first unit names the record of its offset 1
    report = check.check(tmp_path)
    # the unit at 0 is wrong, and the record that lists offset 1 has no unit there
    assert [p.split(" (")[0] for p in report.problems] == [
        "light queue %LMQ%a offset 0: unit",
        "light queue %LMQ%a: 1 unit(s) missing at offset 1",
    ]


def test_records_rocketmq_does_not_multi_dispatch_need_no_light_queue_units(tmp_path):
    """A system topic's record, and one whose name and offset lists differ in length, get no
    light-queue units from RocketMQ: check expects none."""
    records = [
        dict(topic="rmq_sys_TRACE", queue_id=0, queue_offset=0, body=b"s",
             properties={"INNER_MULTI_DISPATCH": "%LMQ%a", "INNER_MULTI_QUEUE_OFFSET": "0"}),
        dict(topic="parent", queue_id=0, queue_offset=0, body=b"p",
             properties={"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "0"}),
    ]
    offsets = write_log(tmp_path, records)
    for r, offset in zip(records, offsets):
        size = len(record.encode(**dict(r, store_host=("127.0.0.1", 10911), born_host=("127.0.0.1", 5000))))
        directory = tmp_path / "consumequeue" / r["topic"] / "0"
        directory.mkdir(parents=True)
        (directory / f"{0:020d}").write_bytes(struct.pack(">qiq", offset, size, 0))
    report = check.check(tmp_path)
    assert report.sound, report.problems
    assert report.units == 2


# ---------------------------------------------------------------------------------------------
# 6. a clean exit keeps the index; 7. the checkpoint's sixth field


def test_a_clean_exit_keeps_an_index_newer_than_the_checkpoint(tmp_path):
    with MessageStore(tmp_path, config()) as store:
        for i in range(30):
            store.put(Message(topic="t", body=b"%d" % i, tags="x", keys=[f"k{i}"]))
    (path,) = (tmp_path / "index").iterdir()
    before = path.read_bytes()
    cp = Checkpoint.load(tmp_path / "checkpoint")
    cp.index_msg_timestamp = 0  # RocketMQ sets it only when an index file fills
    cp.save(tmp_path / "checkpoint")
    with MessageStore(tmp_path, config()) as store:
        assert len(store.query_message("t", "k29")) == 1
    assert path.read_bytes() == before
    # after a crash (the abort marker left), the same file is rebuilt: the same bytes again
    (tmp_path / "abort").write_text("1")
    cp.save(tmp_path / "checkpoint")
    with MessageStore(tmp_path, config()) as store:
        assert len(store.query_message("t", "T#x")) == 30
    assert [p.read_bytes() == before for p in (tmp_path / "index").iterdir()] == [True]


def test_the_checkpoint_keeps_logics_physical_offset(tmp_path):
    with MessageStore(tmp_path, config()) as store:
        results = [store.put(Message(topic="t", body=b"%d" % i)) for i in range(5)]
    data = (tmp_path / "checkpoint").read_bytes()
    assert len(data) == 4096
    assert struct.unpack_from(">q", data, 40)[0] == results[-1].commit_log_offset
    # a value RocketMQ wrote survives tidemq's own checkpoints
    cp = Checkpoint.load(tmp_path / "checkpoint")
    cp.logics_physical_offset = 1 << 40
    cp.save(tmp_path / "checkpoint")
    with MessageStore(tmp_path, config()):
        pass
    assert Checkpoint.load(tmp_path / "checkpoint").logics_physical_offset == 1 << 40


# ---------------------------------------------------------------------------------------------
# 8. sparse segments, a full disk an error


def test_a_segment_is_sparse_and_allocated_as_it_fills(tmp_path):
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 30, dispatch_workers=0)) as store:
        store.put(Message(topic="t", body=b"x"))
        (segment,) = (tmp_path / "commitlog").iterdir()
        assert segment.stat().st_size == 1 << 30
        assert segment.stat().st_blocks * 512 <= 64 << 20  # not a whole GiB for one message


def test_a_full_disk_fails_the_put_and_stores_nothing(tmp_path, monkeypatch):
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 30, dispatch_workers=0)) as store:
        first = store.put(Message(topic="t", body=b"first"))

        def disk_full(fd, offset, length):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "posix_fallocate", disk_full)
        stored = []
        with pytest.raises(StoreIOError):
            for i in range(40):  # 120 MiB: past the blocks allocated so far
                stored.append(store.put(Message(topic="t", body=b"%02d" % i * (3 << 19))))
        monkeypatch.undo()
        second = store.put(Message(topic="t", body=b"second"))
        assert store.wait_dispatched()
        assert second.queue_offset == first.queue_offset + len(stored) + 1
        bodies = [bytes(m.body) for m in store.get("t", 0, 0, 64).messages]
        assert bodies == [b"first"] + [b"%02d" % i * (3 << 19) for i in range(len(stored))] + [b"second"]
