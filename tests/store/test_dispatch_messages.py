"""Parallel dispatch's messages and pipes: what the coordinator and its workers send each other
(pickled cheaply, framed, read through a buffer), the batches whose few queues a worker writes
whole instead of handing units over, and the compiled copying of queues' units into their files."""

from __future__ import annotations

import mmap
import os
import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_parallel_dispatch import build_log, sequential_build, two_workers_against_one_thread
from trees import same_tree

from tidemq.store.dispatch import builder as batch_builder
from tidemq.store.dispatch.builder import DIRECT_QUEUES, BatchBuilder, owner_of
from tidemq.store.dispatch.messages import BatchResult, BatchTask, Channel, IndexAppend, IndexAppended, QueueRuns, UnitsHandover, UnitsWritten
from tidemq.store.dispatch.parallel import cut_batch
from tidemq.store.queues.consume_queue import UNIT_DTYPE


def _same(a, b) -> bool:
    """Equal field by field, arrays by dtype and values."""
    if type(a) is not type(b):
        return False
    if type(a) is np.ndarray:
        return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if hasattr(type(a), "__slots__") and hasattr(a, "__dataclass_fields__"):
        return all(_same(getattr(a, name), getattr(b, name)) for name in a.__slots__)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_every_message_comes_back_equal_through_pickle():
    runs = QueueRuns(["a", "b"], np.array([0, 1, 1], np.int32), np.array([3, 0, -1], np.int32), np.array([7, 0, 2**40], np.int64),
                     np.array([2, 1, 5], np.int64), {1: [9, 12]})
    handover = UnitsHandover(4, ["a"], np.array([0], np.int32), np.array([3], np.int32), np.array([7], np.int64),
                             np.array([2], np.int64), np.array([7, 9], np.int64),
                             np.array([(10, 20, 30), (40, 50, -60)], dtype=UNIT_DTYPE).tobytes())
    messages = [
        BatchTask(4, "/x/00000000000000000000", 0, 1 << 20, 100, 4000),
        BatchResult(4, 100, 4000, None, 12, 1_700_000_000_123, runs, np.array([5, -6], np.int32), np.array([100, 300], np.int64),
                    np.array([1, 2], np.int64), 0, [(1, pickle.dumps(handover, protocol=pickle.HIGHEST_PROTOCOL))]),
        BatchResult(5, 4000, 4000, "damaged", 0, 0, QueueRuns.empty(), np.zeros(0, np.int32), np.zeros(0, np.int64),
                    np.zeros(0, np.int64)),
        handover,
        UnitsHandover(4, ["a"], np.array([0], np.int32), np.array([3], np.int32), np.array([7], np.int64), np.array([2], np.int64),
                      None, b""),
        UnitsWritten(4),
        UnitsWritten(4, "worker failed"),
        IndexAppend(4, "/x/index", 100),
        IndexAppend(4, None, 0),
        IndexAppended(4, 10, 2, 1_700_000_000_124, 1_700_000_000_120, None),
    ]
    for message in messages:
        back = pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        assert _same(back, message), message
    result = pickle.loads(pickle.dumps(messages[1], protocol=pickle.HIGHEST_PROTOCOL))
    assert _same(pickle.loads(result.handovers[0][1]), handover)
    assert result.queues.extras == {1: [9, 12]}


def test_a_channel_reads_every_whole_message_at_once_and_keeps_a_partial_one():
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    sender, receiver = Channel(b_r, a_w), Channel(a_r, b_w)
    try:
        assert not receiver.poll()
        for n in range(3):
            sender.send(("message", n))
        assert receiver.poll()
        assert receiver.take() == [("message", 0), ("message", 1), ("message", 2)]
        assert not receiver.poll()
        # half a message: nothing whole to take yet, the rest completes it
        data = pickle.dumps(("big", b"z" * 5000), protocol=pickle.HIGHEST_PROTOCOL)
        framed = len(data).to_bytes(4, "big") + data
        os.write(a_w, framed[:3000])
        assert receiver.take() == []
        os.write(a_w, framed[3000:])
        sender.send("after")
        assert receiver.take() == [("big", b"z" * 5000), "after"]
        # a message larger than the buffer, sent in pieces while the receiver reads
        big = b"q" * (3 << 20)
        data = pickle.dumps(big, protocol=pickle.HIGHEST_PROTOCOL)
        framed = len(data).to_bytes(4, "big") + data
        got = []
        for at in range(0, len(framed), 60_000):
            os.write(a_w, framed[at : at + 60_000])
            got += receiver.take()
        assert got == [big]
        # the end of the pipe: the whole messages before it, then EOFError
        sender.send("last")
        os.close(a_w)
        sender.write_fd = -1
        assert receiver.take() == ["last"]
        try:
            receiver.take()
        except EOFError:
            pass
        else:
            raise AssertionError("no EOFError at the end of the pipe")
    finally:
        sender.close()
        receiver.close()


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 100, 5000, 70_000, 400_000, 1_100_000]), min_size=1, max_size=8),
       chunk=st.sampled_from([1, 7, 4096, 60_000]), seed=st.integers(0, 2**32 - 1))
def test_a_channel_returns_the_messages_in_order_whatever_the_pieces_they_come_in(sizes, chunk, seed):
    """Framed messages written in pieces of `chunk` bytes (one byte at a time too), the reader
    taking what has come after each: the same messages in the same order, each once, through
    the buffer's moves and growth."""
    rng = random.Random(seed)
    if chunk == 1:
        sizes = [size for size in sizes if size <= 5000][:4]  # one byte at a time: small ones
    messages = [bytes([rng.randrange(256)]) * size for size in sizes]
    stream = b"".join(len(data).to_bytes(4, "big") + data
                      for data in (pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL) for m in messages))
    read_fd, write_fd = os.pipe()
    spare_r, spare_w = os.pipe()
    receiver = Channel(read_fd, spare_w)
    got = []
    try:
        for at in range(0, len(stream), chunk):
            os.write(write_fd, stream[at : at + chunk])
            got += receiver.take()
    finally:
        os.close(write_fd)
        os.close(spare_r)
        receiver.close()
    assert got == messages


def test_a_batch_naming_few_queues_is_written_whole_by_a_workers_builder(tmp_path):
    """600 records of 10 queues: builder 1 of 2, as in a worker process, writes every queue, its
    own and builder 0's, and hands nothing over; the files equal the single thread's."""
    layout = [("t", i % 10) for i in range(600)]
    log, assigned = build_log(tmp_path / "log", layout, segment_size=1 << 20)
    sequential_build(log, tmp_path / "sequential", units=64)
    root = tmp_path / "parallel" / "consumequeue"
    builder = BatchBuilder(str(root), 64, False)
    builder.owner, builder.owners, builder.direct_queues = 1, 2, DIRECT_QUEUES
    assert {owner_of(*key, 2) for key in assigned} == {0, 1}
    task, _ = cut_batch(log, 0, 0, log.write_position, 1 << 20)
    result = builder.build(task)
    builder.close()
    assert result.records == 600 and len(result.queues) == 10 and result.handovers == []
    assert {(p.parent.name, int(p.name)) for p in root.glob("*/*")} == set(assigned)
    assert same_tree(tmp_path / "sequential" / "consumequeue", root) == []


def test_workers_hand_no_units_over_for_few_queues_and_build_the_same_files(tmp_path):
    layout = [("t", i % 10) for i in range(2500)] + [("hot", 0)] * 1500
    log, _ = build_log(tmp_path / "log", layout, segment_size=64 * 1024)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=16 * 1024) as dispatcher:
        assert dispatcher.dispatch_until(log.write_position) == len(layout)
        assert dispatcher.worker_batches > 4 and dispatcher.inline_batches == 0
        assert dispatcher.handovers_forwarded == 0


def _write_random_groups(root, seed: int) -> list[int]:
    """Units of 60 queue runs, whole or scattered, in random order, over 2 topics x 3 queues with
    7 slots a file (5 for one queue), in two calls, through a builder keeping at most 3 files
    mapped, which finds no file for queue ("b", 2) past its first; returns the groups left
    unwritten."""
    rng = random.Random(seed)
    builder = BatchBuilder(str(root), 7, False, units_per_file={("b", 1): 5})
    builder.max_queue_files = 3  # mappings are dropped part way through, some while a run spans files
    free = {(tid, qid): list(range(60)) for tid in range(2) for qid in range(3)}
    tids, qids, firsts, counts, whole, slots = [], [], [], [], [], []
    for _ in range(60):
        tid, qid = rng.randrange(2), rng.randrange(3)
        count = rng.randint(1, 12)
        run = rng.random() < 0.8 or (tid, qid) == (1, 2)  # ("b", 2): runs only, each written through open_file
        left = free[(tid, qid)]
        if not left:
            continue
        if run:
            first = rng.choice(left)
            taken = [slot for slot in range(first, first + count) if slot in left]
            taken = taken[: next((i for i, slot in enumerate(taken) if slot != first + i), len(taken))]
        else:
            taken = sorted(rng.sample(left, min(count, len(left))))
        if not taken:
            continue
        for slot in taken:
            left.remove(slot)
        for column, value in ((tids, tid), (qids, qid), (firsts, taken[0]), (counts, len(taken)), (whole, run)):
            column.append(value)
        slots += taken
    stops = np.cumsum(counts)
    units = np.frombuffer(rng.randbytes(20 * len(slots)), UNIT_DTYPE)
    order = np.array(rng.sample(range(len(counts)), len(counts)))

    def open_file(topic, queue_id, file_start, upf):
        return None if (topic, queue_id) == ("b", 2) and file_start else builder._queue_file(topic, queue_id, file_start, upf)

    # in two calls, as two batches would, the second naming the topics the other way round (a
    # batch's topic ids are its own: the compiled loop's cache of mappings must not mix them up)
    unwritten = []
    tids = np.array(tids)
    for part, names in ((order[: len(order) // 2], ["a", "b"]), (order[len(order) // 2 :], ["b", "a"])):
        unwritten += builder._write_groups(names, part, tids if names[0] == "a" else 1 - tids, np.array(qids), np.array(firsts),
                                           stops - counts, stops, np.array(whole), np.array(slots), units, memoryview(units.tobytes()),
                                           open_file)
    builder.close()
    return sorted(unwritten)


@pytest.mark.skipif(batch_builder._write_runs is None, reason="the compiled extension is not built")
@pytest.mark.parametrize("seed", range(4))
def test_compiled_runs_write_the_same_files_as_the_python_loop(tmp_path, monkeypatch, seed):
    unwritten = _write_random_groups(tmp_path / "compiled", seed)
    monkeypatch.setattr(batch_builder, "_write_runs", None)
    assert _write_random_groups(tmp_path / "python", seed) == unwritten
    assert unwritten  # runs of ("b", 2) reaching past its first file
    assert len(list((tmp_path / "python").rglob("0*"))) > 10  # runs spread over many files
    assert same_tree(tmp_path / "compiled", tmp_path / "python") == []


@pytest.mark.skipif(batch_builder.map_file is batch_builder.map_file_python, reason="tidemq/store/queues/_queue_file.c is not built")
@pytest.mark.parametrize("seed", range(3))
def test_builders_mapping_their_files_compiled_or_with_mmap_write_the_same_files(tmp_path, monkeypatch, seed):
    unwritten = _write_random_groups(tmp_path / "compiled", seed)
    monkeypatch.setattr(batch_builder, "map_file", batch_builder.map_file_python)
    assert _write_random_groups(tmp_path / "python", seed) == unwritten
    assert same_tree(tmp_path / "compiled", tmp_path / "python") == []


@pytest.mark.parametrize("compiled", [True, False])
def test_without_a_file_opener_runs_go_only_into_the_files_mapped_already(tmp_path, monkeypatch, compiled):
    """open_file None (a builder past half its budget writing the other workers' queues): a run
    whose file the builder has not mapped is left unwritten, no file is made for it, and the
    runs into mapped files are written; the compiled loop and the Python one alike."""
    if compiled and batch_builder._write_runs is None:
        pytest.skip("the compiled extension is not built")
    if not compiled:
        monkeypatch.setattr(batch_builder, "_write_runs", None)
    builder = BatchBuilder(str(tmp_path), 4, False)
    builder._queue_file("a", 0, 0, 4)  # a/0 slots 0-3
    builder._queue_file("a", 1, 4, 4)  # a/1 slots 4-7 (not its first file)
    rows = np.array([(0, 0, 1), (0, 1, 4), (0, 2, 0), (0, 1, 2)], np.int64)  # (topic id, queue id, slot)
    units = np.array([(100 + i, 10 + i, i) for i in range(len(rows))], UNIT_DTYPE)
    starts = np.arange(len(rows))
    unwritten = builder._write_groups(["a"], starts, rows[:, 0], rows[:, 1], rows[:, 2], starts, starts + 1,
                                      np.ones(len(rows), bool), None, units, memoryview(units.tobytes()), None)
    builder.close()
    assert unwritten == [2, 3]  # a/2 and a/1's first file: not mapped
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "a/0/00000000000000000000", "a/1/00000000000000000080"]
    first = np.frombuffer((tmp_path / "a" / "0" / "00000000000000000000").read_bytes(), UNIT_DTYPE)
    later = np.frombuffer((tmp_path / "a" / "1" / "00000000000000000080").read_bytes(), UNIT_DTYPE)
    assert first[1].tolist() == units[0].tolist() and later[0].tolist() == units[1].tolist()


@pytest.mark.skipif(batch_builder._RunCache is None, reason="the compiled extension is not built")
def test_the_compiled_loops_cache_of_mappings_follows_topics_by_name_and_lets_the_builder_close_them(tmp_path):
    """The compiled loop keeps the files it writes mapped in a RunCache by topic, queue and file:
    the topics by name, whatever ids a batch gives them, also after the builder closed its
    mappings in the middle of a call (its budget) and the cache was cleared."""
    builder = BatchBuilder(str(tmp_path), 4, False)
    builder.max_queue_files = 2

    def write(names, rows, fill):
        rows = np.array(rows, np.int64)  # (topic id, queue id, first slot), one unit each
        units = np.array([fill] * len(rows), UNIT_DTYPE)
        starts = np.arange(len(rows))
        unwritten = builder._write_groups(names, starts, rows[:, 0], rows[:, 1], rows[:, 2], starts, starts + 1,
                                          np.ones(len(rows), bool), None, units, memoryview(units.tobytes()), builder._queue_file)
        assert unwritten == []

    write(["a", "b"], [(0, 0, 0), (1, 0, 0), (0, 1, 0)], (1, 1, 1))  # the third file closes the first two
    assert len(builder._run_cache) == len(builder._files) == 1  # ("a", 1): kept, and cached
    write(["b", "a"], [(0, 1, 1), (1, 1, 1)], (2, 2, 2))  # ("b", 1) is topic 0 now, ("a", 1) topic 1
    builder.close_queue_files()  # releases the cache's hold first: no BufferError
    assert len(builder._run_cache) == 0
    written = {(topic, queue_id): np.fromfile(tmp_path / topic / str(queue_id) / "00000000000000000000", UNIT_DTYPE)["offset"][:2].tolist()
               for topic in "ab" for queue_id in (0, 1)}
    assert written == {("a", 0): [1, 0], ("b", 0): [1, 0], ("a", 1): [1, 2], ("b", 1): [0, 2]}
    builder.close()


@pytest.mark.skipif(batch_builder._RunCache is None, reason="the compiled extension is not built")
def test_the_compiled_loop_does_not_hold_a_mapping_the_builder_does_not_keep(tmp_path):
    """A file open_file maps without keeping it in the builder's `files` (the inline builder's
    ConsumeQueue mappings) is written through and let go: its owner can close it at once."""
    cache = batch_builder._RunCache()
    files = {}
    outside = mmap.mmap(-1, 80)

    def open_file(topic, queue_id, file_start, upf):
        return outside

    for _ in range(2):
        assert batch_builder._write_runs(files, ["a"], {}, 4, np.array([[0, 0, 1, 0, 2]], np.int64), bytes(range(40)), open_file, cache) == []
    assert len(cache) == 0
    assert outside[20:60] == bytes(range(40))
    outside.close()  # no buffer of it is exported


@pytest.mark.skipif(batch_builder._RunCache is None, reason="the compiled extension is not built")
def test_the_compiled_loop_writes_every_run_before_the_one_that_does_not_fit(tmp_path):
    """Runs into cached files are copied several at a time, after their targets are looked up:
    a run that does not fit still raises with every run before it written."""
    cache = batch_builder._RunCache()
    files = {("a", queue_id, 0): mmap.mmap(-1, 80) for queue_id in range(70)}  # 4 slots each

    def open_file(*args):
        raise AssertionError(f"no file should be opened: {args}")

    def rows(first):
        return [[0, queue_id, first, queue_id, queue_id + 1] for queue_id in range(70)]

    units = bytes(range(70)) * 20  # unit i: 20 bytes starting at byte i of the cycle
    assert batch_builder._write_runs(files, ["a"], {}, 8, np.array(rows(0), np.int64), units, open_file, cache) == []
    assert len(cache) == 70
    with pytest.raises(ValueError, match="past the end"):  # slot 4 of a file said to hold 8 slots is past its 4
        batch_builder._write_runs(files, ["a"], {}, 8, np.array(rows(1) + [[0, 3, 4, 0, 1]], np.int64), units, open_file, cache)
    for queue_id, mm in files.items():
        unit = units[queue_id[1] * 20 : queue_id[1] * 20 + 20]
        assert mm[:40] == unit + unit, queue_id
    cache.clear()
    for mm in files.values():
        mm.close()


@pytest.mark.skipif(batch_builder._write_runs is None, reason="the compiled extension is not built")
def test_compiled_runs_refuse_groups_that_do_not_fit(tmp_path):
    units = bytes(40)
    small = mmap.mmap(-1, 60)
    files = {("a", 0, 0): small}

    def open_file(*args):
        raise AssertionError(f"no file should be opened: {args}")

    def write(row, upf=3):
        batch_builder._write_runs(files, ["a"], {}, upf, np.array([row], np.int64), units, open_file)

    write([0, 0, 1, 0, 2])  # slots 1 and 2 of the 3-slot file
    with pytest.raises(ValueError, match="does not fit"):
        write([1, 0, 0, 0, 1])  # no topic 1
    with pytest.raises(ValueError, match="does not fit"):
        write([0, 0, 0, 1, 3])  # 2 units given
    with pytest.raises(ValueError, match="past the end"):
        write([0, 0, 2, 0, 2], upf=4)  # slots 2 and 3: a file said to hold 4 slots is 3 long
    with pytest.raises(ValueError, match="positive"):
        write([0, 0, 1, 0, 2], upf=0)
    small.close()  # no buffer is left exported
