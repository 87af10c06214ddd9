"""`rebuild` against the store's own dispatcher, byte for byte."""

from __future__ import annotations

import fcntl
import os
import shutil

import pytest
from pipeline_logs import (
    LONG_TOPIC,
    UNITS_PER_FILE,
    assert_same_files,
    dispatch_key_index,
    queue_files,
    sample_messages,
    store_config,
    write_store,
)

from tidemq.pipeline.rebuild import rebuild
from tidemq.store import MessageStore, StoreLockedError
from tidemq.store.queues.consume_queue import BLANK_UNIT
from tidemq.store.queues.queue_set import FS_TOPDIR_FL, inode_flags


def test_rebuild_equals_the_dispatchers_files(spark, written_store, tmp_path):
    store, messages, _ = written_store
    segments = sorted((store / "commitlog").iterdir())
    assert len(segments) >= 4
    expected = queue_files(store / "consumequeue")
    assert any(LONG_TOPIC in name for name in expected)  # v2 records were indexed
    assert any(name.endswith(f"{UNITS_PER_FILE * 20:020d}") for name in expected)  # queues of several files

    report = rebuild(
        spark, store, tmp_path / "out", units_per_file=UNITS_PER_FILE, hash_slots=97, max_entries=500, partition_size=48 * 1024
    )

    assert_same_files(store / "consumequeue", tmp_path / "out" / "consumequeue")
    # marked as the store marks its own (where the file system has inode flags)
    flags = inode_flags(store / "consumequeue")
    assert inode_flags(tmp_path / "out" / "consumequeue") == flags and (flags is None or flags & FS_TOPDIR_FL)
    indexed = sum(1 for m in messages if m.sysflag & 0xC in (0, 8))
    assert report.entries == indexed
    assert not report.messages
    # the key index: byte-identical to the store's dispatcher with its KeyIndex sink
    dispatch_key_index(store, tmp_path / "expected-index", 97, 500)
    assert len(list((tmp_path / "expected-index").iterdir())) >= 3  # several index files
    assert_same_files(tmp_path / "expected-index", tmp_path / "out" / "index")


def test_rebuild_of_a_log_whose_oldest_segments_are_gone(spark, tmp_path):
    # queues whose first entry is not slot 0 start with blank units, as the dispatcher pads them
    store = tmp_path / "broker-b"
    write_store(store, sample_messages(900, seed=3))
    for segment in sorted((store / "commitlog").iterdir())[:2]:
        segment.unlink()
    shutil.rmtree(store / "consumequeue")
    with MessageStore(store, store_config()) as reopened:  # recovery re-dispatches what is left
        assert reopened.wait_dispatched()
    padded = [p for p in (store / "consumequeue").rglob("*") if p.is_file() and p.read_bytes()[:20] == BLANK_UNIT]
    assert padded  # some queue now starts past slot 0

    rebuild(spark, store, tmp_path / "out", units_per_file=UNITS_PER_FILE, key_index=False, partition_size=32 * 1024)

    assert_same_files(store / "consumequeue", tmp_path / "out" / "consumequeue")


def test_rebuild_in_place_replaces_damaged_and_missing_queues(spark, tmp_path):
    store = tmp_path / "broker-c"
    write_store(store, sample_messages(600, seed=5))
    pristine = queue_files(store / "consumequeue")
    root = store / "consumequeue"
    shutil.rmtree(root / "orders")  # missing
    damaged = next(p for p in sorted(root.rglob("*")) if p.is_file())
    data = bytearray(damaged.read_bytes())
    data[40:60] = b"\xff" * 20
    damaged.write_bytes(bytes(data))
    (root / "stray").mkdir()

    (store / "index").mkdir(exist_ok=True)
    (store / "index" / "20200101000000000").write_bytes(b"damaged")
    report = rebuild(spark, store, in_place=True, hash_slots=31, max_entries=2000, partition_size=64 * 1024)

    assert queue_files(root) == pristine
    assert report.out == str(store) and report.key_index == str(store / "index")
    dispatch_key_index(store, tmp_path / "expected-index", 31, 2000)
    assert_same_files(tmp_path / "expected-index", store / "index")
    assert not [p.name for p in store.iterdir() if p.name.endswith((".old", ".tmp"))]
    with MessageStore(store, store_config()) as reopened:
        got = reopened.get("orders", 0, offset=0, max_count=5)
        assert [m.queue_offset for m in got.messages] == [0, 1, 2, 3, 4]


def test_rebuild_in_place_refuses_a_store_in_use(spark, tmp_path):
    store = tmp_path / "broker-d"
    write_store(store, sample_messages(50))
    fd = os.open(store / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = queue_files(store / "consumequeue")
        with pytest.raises(StoreLockedError, match="stop its broker"):
            rebuild(spark, store, in_place=True)
        assert queue_files(store / "consumequeue") == before
    finally:
        os.close(fd)


def test_writing_the_key_index_again_replaces_it(tmp_path):
    """A retried writer task (or a second run into the same directory) leaves one index, not two."""
    import pyarrow as pa

    from tidemq.pipeline.key_index import append_entries
    from tidemq.store.index.key_index import KeyIndex

    batch = pa.RecordBatch.from_pydict({
        "topic": ["t", "t"], "key": ["k1", "k2"], "commit_log_offset": [0, 200],
        "size": [200, 200], "store_ms": [1_700_000_000_000, 1_700_000_000_001],
    })
    for _ in range(2):
        append_entries(iter([batch]), str(tmp_path / "index"), 64, 100)
    index = KeyIndex(tmp_path / "index", 64, 100, read_only=True)
    try:
        assert sum(f.entry_count for f in index.files) == 2
    finally:
        index.close()
