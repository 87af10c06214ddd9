"""The key index: IndexFile layout and hashing, lookups by id and key, recovery, the CLI."""

from __future__ import annotations

import contextlib
import itertools
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trees import same_tree

from tidemq.cli import main as cli_main
from tidemq.store import Message, MessageStore, StoreConfig, record
from tidemq.store.dispatch.sequential import Dispatcher
from tidemq.store.format.index_keys import key_hash
from tidemq.store.index import index_file as index_file_module
from tidemq.store.index.index_file import ENTRY_SIZE, HEADER_SIZE, IndexFile, file_size
from tidemq.store.index.key_index import KeyIndex
from tidemq.store.log.commit_log import CommitLog
from tidemq.store.queues.queue_set import ConsumeQueueStore
from tidemq.store.recovery.recover import scan_log

BASE_TS = 1_700_000_000_000


def small_config(**overrides) -> StoreConfig:
    clock = itertools.count(BASE_TS, 250)  # store times 250 ms apart
    options = dict(
        segment_size=64 * 1024, consume_queue_units=200, index_hash_slots=64, index_max_entries=120,
        dispatch_workers=0, clock=lambda: next(clock),
    )
    options.update(overrides)
    return StoreConfig(**options)


# ---------------------------------------------------------------------------------------------
# Hashing and layout


def test_key_hash_is_javas_absolute_hash():
    assert key_hash("hello") == 99162322  # "hello".hashCode()
    assert key_hash("TopicTest#OrderID188") == abs(record.java_string_hash("TopicTest#OrderID188"))
    assert record.java_string_hash("polygenelubricants") == -(2**31)
    assert key_hash("polygenelubricants") == 0  # abs(Integer.MIN_VALUE) is negative: RocketMQ uses 0


def test_index_file_layout(tmp_path):
    f = IndexFile(tmp_path / "20231114221320000", hash_slots=8, max_entries=10, create=True)
    hashes = np.array([3, 11, 5], dtype=np.int32)  # 3 and 11 share slot 3
    phys = np.array([100, 200, 300], dtype=np.int64)
    times = np.array([BASE_TS, BASE_TS + 2500, BASE_TS + 7000], dtype=np.int64)
    assert f.append(hashes, phys, times) == 3
    f.flush()
    f.close()
    data = (tmp_path / "20231114221320000").read_bytes()
    assert len(data) == file_size(8, 10) == 40 + 8 * 4 + 10 * 20
    # hashSlotCount: the slots in use (3 and 5), not the table's size
    assert struct.unpack_from(">qqqqii", data, 0) == (BASE_TS, BASE_TS + 7000, 100, 300, 2, 4)
    slots = struct.unpack_from(">8i", data, HEADER_SIZE)
    assert slots[3] == 2 and slots[5] == 3 and slots.count(0) == 6
    entries = [struct.unpack_from(">iqii", data, HEADER_SIZE + 8 * 4 + i * ENTRY_SIZE) for i in range(5)]
    assert entries[0] == (0, 0, 0, 0)  # entry 0 is never used
    assert entries[1] == (3, 100, 0, 0)
    assert entries[2] == (11, 200, 2, 1)  # 2.5 s after the first, chained to entry 1
    assert entries[3] == (5, 300, 7, 0)
    assert entries[4] == (0, 0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 90_000)), min_size=1, max_size=80),
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=20),
    slots=st.integers(1, 16),
)
def test_appends_of_any_size_write_the_bytes_of_one_append(tmp_path_factory, entries, chunks, slots):
    """Entries appended whole or in pieces, by the reference or the compiled loop: the file is
    the same."""
    directory = tmp_path_factory.mktemp("chunks")
    hashes = np.array([h for h, _ in entries], dtype=np.int32)
    phys = np.arange(len(entries), dtype=np.int64) * 100 + 100
    times = BASE_TS + np.cumsum([t for _, t in entries]).astype(np.int64)
    files = []
    for name, compiled in (("whole", False), ("pieces", False), ("compiled", True)):
        with _compiled_appends(compiled):
            f = IndexFile(directory / name, hash_slots=slots, max_entries=100, create=True)
            sizes = itertools.cycle([len(entries)] if name == "whole" else chunks)
            done = 0
            while done < len(entries):
                size = next(sizes)
                assert f.append(hashes[done : done + size], phys[done : done + size], times[done : done + size]) == min(size, len(entries) - done)
                done += size
            files.append(f)
    for f in files[1:]:
        assert bytes(f.mm) == bytes(files[0].mm)
    for f in files:
        f.close()


@pytest.mark.parametrize("slots", [5_003, (1 << 24) + 3])  # the compiled loop sorts keys by slot in 2 and 3 passes
def test_appends_to_many_slots_write_the_same_bytes_compiled_or_by_the_reference(tmp_path, slots):
    rng = np.random.default_rng(slots)
    # keys sharing slots (chains within one append and across appends), and spread over all
    hashes = np.concatenate([rng.integers(0, 50, 3000) * slots + rng.integers(0, 40, 3000), rng.integers(0, 2**31 - 1, 3000)])
    hashes = rng.permutation(hashes % 2**31)
    phys = np.arange(len(hashes), dtype=np.int64) * 100 + 100
    times = BASE_TS + np.arange(len(hashes), dtype=np.int64) * 7
    files = []
    for name, compiled in (("reference", False), ("compiled", True)):
        with _compiled_appends(compiled):
            f = IndexFile(tmp_path / name, hash_slots=slots, max_entries=len(hashes) + 1, create=True)
            for part in np.array_split(np.arange(len(hashes)), 3):
                assert f.append(hashes[part], phys[part], times[part]) == len(part)
            files.append(f)
    assert bytes(files[0].mm) == bytes(files[1].mm)
    chained = files[1].entries["prev"]
    assert (chained[1:] > 0).sum() > 2000  # many keys were linked to an earlier one
    for f in files:
        f.close()


@settings(max_examples=60, deadline=None)
@given(hashes=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40), slots=st.integers(1, 16), counted=st.integers(0, 5))
def test_slots_a_crash_left_past_the_counted_entries_start_new_chains(tmp_path_factory, hashes, slots, counted):
    """An append that finds a slot pointing past the counted entries (linked before a crash,
    never counted) starts a new chain there, unless this append wrote that entry for the same
    slot: the compiled loop and the reference write the same bytes, from arrays and lists."""
    directory = tmp_path_factory.mktemp("leftovers")
    files = []
    for name, compiled, small in (("arrays", False, False), ("lists", False, True), ("compiled", True, False)):
        with _compiled_appends(compiled):
            f = IndexFile(directory / name, hash_slots=slots, max_entries=100, create=True)
            if counted:
                f.append(np.arange(counted, dtype=np.int64) * 7, np.arange(counted) + 1, np.full(counted, BASE_TS))
            f.slots[:] = counted + 1 + np.arange(slots) % 4  # past indexCount: leftovers
            column = list if small else np.array
            f.append(column(hashes), column(range(100, 100 + len(hashes))), column([BASE_TS + 1000] * len(hashes)))
            files.append(f)
    for f in files[1:]:
        assert bytes(f.mm) == bytes(files[0].mm)
    for f in files:
        f.close()


@contextlib.contextmanager
def _compiled_appends(on: bool):
    """IndexFile appends by the compiled loop (where it is built) or by its Python reference."""
    default = index_file_module.COMPILED
    index_file_module.COMPILED = on and default
    try:
        yield
    finally:
        index_file_module.COMPILED = default


def test_entries_of_records_already_indexed_are_skipped_whether_arrays_or_lists(tmp_path):
    """Dispatch that starts again below `indexed_until` hands over entries the index holds;
    they are skipped, from NumPy columns (a batch) and from lists (a trickle) alike."""
    built = {}
    for kind, column in (("arrays", np.array), ("lists", list)):
        index = KeyIndex(tmp_path / kind, hash_slots=8, max_entries=100)
        index.append_entries(column([11, 12]), column([100, 200]), column([BASE_TS, BASE_TS + 1]), 300)
        # again from offset 100: the first two are there already, the third is new
        index.append_entries(column([11, 12, 13]), column([100, 200, 300]), column([BASE_TS, BASE_TS + 1, BASE_TS + 2]), 400)
        assert index.indexed_until == 400
        assert [f.entry_count for f in index.files] == [3]
        built[kind] = bytes(index.files[0].mm)
        index.close()
    assert built["arrays"] == built["lists"]


def test_files_filled_between_two_flushes_are_flushed_by_the_second_not_by_the_append(tmp_path, monkeypatch):
    """Appending does not flush the file it fills (that stalled dispatch); the next `flush`
    flushes every file filled since the last one, however many, before the checkpoint may claim
    their entries."""
    flushed: list[str] = []
    flush = IndexFile.flush

    def recorded(self):
        flushed.append(self.path.name)
        flush(self)

    monkeypatch.setattr(IndexFile, "flush", recorded)
    index = KeyIndex(tmp_path, hash_slots=8, max_entries=5)  # 4 entries a file
    count = 13
    stamps = [BASE_TS + 1000 * i for i in range(count)]
    index.append_entries(np.arange(count) * 7, np.arange(count) * 100, np.array(stamps), count * 100)
    names = [f.path.name for f in index.files]
    assert [f.entry_count for f in index.files] == [4, 4, 4, 1]
    assert flushed == []
    assert index.flush() == stamps[-1]
    assert sorted(flushed) == sorted(names)
    flushed.clear()
    index.flush()
    assert flushed == names[-2:]  # nothing filled since: the two newest, as always
    index.close()


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 3)), min_size=2, max_size=60),
    cut=st.integers(1, 59),
    slots=st.integers(1, 16),
)
def test_truncate_restores_the_exact_bytes(tmp_path_factory, records, cut, slots):
    cut = min(cut, len(records) - 1)
    base = tmp_path_factory.mktemp("trunc")
    hashes, phys, times = [], [], []
    for i, (h, keys) in enumerate(records):
        for k in range(keys):
            hashes.append((h + k * 7919) % 2**31)
            phys.append(1000 * i)
            times.append(BASE_TS + 333 * i)
    split = phys.index(1000 * cut)
    arrays = (np.array(hashes, np.int32), np.array(phys, np.int64), np.array(times, np.int64))
    store_time = {p: t for p, t in zip(phys, times)}
    a = IndexFile(base / "a", slots, 300, create=True)
    a.append(*(x[:split] for x in arrays))
    a.flush()
    expected = (base / "a").read_bytes()
    a.append(*(x[split:] for x in arrays))
    assert a.truncate(1000 * cut, store_time.get) == len(phys) - split
    a.flush()
    assert (base / "a").read_bytes() == expected
    a.close()


# ---------------------------------------------------------------------------------------------
# Through the store


def test_lookup_by_unique_key_and_keys_within_a_time_range(tmp_path):
    with MessageStore(tmp_path, small_config()) as store:
        results = []
        for i in range(300):
            results.append(store.put(Message(topic=f"t{i % 2}", body=b"%d" % i, queue_id=i % 3, keys=[f"order{i}", f"user{i % 10}"])))
        rollback = store.put(Message(topic="t0", body=b"rb", keys=["order-rb"], sysflag=record.TRANSACTION_ROLLBACK))
        assert store.wait_dispatched()
        assert len(list((tmp_path / "index").iterdir())) > 1  # 120-entry files: several of them
        by_uniq = store.query_message("t1", results[77].unique_key)
        assert [r.commit_log_offset for r in by_uniq] == [results[77].commit_log_offset]
        assert store.query_message("t0", results[77].unique_key) == []  # wrong topic
        user3 = store.query_message("t1", "user3")
        assert [r.commit_log_offset for r in user3] == [results[i].commit_log_offset for i in range(293, 0, -10)]
        lo, hi = results[103].store_timestamp, results[153].store_timestamp
        ranged = store.query_message("t1", "user3", begin=lo, end=hi)
        assert [int(r.body) for r in ranged] == [153, 143, 133, 123, 113, 103]
        assert len(store.query_message("t1", "user3", max_num=4)) == 4
        assert store.query_message("t0", "order-rb") == []  # ROLLBACK records are not indexed
        assert rollback.commit_log_offset > results[-1].commit_log_offset


def test_parallel_and_single_thread_stores_build_the_same_index(tmp_path):
    for name, workers in (("alone", 0), ("one", 1), ("two", 2)):
        with MessageStore(tmp_path / name, small_config(dispatch_workers=workers)) as store:
            for i in range(2000):
                store.put(Message(topic="t", body=b"x" * (i % 300), queue_id=i % 4, keys=[f"k{i % 37}"],
                                  properties={record.PROPERTY_UNIQ_KEY: f"U{i:06d}"}))
            assert store.wait_dispatched(60)
    for name in ("one", "two"):
        assert same_tree(tmp_path / "alone" / "index", tmp_path / name / "index") == []
        assert same_tree(tmp_path / "alone" / "consumequeue", tmp_path / name / "consumequeue") == []


def rebuild(store_dir: Path, out: Path) -> None:
    log = CommitLog(store_dir / "commitlog")
    log.write_position = scan_log(log, log.min_offset).end
    queues = ConsumeQueueStore(out / "consumequeue", 200)
    index = KeyIndex(out / "index", 64, 120)
    Dispatcher(log, [queues, index], log.min_offset).dispatch_until(log.write_position)
    queues.close()
    index.close()
    log.close()


def test_index_is_cut_back_with_a_torn_log_tail_and_rebuilt_exactly(tmp_path):
    store_dir = tmp_path / "store"
    with MessageStore(store_dir, small_config()) as store:
        last = [store.put(Message(topic="t", body=b"b" * 40, keys=[f"k{i}"])) for i in range(250)][-1]
    segment = store_dir / "commitlog" / f"{last.commit_log_offset - last.commit_log_offset % (64 * 1024):020d}"
    data = bytearray(segment.read_bytes())
    pos = last.commit_log_offset % (64 * 1024)
    data[pos + 60 : pos + last.size] = bytes(last.size - 60)  # the last record is torn
    segment.write_bytes(bytes(data))
    with MessageStore(store_dir, small_config()) as store:
        assert store.recovery.cut_bytes > 0
        assert store.query_message("t", "k249") == []
        assert len(store.query_message("t", "k248")) == 1
        for i in range(250, 300):
            store.put(Message(topic="t", body=b"c", keys=[f"k{i}"]))
        assert store.wait_dispatched()
        assert store.query_message("t", "k249") == []
        assert [len(store.query_message("t", f"k{i}")) for i in (0, 150, 248, 250, 299)] == [1] * 5
    rebuild(store_dir, tmp_path / "rebuilt")
    assert same_tree(tmp_path / "rebuilt" / "index", store_dir / "index") == []


def test_deleted_index_is_rebuilt_from_the_log(tmp_path):
    store_dir = tmp_path / "store"
    with MessageStore(store_dir, small_config()) as store:
        for i in range(200):
            store.put(Message(topic="t", body=b"b", keys=[f"k{i}"]))
    for path in sorted((store_dir / "index").iterdir())[1:]:
        path.unlink()
    with MessageStore(store_dir, small_config()) as store:
        assert len(store.query_message("t", "k199")) == 1
    rebuild(store_dir, tmp_path / "rebuilt")
    assert same_tree(tmp_path / "rebuilt" / "index", store_dir / "index") == []


# ---------------------------------------------------------------------------------------------
# The CLI


def test_cli_store_query(tmp_path, capsys):
    with MessageStore(tmp_path, small_config()) as store:
        results = [store.put(Message(topic="orders", body=b"o%d" % i, keys=[f"id{i}", "all"])) for i in range(30)]
    assert cli_main(["store", "query", str(tmp_path), "--id", results[4].msg_id]) == 0
    out = capsys.readouterr().out
    assert results[4].msg_id in out and "1 message(s)" in out
    assert cli_main(["store", "query", str(tmp_path), "--id", results[9].unique_key]) == 0
    assert f"uniq {results[9].unique_key}" in capsys.readouterr().out
    assert cli_main(["store", "query", str(tmp_path), "--topic", "orders", "--key", "id12"]) == 0
    assert "o12" in capsys.readouterr().out
    begin, end = results[10].store_timestamp, results[14].store_timestamp
    assert cli_main(["store", "query", str(tmp_path), "--topic", "orders", "--key", "all",
                     "--begin", str(begin), "--end", str(end)]) == 0
    assert "5 message(s)" in capsys.readouterr().out
    assert cli_main(["store", "query", str(tmp_path), "--topic", "orders", "--key", "nope"]) == 1
    assert "0 message(s)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Dispatch lag


def test_dispatch_lag_before_anything_is_dispatched_is_the_age_of_the_oldest_waiting_record(tmp_path):
    with MessageStore(tmp_path / "store", small_config()) as store:
        gate = threading.Event()
        dispatch_until = store.dispatcher.dispatch_until

        def held(*args, **kwargs):  # the store's dispatch thread waits here
            gate.wait(30)
            return dispatch_until(*args, **kwargs)

        store.dispatcher.dispatch_until = held
        try:
            results = [store.put(Message(topic="t", body=b"b", keys=[f"k{i}"])) for i in range(3)]
            lag = store.dispatch_lag()
        finally:
            gate.set()
        age = results[-1].store_timestamp - results[0].store_timestamp  # 500 ms on the store's clock
        assert lag.bytes == results[-1].commit_log_offset + results[-1].size and lag.milliseconds == age
        assert lag.sinks == {"consume_queue": (lag.bytes, age), "key_index": (lag.bytes, age), "light_queue": (lag.bytes, age)}
        assert store.wait_dispatched()
        assert store.dispatch_lag().milliseconds == 0


def test_dispatch_lag_per_sink_live_and_offline(tmp_path, capsys):
    from tidemq.store.dispatch.lag import sink_lags
    from tidemq.store.dispatch.parallel import ParallelDispatcher

    store_dir = tmp_path / "store"
    with MessageStore(store_dir, small_config()) as store:
        results = [store.put(Message(topic="t", body=b"b" * 100, keys=[f"k{i}"])) for i in range(200)]
        assert store.wait_dispatched()
        lag = store.dispatch_lag()
        assert (lag.bytes, lag.milliseconds) == (0, 0)
        assert lag.sinks == {"consume_queue": (0, 0), "key_index": (0, 0), "light_queue": (0, 0)}
    newest = results[-1]
    # live: a dispatcher stopped part way
    log = CommitLog(store_dir / "commitlog")
    log.write_position = newest.commit_log_offset + newest.size
    queues = ConsumeQueueStore(tmp_path / "other" / "cq", 200)
    index = KeyIndex(tmp_path / "other" / "index", 64, 120)
    dispatcher = ParallelDispatcher(log, queues, index, 0, 2, inline_bytes=1 << 20)
    assert sink_lags(dispatcher, log.write_position, newest.store_timestamp)["key_index"] == (
        log.write_position, newest.store_timestamp - results[0].store_timestamp)
    dispatcher.dispatch_until(results[120].commit_log_offset)
    expected = (log.write_position - results[120].commit_log_offset, newest.store_timestamp - results[119].store_timestamp)
    assert sink_lags(dispatcher, log.write_position, newest.store_timestamp) == {"consume_queue": expected, "key_index": expected}
    dispatcher.close()
    queues.close()
    index.close()
    log.close()
    # offline: the newest index file lost; `tidemq store inspect` shows the key index behind
    newest_file = sorted((store_dir / "index").iterdir())[-1]
    newest_file.unlink()
    assert cli_main(["store", "inspect", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "consume_queue: 0 bytes, 0 ms behind" in out
    line = next(x for x in out.splitlines() if "key_index:" in x)
    behind_bytes, behind_ms = int(line.split()[1]), int(line.split()[3])
    assert 0 < behind_bytes < log.write_position and behind_ms > 0
    # a damaged newest index file: inspect still reports, without the key index
    remaining = sorted((store_dir / "index").iterdir())[-1]
    remaining.write_bytes(remaining.read_bytes()[:10])
    assert cli_main(["store", "inspect", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "consume_queue: 0 bytes, 0 ms behind" in out and "key_index:" not in out
