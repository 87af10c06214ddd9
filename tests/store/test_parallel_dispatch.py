"""Parallel, order-preserving dispatch (RIP-52): commit frontiers, out-of-order completion,
worker processes, and crashes of a worker and of the whole store."""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import pytest
from trees import same_tree

from tidemq.store import Message, MessageStore, StoreConfig, record
from tidemq.store.dispatch import builder as batch_builder
from tidemq.store.dispatch.builder import BatchBuilder, owner_of
from tidemq.store.dispatch.faults import CRASH_ENV
from tidemq.store.dispatch.messages import Channel, UnitsHandover
from tidemq.store.dispatch.commit import QueueCommitter
from tidemq.store.dispatch.coordinator import Commit, Coordinator, Send
from tidemq.store.dispatch.parallel import ParallelDispatcher, commit_batch, cut_batch
from tidemq.store.dispatch.sequential import Dispatcher
from tidemq.store.dispatch.workers import MAPPINGS_ENV
from tidemq.store.index.key_index import KeyIndex
from tidemq.store.log.commit_log import CommitLog
from tidemq.store.queues.consume_queue import ConsumeQueue, FrontierTable
from tidemq.store.queues.queue_set import ConsumeQueueStore
from tidemq.store.recovery.recover import scan_log

STORE_HOST = ("127.0.0.1", 10911)
REPO_ROOT = Path(__file__).resolve().parents[2]


def build_log(
    directory: Path, queues: list[tuple[str, int]], segment_size: int = 16 * 1024, body_of=None, first: int = 0
) -> tuple[CommitLog, dict]:
    """A commit log with one record per entry of `queues` (topic, queue id), queue offsets
    assigned in log order from `first` as the store does; every record has a UNIQ_KEY and one
    KEYS entry.  Record i's body is `body_of(i)` if given."""
    log = CommitLog(directory / "commitlog", segment_size)
    assigned: dict[tuple[str, int], int] = {}
    for i, (topic, queue_id) in enumerate(queues):
        properties = {
            record.PROPERTY_TAGS: f"tag{i % 3}",
            record.PROPERTY_KEYS: f"key{i % 17} order{i}",
            record.PROPERTY_UNIQ_KEY: f"UNIQ{i:012d}",
        }
        encoded = record.prepare(
            topic=topic,
            body=body_of(i) if body_of else b"body-%d" % i * (1 + i % 4),
            queue_id=queue_id,
            properties_bytes=record.encode_properties(properties),
            store_host=STORE_HOST,
            born_host=("127.0.0.1", 0),
            born_timestamp=1_700_000_000_000 + i,
        )
        offset = assigned.get((topic, queue_id), first)
        log.append(encoded, offset, 1_700_000_000_000 + 7 * i)
        assigned[(topic, queue_id)] = offset + 1
    return log, assigned


def worker_build(log: CommitLog, root: Path, units_per_file: int) -> None:
    """Build the queue files of the whole of `log` under `root` as one worker does."""
    builder = BatchBuilder(str(root), units_per_file, False)
    task, _ = cut_batch(log, 0, log.min_offset, log.write_position, 1 << 20)
    assert builder.build(task).records > 0
    builder.close()


def blank_slots(path: Path, count: int) -> bool:
    """Whether the first `count` units of the queue file at `path` are blank padding (size
    0x7FFFFFFF, the format's filler)."""
    data = path.read_bytes()
    return all(int.from_bytes(data[20 * i + 8 : 20 * i + 12], "big") == 0x7FFFFFFF for i in range(count))


def sequential_build(log: CommitLog, out: Path, units: int, slots: int = 64, entries: int = 200) -> None:
    queues = ConsumeQueueStore(out / "consumequeue", units)
    index = KeyIndex(out / "index", slots, entries)
    Dispatcher(log, [queues, index], log.min_offset).dispatch_until(log.write_position)
    queues.close()
    index.close()


# ---------------------------------------------------------------------------------------------
# The seed's example


def test_seed_example_frontier_moves_only_over_contiguous_slots(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=16)
    cq.initialize_at(0)
    seen: list[list[int]] = []

    def read() -> list[int]:
        units = [u.commit_log_offset for u in cq.read(0, 100)]
        seen.append(units)
        return units

    m = {n: 1000 * n for n in range(1, 6)}  # m1..m5 at slots 0..4
    for n in (1, 2, 5):
        cq.write(n - 1, m[n], 100, 0)
        cq.commit(n - 1)
    assert cq.commit_frontier == 2  # after m2: m5 is written but not visible
    assert read() == [m[1], m[2]]
    cq.write(2, m[3], 100, 0)
    assert cq.commit(2)
    assert cq.commit_frontier == 3
    assert read() == [m[1], m[2], m[3]]
    cq.write(3, m[4], 100, 0)
    assert cq.commit(3)
    assert cq.commit_frontier == 5  # the largest committable position: after m5
    assert read() == [m[1], m[2], m[3], m[4], m[5]]
    # readers never saw m5 before m3
    assert all(m[5] not in s or m[3] in s for s in seen)


def test_seed_example_with_range_commits(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=16)
    cq.initialize_at(0)
    for slot in (0, 1, 4):
        cq.write(slot, 100 * slot + 100, 10, 0)
    assert cq.commit_range(0, 2)
    assert not cq.commit_range(4, 5)
    assert cq.commit_frontier == 2
    for slot in (2, 3):
        cq.write(slot, 100 * slot + 100, 10, 0)
    assert cq.commit_range(2, 4)
    assert cq.commit_frontier == 5
    assert [u.queue_offset for u in cq.read(0, 10)] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------
# Queues started by the coordinator (completion orders: test_dispatch_coordinator.py)


def test_a_new_queue_is_adopted_at_its_first_slot_and_read_across_its_files_once_committed(tmp_path):
    """A queue first seen at slot 40 (files of 32 units): the workers wrote the files starting
    at slots 32 and 64; the coordinator adopts the queue at slot 40, pads below it with blanks,
    and readers see the units of both files once a commit reaches them."""
    log, _ = build_log(tmp_path / "log", [("late", 0)] * 30, first=40)
    worker_build(log, tmp_path / "cq", 32)
    physical = [r.commit_log_offset for r in iter_records(log)]
    files = tmp_path / "cq" / "late" / "0"
    assert sorted(p.name for p in files.iterdir()) == [f"{32 * 20:020d}", f"{64 * 20:020d}"]
    cq = ConsumeQueue(tmp_path / "cq", "late", 0, 32, load=False)
    cq.adopt_files(40)
    assert (cq.min_offset, cq.commit_frontier, cq.read(40, 100)) == (40, 40, [])
    assert cq.commit_range(40, 70)
    assert [u.commit_log_offset for u in cq.read(30, 100)] == physical  # from slot 40, over both files
    cq.close()
    assert blank_slots(files / f"{32 * 20:020d}", 8)  # slots 32..39: blank padding below the first
    reopened = ConsumeQueue(tmp_path / "cq", "late", 0, 32)
    assert (reopened.min_offset, reopened.max_offset) == (40, 70)
    assert [u.queue_offset for u in reopened.read(0, 100)] == list(range(40, 70))
    reopened.close()


def test_a_new_queue_adopted_in_one_step_equals_one_adopted_and_committed(tmp_path):
    """`ConsumeQueue.adopted_many` (the coordinator's step for new queues starting a file) leaves
    the queue and its frontier-table row as `adopt_files` + `commit_range` do."""
    log, _ = build_log(tmp_path / "log", [("new", 0)] * 5, first=32)
    worker_build(log, tmp_path / "cq", 32)
    units = [(r.commit_log_offset, r.total_size) for r in iter_records(log)]
    cqs = ConsumeQueueStore(tmp_path / "cq", 32)
    stepwise = ConsumeQueue(tmp_path / "cq", "new", 0, 32, load=False, table=cqs.frontiers)
    stepwise.adopt_files(32)
    assert stepwise.commit_range(32, 37)
    adopted = ConsumeQueue.adopted_many(tmp_path / "cq", 32, cqs.frontiers, [("new", 0)], [32], [37])[0]
    for cq in (stepwise, adopted):
        row = cq.row
        assert (cq.commit_frontier, cq.min_offset, cq.max_offset) == (37, 32, 37)
        assert (cqs.frontiers.files_end[row], cqs.frontiers.pending[row]) == (64, False)
        assert [(u.queue_offset, u.commit_log_offset, u.size) for u in cq.read(30, 10)] == [
            (32 + i, phys, size) for i, (phys, size) in enumerate(units)]
        cq.close()
    with pytest.raises(ValueError):  # not at the start of a file
        ConsumeQueue.adopted_many(tmp_path / "cq", 32, cqs.frontiers, [("new", 0)], [33], [37])[0]
    with pytest.raises(ValueError):  # past its first file
        ConsumeQueue.adopted_many(tmp_path / "cq", 32, cqs.frontiers, [("new", 0)], [32], [65])[0]
    cqs.close()


def test_new_queues_adopted_together_take_consecutive_rows_set_as_one_by_one(tmp_path):
    table = FrontierTable(4)  # grown part way through
    single = ConsumeQueue.adopted_many(tmp_path, 32, table, [("a", 0)], [0], [3])[0]
    keys, firsts, ends = [("a", 1), ("b", 0), ("b", 7), ("c", 2), ("c", 3)], [0, 32, 64, 0, 96], [5, 33, 96, 1, 100]
    many = ConsumeQueue.adopted_many(tmp_path, 32, table, keys, firsts, ends)
    assert [cq.row for cq in many] == [1, 2, 3, 4, 5] and table.size == 6
    for cq, key, first, end in zip([single] + many, [("a", 0)] + keys, [0] + firsts, [3] + ends):
        assert ((cq.topic, cq.queue_id), cq.min_offset, cq.commit_frontier, cq.max_offset) == (key, first, end, end)
        assert (table.files_end[cq.row], table.pending[cq.row]) == (first + 32, False)
    with pytest.raises(ValueError, match="c/9: slots"):  # one queue's slots not in its first file: none is adopted
        ConsumeQueue.adopted_many(tmp_path, 32, table, [("c", 8), ("c", 9)], [0, 0], [4, 33])
    assert table.size == 6
    fresh = ConsumeQueue(tmp_path, "d", 0, 32, load=False, table=table)
    assert (fresh.row, fresh.commit_frontier, table.files_end[fresh.row]) == (6, 0, -1)


def test_a_new_queue_starting_its_file_is_flushed_read_and_reloaded_after_its_commit(tmp_path):
    """A new queue whose first slot starts a file, committed: it is flushed before and after
    its first read (bench/dispatch_resources.py prints when its file is mapped), reads back its
    units, and is closed unread without harm."""
    log, _ = build_log(tmp_path / "log", [("new", 0)] * 5)
    worker_build(log, tmp_path / "cq", 32)
    units = [(r.commit_log_offset, r.total_size) for r in iter_records(log)]
    cq = ConsumeQueue(tmp_path / "cq", "new", 0, 32, load=False)
    cq.adopt_files(0)
    assert cq.commit_range(0, 5) and cq.commit_frontier == 5
    cq.flush()  # before any read
    assert [(u.commit_log_offset, u.size) for u in cq.read(0, 10)] == units
    cq.flush()
    cq.close()
    unmapped = ConsumeQueue(tmp_path / "cq", "new", 0, 32, load=False)
    unmapped.adopt_files(0)
    unmapped.close()
    reloaded = ConsumeQueue(tmp_path / "cq", "new", 0, 32)
    assert reloaded.commit_frontier == 5
    reloaded.close()
    # a queue started before anything is written (a trickle on the dispatch thread writes after)
    fresh = ConsumeQueue(tmp_path / "cq", "fresh", 3, 32, load=False)
    fresh.adopt_files(0)
    fresh.flush()  # no file yet: nothing to sync
    assert fresh.put(0, 1000, 100, 7) and fresh.commit_frontier == 1
    assert sorted(p.name for p in (tmp_path / "cq" / "fresh" / "3").iterdir()) == [f"{0:020d}"]
    fresh.close()


def test_workers_keep_the_file_size_of_an_existing_queue(tmp_path):
    """A queue written before with 16-unit files gets 16-unit files from workers whose default
    is 32 (the store's ConsumeQueueStore tells them); a new queue gets the default."""
    old = ConsumeQueue(tmp_path / "cq", "t", 0, 16)
    old.initialize_at(0)
    old.close()
    cqs = ConsumeQueueStore(tmp_path / "cq", 32)
    assert cqs.file_sizes() == {("t", 0): 16}
    log, _ = build_log(tmp_path / "log", [("t", 0)] * 20 + [("t", 1)] * 20 + [("t", 0), ("t", 1)] * 10)
    dispatcher = ParallelDispatcher(log, cqs, None, 0, 2, batch_bytes=2000, inline_bytes=0)
    dispatcher.dispatch_until(log.write_position)
    dispatcher.close()
    cqs.close()
    assert sorted((p.name, p.stat().st_size) for p in (tmp_path / "cq" / "t" / "0").iterdir()) == [
        (f"{0:020d}", 16 * 20), (f"{16 * 20:020d}", 16 * 20)]
    assert [(p.name, p.stat().st_size) for p in (tmp_path / "cq" / "t" / "1").iterdir()] == [(f"{0:020d}", 32 * 20)]
    reopened = ConsumeQueueStore(tmp_path / "cq", 32)
    assert [u.commit_log_offset for u in reopened.get("t", 0).read(0, 100)] == [
        r.commit_log_offset for r in iter_records(log) if r.queue_id == 0]
    reopened.close()


def iter_records(log: CommitLog):
    offset = log.min_offset
    while offset < log.write_position:
        rec = log.read_record(offset, check_crc=False, read_body=False, read_properties=False)
        yield rec
        offset += rec.total_size


def cut_all(log: CommitLog, coordinator: Coordinator, limit: int) -> list:
    """Cut batches while `coordinator` wants them; every command it gives."""
    commands = []
    while (size := coordinator.next_cut(limit)) is not None:
        batch = cut_batch(log, coordinator.next_id, coordinator.cut_offset, limit, size)
        if batch is None:
            break
        commands += coordinator.cut(batch[0], limit, batch[1])
    return commands


def test_dispatched_offset_never_passes_an_unfinished_batch(tmp_path):
    """Batches answered newest first: nothing is committed (the dispatched offset, what the
    checkpoint records, stays at the start of the oldest unanswered batch) until the oldest is in."""
    log, _ = build_log(tmp_path / "log", [("t", i % 5) for i in range(300)], segment_size=1 << 20)
    cqs = ConsumeQueueStore(tmp_path / "cq", 1000)
    coordinator = Coordinator(4, 0, batch_bytes=2000, inline_bytes=0, index=False)
    sent = cut_all(log, coordinator, log.write_position)
    assert len(sent) >= 8 and all(type(command) is Send for command in sent)  # several batches outstanding at once
    builder = BatchBuilder(str(cqs.root), 1000, False)
    committer = QueueCommitter(cqs)
    for command in reversed(sent[1:]):
        assert coordinator.answered(command.worker, builder.build(command.task)) == []
    commits = coordinator.answered(sent[0].worker, builder.build(sent[0].task))
    assert [type(command) for command in commits] == [Commit] * len(sent)
    assert [command.task for command in commits] == [command.task for command in sent]
    for command in commits:
        commit_batch(committer, None, command.result, {}, False)
    assert commits[-1].result.end == sent[-1].task.end
    assert sum(cq.commit_frontier for cq in cqs.queues.values()) == sum(c.result.records for c in commits)
    builder.close()
    cqs.close()


# ---------------------------------------------------------------------------------------------
# Queue ownership: each worker writes its share of the queues, the rest is handed over


def test_owner_of_is_stable_and_alternates_over_a_topics_queues():
    assert owner_of("bench", 7, 3) == (zlib.crc32(b"bench") + 7) % 3  # not Python's per-process str hash
    assert [owner_of("t", q, 2) for q in range(6)] == [(zlib.crc32(b"t") + q) % 2 for q in range(6)]
    assert {owner_of("t", q, 2) for q in range(2)} == {0, 1}
    assert owner_of("t", -1, 2) == (zlib.crc32(b"t") + 0xFFFFFFFF) % 2  # the queue id as unsigned
    assert owner_of("t", 5, 1) == 0


@pytest.mark.parametrize("owners", [1, 2, 3, 4, 5, 8])
def test_a_builder_writes_the_queues_owner_of_gives_it_and_hands_each_other_to_its_owner(tmp_path, owners):
    """A builder with no room to map other owners' files writes exactly the queues `owner_of`
    gives it, and hands every other queue's units to the owner `owner_of` names (queue ids
    taken as unsigned, topic names hashed as UTF-8)."""
    names = ["bench", "t", "héllo"]
    rng = random.Random(owners)
    ids = [0, 1, 7, 999, -1, -2, 2**31 - 1, -(2**31)]
    layout = [(rng.choice(names), rng.choice(ids)) for _ in range(300)]
    log, assigned = build_log(tmp_path / "log", layout, segment_size=1 << 20)
    builder = BatchBuilder(str(tmp_path / "cq"), 64, False)
    builder.owner, builder.owners = 1 % owners, owners
    builder.max_queue_files = 0  # no room for other owners' files: their units are handed over
    task, _ = cut_batch(log, 0, 0, log.write_position, 1 << 20)
    result = builder.build(task)
    builder.close()
    assert result.records == len(layout)
    written = {(p.parent.name, int(p.name)) for p in (tmp_path / "cq").glob("*/*")}
    assert written == {key for key in assigned if owner_of(*key, owners) == 1 % owners}
    handed: dict[int, set] = {}
    for owner, payload in result.handovers:
        handover = pickle.loads(payload)
        handed.setdefault(owner, set()).update(
            (handover.topic_names[t], q) for t, q in zip(handover.topic_ids.tolist(), handover.queue_ids.tolist()))
    expected: dict[int, set] = {}
    for key in assigned:
        if owner_of(*key, owners) != 1 % owners:
            expected.setdefault(owner_of(*key, owners), set()).add(key)
    assert handed == expected


def _builders_of_two_owners(tmp_path: Path, layout: list[tuple[str, int]]):
    """(the queues' slot counts, the consume-queue root, builders 0 and 1 of 2 writing there, one
    task holding the whole log of `layout`); the single thread's build is under tmp_path/sequential."""
    log, assigned = build_log(tmp_path / "log", layout, segment_size=1 << 20)
    sequential_build(log, tmp_path / "sequential", units=64)
    root = tmp_path / "parallel" / "consumequeue"
    builders = [BatchBuilder(str(root), 64, False) for _ in range(2)]
    for owner, builder in enumerate(builders):
        builder.owner, builder.owners = owner, 2
    task, _ = cut_batch(log, 0, 0, log.write_position, 1 << 20)
    return assigned, root, builders, task


def _runs_name_every_queue(result, assigned) -> bool:
    """The runs of a batch's result name every queue of the batch, owned or not."""
    queues = result.queues
    return sorted((queues.topic_names[t], q) for t, q in zip(queues.topic_ids.tolist(), queues.queue_ids.tolist())) == sorted(assigned)


@pytest.mark.parametrize("records", [12, 600])
def test_a_builder_writes_the_runs_of_the_other_workers_queues_making_their_files(tmp_path, records):
    """A batch, small or large: builder 0 of 2 writes every queue, the other worker's too,
    making the files their owner has not made, and hands nothing over; the files equal the
    single thread's.  Builder 1, building the same batch, finds every file made."""
    layout = [(f"t{i % 3}", (i // 3) % 8) for i in range(records)]
    assigned, root, builders, task = _builders_of_two_owners(tmp_path, layout)
    assert {owner_of(*key, 2) for key in assigned} == {0, 1}
    result = builders[0].build(task)
    assert result.records == records and result.handovers == []
    assert _runs_name_every_queue(result, assigned)
    assert {(p.parent.name, int(p.name)) for p in root.glob("*/*")} == set(assigned)
    assert same_tree(tmp_path / "sequential" / "consumequeue", root) == []
    assert builders[1].build(task).handovers == []
    for builder in builders:
        builder.close()
    assert same_tree(tmp_path / "sequential" / "consumequeue", root) == []


def test_a_builder_at_half_its_mappings_hands_the_other_queues_over_even_when_made(tmp_path):
    layout = [(f"t{i % 3}", (i // 3) % 8) for i in range(600)]
    assigned, root, builders, task = _builders_of_two_owners(tmp_path, layout)
    assert builders[0].build(task).handovers == []  # every queue's file made
    builders[0].close_queue_files()
    builders[0].max_queue_files = 2  # its own queues' files mapped first: half the budget is used
    handovers = builders[0].build(task).handovers
    others = {key for key in assigned if owner_of(*key, 2) == 1}
    assert [owner for owner, _ in handovers] == [1]
    handover = pickle.loads(handovers[0][1])
    assert {(handover.topic_names[t], q) for t, q in zip(handover.topic_ids.tolist(), handover.queue_ids.tolist())} == others
    builders[1].write_handover(handover)
    for builder in builders:
        builder.close()
    assert same_tree(tmp_path / "sequential" / "consumequeue", root) == []


# ---------------------------------------------------------------------------------------------
# Real worker processes


@contextlib.contextmanager
def two_workers_against_one_thread(tmp_path: Path, log: CommitLog, batch_bytes: int):
    """A ParallelDispatcher with 2 worker processes (nothing built inline) building under
    tmp_path/parallel; once the block is done, its files must equal the single thread's."""
    sequential_build(log, tmp_path / "sequential", units=64)
    cqs = ConsumeQueueStore(tmp_path / "parallel" / "consumequeue", 64)
    index = KeyIndex(tmp_path / "parallel" / "index", 64, 200)
    dispatcher = ParallelDispatcher(log, cqs, index, 0, 2, batch_bytes=batch_bytes, inline_bytes=0)
    try:
        yield dispatcher
    finally:
        dispatcher.close()
        cqs.close()
        index.close()
    assert same_tree(tmp_path / "sequential", tmp_path / "parallel") == []


def test_worker_processes_build_the_same_files_as_one_thread(tmp_path):
    rng = random.Random(7)
    layout = [("hot", 0)] * 1500 + [(f"t{rng.randrange(4)}", rng.randrange(300)) for _ in range(1500)]
    rng.shuffle(layout)
    log, _ = build_log(tmp_path / "log", layout, segment_size=64 * 1024)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=16 * 1024) as dispatcher:
        assert dispatcher.dispatch_until(log.write_position) == len(layout)
        pids = dispatcher.worker_pids()
        assert len(pids) == 2 and os.getpid() not in pids  # built by other processes
        assert dispatcher.worker_batches > 2 and dispatcher.inline_batches == 0
        # the workers appended the index entries too, over several files (200 entries each)
        assert dispatcher.worker_appends >= dispatcher.worker_batches and len(list((tmp_path / "parallel" / "index").iterdir())) > 10


def test_a_worker_starts_without_warnings(tmp_path, monkeypatch):
    """`python -m tidemq.store.dispatch.worker_entry` runs a module the store package does not import:
    run on a module already imported, `-m` runs a second copy of it, with a RuntimeWarning in
    every worker's output.  With that warning made an error, the worker would die at start."""
    monkeypatch.setenv("PYTHONWARNINGS", "error::RuntimeWarning")  # the workers inherit the environment
    log, _ = build_log(tmp_path / "log", [(f"t{i % 3}", i % 5) for i in range(400)], segment_size=64 * 1024)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=4 * 1024) as dispatcher:
        assert dispatcher.dispatch_until(log.write_position) == 400
        assert dispatcher.worker_batches > 2 and dispatcher.workers_restarted == 0 and dispatcher.inline_batches == 0


def test_workers_run_this_tidemq_whatever_the_working_directory_holds(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere" / "tidemq"
    (elsewhere / "store").mkdir(parents=True)
    (elsewhere / "__init__.py").write_text("raise ImportError('another tidemq')\n")
    (elsewhere / "store" / "__init__.py").write_text("")
    monkeypatch.chdir(elsewhere.parent)  # a directory holding another checkout, say
    layout = [(f"t{i % 3}", i % 7) for i in range(1500)]
    log, _ = build_log(tmp_path / "log", layout, segment_size=64 * 1024)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=16 * 1024) as dispatcher:
        assert dispatcher.dispatch_until(log.write_position) == len(layout)
        assert dispatcher.worker_batches > 2 and dispatcher.inline_batches == 0
        assert dispatcher.workers_restarted == 0  # none died at import


@pytest.mark.parametrize("every_worker", [False, True], ids=["one worker dies once", "every worker dies"])
def test_dead_workers_are_replaced_or_give_way_and_their_batches_rebuilt(tmp_path, monkeypatch, caplog, every_worker):
    # one worker dies after writing 25 units of its first batch; or every worker after 5, so
    # that the coordinator stops starting them and builds on the dispatch thread
    monkeypatch.setenv(CRASH_ENV, "5:" if every_worker else f"25:{tmp_path / 'crashed'}")
    layout = [(f"t{i % 3}", i % 11) for i in range(2000)]
    log, _ = build_log(tmp_path / "log", layout, segment_size=64 * 1024)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=8 * 1024) as dispatcher:
        with caplog.at_level("ERROR", logger="tidemq.store.dispatch.parallel"):
            dispatcher.dispatch_until(log.write_position)
        assert dispatcher.dispatched_offset == log.write_position
        given_way = sum("building the indexes on the dispatch thread" in r.message for r in caplog.records)
        if every_worker:
            assert given_way == 1 and dispatcher.inline_batches > 0 and dispatcher.worker_pids() == []
        else:
            assert (tmp_path / "crashed").exists()
            assert dispatcher.workers_restarted == 1 and given_way == 0


@pytest.mark.parametrize("point", ["append", "handover"])
def test_a_worker_dying_part_way_through_a_write_is_undone_or_finished_by_its_replacement(tmp_path, monkeypatch, caplog, point):
    # append: the first worker started dies in its first append to an index file holding entries,
    # with the entries and chain heads written but not the header's count (a kill between the
    # two): the index is cut back and the batch built again.  handover: the first worker given
    # units to write dies halfway through writing them: its replacement (owner of the same
    # queues) is given them again, and the head batch waits for them.
    monkeypatch.setenv(CRASH_ENV, f"{point}:{tmp_path / 'crashed'}")
    if point == "handover":
        monkeypatch.setenv(MAPPINGS_ENV, "4")  # the workers hand the other worker's queues over
    layout = [(f"t{i % 3}", i % 11) for i in range(2000)]
    log, _ = build_log(tmp_path / "log", layout, segment_size=64 * 1024)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=8 * 1024) as dispatcher:
        dispatcher.dispatch_until(log.write_position)
        assert (tmp_path / "crashed").exists()
        assert dispatcher.dispatched_offset == log.write_position
        assert dispatcher.workers_restarted == 1 and "died" in caplog.text
        if point == "append":
            assert dispatcher.worker_appends > 0
        else:
            coordinator = dispatcher.coordinator
            assert dispatcher.inline_batches == 0 and not any(coordinator.handed_to(n) for n in coordinator.workers())


def test_workers_write_the_other_workers_queues_into_their_files_instead_of_handing_units_over(tmp_path):
    layout = [(f"t{i % 3}", (i // 3) % 40) for i in range(3000)]
    log, assigned = build_log(tmp_path / "log", layout, segment_size=256 * 1024)
    with two_workers_against_one_thread(tmp_path, log, batch_bytes=16 * 1024) as dispatcher:
        assert dispatcher.dispatch_until(log.write_position) == len(layout)
        assert dispatcher.worker_batches >= 4 and dispatcher.inline_batches == 0
        # every batch held queues of both workers, whose runs went into their files: none was
        # handed over (bench/dispatch_resources.py prints the queues each worker maps)
        assert {owner_of(*key, 2) for key in assigned} == {0, 1}
        assert dispatcher.handovers_forwarded == 0


@pytest.mark.parametrize("high", [False, True], ids=["low descriptors", "descriptors past 1024"])
def test_a_worker_never_blocks_on_a_full_pipe_while_its_coordinator_does(request, high):
    """Both pipes full at once (the coordinator forwarding units while the worker answers):
    the worker's send takes in what comes while it waits for room, so both complete; also with
    pipes numbered past select's limit, as a store with thousands of files open hands them on."""
    to_worker_r, to_worker_w = os.pipe()
    from_worker_r, from_worker_w = os.pipe()
    if high:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 2100:
            pytest.skip(f"the open-file limit ({hard}) does not reach 2,100")
        if soft != resource.RLIM_INFINITY and soft < 2100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (2100, hard))
            request.addfinalizer(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
        moved = []
        for number, fd in enumerate((to_worker_r, from_worker_w), start=2050):
            os.dup2(fd, number)
            os.close(fd)
            moved.append(number)
        to_worker_r, from_worker_w = moved
    worker = Channel(to_worker_r, from_worker_w)
    coordinator = Channel(from_worker_r, to_worker_w)
    os.set_blocking(from_worker_w, False)
    big = b"u" * (4 << 20)  # far more than a pipe holds
    received = []
    sent = threading.Event()

    def coordinate() -> None:
        coordinator.send(("handover", big))  # blocks until the worker has read it
        sent.set()
        received.append(coordinator.recv())

    thread = threading.Thread(target=coordinate, daemon=True)
    thread.start()
    kept = []
    worker.send_reading(("answer", big), kept.append)
    thread.join(30)
    assert sent.is_set() and received == [("answer", big)]
    assert kept == [("handover", big)]
    worker.close()
    coordinator.close()


def test_store_with_workers_serves_every_queue_in_order(tmp_path):
    cfg = StoreConfig(segment_size=256 * 1024, consume_queue_units=500, dispatch_workers=2,
                      index_hash_slots=512, index_max_entries=4000)
    arrivals: list[dict] = []
    with MessageStore(tmp_path, cfg) as store:
        assert isinstance(store.dispatcher, ParallelDispatcher)
        store.subscribe(lambda changes: arrivals.append(dict(changes)))
        results = [store.put(Message(topic="t", body=b"x" * 200, queue_id=i % 5, keys=[f"k{i}"])) for i in range(5000)]
        assert store.wait_dispatched(60)
        for q in range(5):
            got = store.get("t", q, 0, 10_000)
            assert [m.queue_offset for m in got.messages] == list(range(1000))
        assert store.query_message("t", "k4321")[0].commit_log_offset == results[4321].commit_log_offset
        lag = store.dispatch_lag()
        assert lag.bytes == 0 and set(lag.sinks) == {"consume_queue", "key_index", "light_queue"}
    last: dict = {}
    for changes in arrivals:
        for key, frontier in changes.items():
            assert frontier > last.get(key, 0)
            last[key] = frontier
    assert last == {("t", q): 1000 for q in range(5)}


@pytest.mark.parametrize("workers", [0, 1])
def test_store_dispatch_workers_setting(tmp_path, workers):
    """0 builds every batch on the dispatch thread (no process); 1 starts one worker process for
    a backlog past the inline size.  Both build what the sequential dispatcher builds."""
    cfg = StoreConfig(segment_size=1 << 20, consume_queue_units=500, dispatch_workers=workers,
                      index_hash_slots=512, index_max_entries=4000)
    with MessageStore(tmp_path / "store", cfg) as store:
        store.put_batch([Message(topic="t", body=b"x" * 200, queue_id=i % 7, keys=[f"k{i}"]) for i in range(2000)])
        assert store.wait_dispatched(60)
        dispatcher = store.dispatcher
        assert len(dispatcher.worker_pids()) == workers
        assert (dispatcher.worker_batches > 0) == (workers > 0)
        assert dispatcher.inline_batches + dispatcher.worker_batches + dispatcher.trickles > 0
        assert [m.queue_offset for m in store.get("t", 3, 0, 1000).messages] == list(range(286))
        assert len(store.query_message("t", "k1999")) == 1
    log = CommitLog(tmp_path / "store" / "commitlog", 1 << 20)
    log.write_position = scan_log(log, 0).end
    sequential_build(log, tmp_path / "ref", 500, 512, 4000)
    log.close()
    assert same_tree(tmp_path / "ref" / "consumequeue", tmp_path / "store" / "consumequeue") == []
    assert same_tree(tmp_path / "ref" / "index", tmp_path / "store" / "index") == []


def test_dispatch_thread_alone_writes_known_queues_through_their_own_mappings(tmp_path, monkeypatch):
    """With no workers, every batch is built on the dispatch thread; a queue the store already
    has is written through its ConsumeQueue's mapping, so even with more queues than the
    builder's own budget of mappings no file is mapped again batch after batch."""
    keys = [(f"t{i % 5}", i // 5 % 12) for i in range(3000)]  # 60 queues, 50 entries each
    log, _ = build_log(tmp_path, keys, segment_size=1 << 20)
    middle = log.write_position // 2
    cqs = ConsumeQueueStore(tmp_path / "cq", 400)
    index = KeyIndex(tmp_path / "index", 64, 4000)
    dispatcher = ParallelDispatcher(log, cqs, index, 0, 0, batch_bytes=16 * 1024)
    builder = dispatcher.inline_builder()
    builder.max_queue_files = 16
    first = dispatcher.dispatch_until(middle)
    assert dispatcher.worker_pids() == [] and dispatcher.worker_batches == 0 and dispatcher.inline_batches > 1
    mapped = []
    real = batch_builder.map_file
    monkeypatch.setattr(batch_builder, "map_file", lambda path, *args: mapped.append(path) or real(path, *args))
    assert first + dispatcher.dispatch_until(log.write_position) == len(keys)
    assert mapped == []  # every queue (one file each) was known after the first half
    assert all(cqs.get(*key).commit_frontier == 50 for key in set(keys))
    dispatcher.close()
    cqs.close()
    index.close()
    sequential_build(log, tmp_path / "ref", 400, 64, 4000)
    assert same_tree(tmp_path / "ref" / "consumequeue", tmp_path / "cq") == []
    assert same_tree(tmp_path / "ref" / "index", tmp_path / "index") == []


def _thread_alone_over_known_queues(tmp_path: Path, monkeypatch, budget: int | None = None):
    """Dispatch 60 queues' entries with no workers, a third, then the rest; in between, with
    `MAPPINGS`' budget set to `budget` if given (else room for them all), a reader reads every
    queue.  Checks the files against one thread's and returns the files the rest asked of the
    queues (`ConsumeQueue.mapping_of`)."""
    from tidemq.store.queues import consume_queue

    monkeypatch.setattr(consume_queue.MAPPINGS, "budget", len(consume_queue.MAPPINGS) + 1000)  # whatever other tests left
    keys = [(f"t{i % 5}", i // 5 % 12) for i in range(3000)]  # 60 queues, 50 entries each
    log, _ = build_log(tmp_path, keys, segment_size=1 << 20)
    cqs = ConsumeQueueStore(tmp_path / "cq", 400)
    index = KeyIndex(tmp_path / "index", 64, 4000)
    dispatcher = ParallelDispatcher(log, cqs, index, 0, 0, batch_bytes=16 * 1024)
    builder = dispatcher.inline_builder()
    builder.max_queue_files = 16  # its own mappings of the new queues are closed, and the queues' used
    done = dispatcher.dispatch_until(log.write_position // 3)
    if budget is not None:
        monkeypatch.setattr(consume_queue.MAPPINGS, "budget", budget)
    assert all(len(cqs.get(*key).read(0, 1)) == 1 for key in set(keys))
    asked = []
    real = ConsumeQueue.mapping_of
    monkeypatch.setattr(ConsumeQueue, "mapping_of", lambda cq, start: asked.append((cq.topic, cq.queue_id, start)) or real(cq, start))
    batches = dispatcher.inline_batches
    assert done + dispatcher.dispatch_until(log.write_position) == len(keys)
    assert dispatcher.inline_batches - batches > 10
    assert all(cqs.get(*key).commit_frontier == 50 for key in set(keys))
    dispatcher.close()
    cqs.close()
    index.close()
    sequential_build(log, tmp_path / "ref", 400, 64, 4000)
    log.close()
    assert same_tree(tmp_path / "ref" / "consumequeue", tmp_path / "cq") == []
    return asked


def test_dispatch_thread_alone_asks_each_known_queue_for_its_file_once(tmp_path, monkeypatch):
    """The dispatch thread keeps the queues' mappings it was given: over the last two thirds'
    batches each queue's file is asked for once at most, not once a batch."""
    asked = _thread_alone_over_known_queues(tmp_path, monkeypatch)
    assert len(asked) == len(set(asked)) <= 60


def test_dispatch_thread_alone_keeps_no_queue_mapping_the_queues_let_go(tmp_path, monkeypatch):
    """When the queues' mappings outgrow their budget (a reader maps every queue's file), the
    dispatch thread lets go of those it kept, which would otherwise stay mapped, and the files
    are the same (bench/dispatch_resources.py prints the files the process holds mapped)."""
    asked = _thread_alone_over_known_queues(tmp_path, monkeypatch, budget=8)
    assert len(asked) > 60  # under the budget's pressure nothing is kept: asked again a batch


def test_store_refuses_a_negative_dispatch_workers_setting():
    with pytest.raises(ValueError, match="dispatch_workers must be 0"):
        StoreConfig(dispatch_workers=-1)


# ---------------------------------------------------------------------------------------------
# The whole store killed mid-dispatch


CHILD = textwrap.dedent(
    """
    import sys
    import threading
    from tidemq.store import Message, MessageStore, StoreConfig

    cfg = StoreConfig(segment_size=1024 * 1024, consume_queue_units=300, dispatch_workers=2,
                      index_hash_slots=256, index_max_entries=1500, maintenance_interval_ms=600_000)
    store = MessageStore(sys.argv[1], cfg)
    calls = []
    ready = threading.Event()

    def stop_mid_dispatch(changes):
        if store.dispatcher.workers_restarted:  # count from the replacement of the crashed worker
            calls.append(changes)
        if len(calls) == int(sys.argv[2]):
            sys.stdout.write("READY\\n")
            sys.stdout.flush()
            ready.set()
            sys.stdin.read()  # blocks the dispatch thread until the parent kills this process

    store.subscribe(stop_mid_dispatch)
    i = 0
    while not ready.is_set() and i < 100_000:
        # bursts of ~150 KB (dispatched by the workers), each mostly dispatched before the next,
        # so that the log stays small; the last burst is being appended when the kill comes
        for _ in range(100):
            store.put(Message(topic=f"t{i % 2}", body=b"y" * (500 + i % 1500), queue_id=i % 7, keys=[f"k{i}", f"g{i % 13}"]))
            i += 1
        target = store.commit_log.write_position
        while store.dispatcher.dispatched_offset < target and not ready.wait(0.001):
            pass
        if i == 300:
            # one checkpoint early on: the index files written after it are newer than its
            # index time, and recovery destroys and rebuilds them (spec 6)
            store.save_checkpoint()
    sys.stdout.write("PUT\\n")
    sys.stdout.flush()
    sys.stdin.read()
    """
)


def test_store_killed_mid_dispatch_rebuilds_indexes_exactly(tmp_path):
    """One worker dies mid-batch, then the whole store (and its workers) is killed while the
    dispatch thread is between batches; reopening rebuilds both indexes exactly."""
    store_dir = tmp_path / "store"
    env = dict(os.environ, **{CRASH_ENV: f"40:{tmp_path / 'worker-crashed'}"})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store_dir), "3"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT, text=True, start_new_session=True, env=env,
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == "READY"
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the store and its dispatch workers, all at once
        child.wait()
    assert (store_dir / "abort").exists()
    assert (tmp_path / "worker-crashed").exists()
    cfg = StoreConfig(segment_size=1024 * 1024, consume_queue_units=300, dispatch_workers=2,
                      index_hash_slots=256, index_max_entries=1500)
    with MessageStore(store_dir, cfg) as store:
        assert store.recovery.abnormal
        assert store.wait_dispatched(60)
        keys_seen = {}
        for topic, queue_id in store.queues():
            got = store.get(topic, queue_id, 0, 100_000)
            assert [m.queue_offset for m in got.messages] == list(range(store.max_offset(topic, queue_id)))
            for m in got.messages:
                assert m.keys[0] not in keys_seen  # no message visible twice
                keys_seen[m.keys[0]] = m
        total = len(keys_seen)
        assert total > 0
        for name in list(keys_seen)[:: max(1, total // 50)]:
            m = keys_seen[name]
            assert [r.commit_log_offset for r in store.query_message(m.topic, name)] == [m.commit_log_offset]
    # the indexes equal a from-scratch single-thread build of the recovered log
    log = CommitLog(store_dir / "commitlog")
    log.write_position = max(s.end for s in log.segments)
    from tidemq.store.recovery.recover import scan_log

    log.write_position = scan_log(log, 0).end
    sequential_build(log, tmp_path / "rebuilt", units=300, slots=256, entries=1500)
    log.close()
    for sub in ("consumequeue", "index"):
        assert same_tree(tmp_path / "rebuilt" / sub, store_dir / sub) == []


def test_recovery_restarts_below_an_unfinished_batch_when_later_ones_are_written(tmp_path):
    """A crash while batch 0 is unfinished but the later batches are written and committed: the
    queues' furthest entries lie past batch 0, so their maximum says nothing; recovery restarts
    from the checkpoint's dispatched offset and every entry of batch 0 is built, none twice."""
    from tidemq.store.log.checkpoint import Checkpoint

    store_dir = tmp_path / "store"
    layout = [("p", 0)] * 40 + [(f"t{i % 2}", i % 6) if i % 5 else ("p", 0) for i in range(600)]
    log, assigned = build_log(store_dir, layout, segment_size=1 << 20)
    cqs = ConsumeQueueStore(store_dir / "consumequeue", 300)
    coordinator = Coordinator(3, 0, batch_bytes=4000, inline_bytes=0, index=False)
    sent = cut_all(log, coordinator, log.write_position)
    builder = BatchBuilder(str(cqs.root), 300, False)
    for command in sent[1:]:
        assert coordinator.answered(command.worker, builder.build(command.task)) == []  # batch 0 never answered
    builder.close()
    cqs.close()
    on_disk = ConsumeQueueStore(store_dir / "consumequeue", 300)
    assert on_disk.covered_offset() > sent[0].task.end  # the sequential rule would restart past batch 0
    on_disk.close()
    Checkpoint(confirm_phy_offset=0).save(store_dir / "checkpoint")  # nothing was committed
    (store_dir / "abort").write_text("1")  # the process died
    log.close()
    cfg = StoreConfig(segment_size=1 << 20, consume_queue_units=300, dispatch_workers=2, message_index_enable=False)
    with MessageStore(store_dir, cfg) as store:
        assert store.recovery.abnormal and store.recovery.redispatched_from == 0
        for (topic, queue_id), count in assigned.items():
            got = store.get(topic, queue_id, 0, 10_000)
            assert [m.queue_offset for m in got.messages] == list(range(count))
            assert [m.properties[record.PROPERTY_UNIQ_KEY] for m in got.messages] == [
                f"UNIQ{i:012d}" for i, key in enumerate(layout) if key == (topic, queue_id)
            ]
    fresh = CommitLog(store_dir / "commitlog")
    fresh.write_position = log.write_position
    sequential_build(fresh, tmp_path / "reference", units=300)
    fresh.close()
    assert same_tree(tmp_path / "reference" / "consumequeue", store_dir / "consumequeue") == []


def test_a_record_workers_cannot_decode_stops_dispatch_there(tmp_path, caplog):
    """Damage the header walk cannot see (a PHYSICALOFFSET that lies): dispatch stops at that
    record, reports it, and goes on stopping there instead of skipping it or crashing."""
    log, _ = build_log(tmp_path / "log", [("t", i % 3) for i in range(400)], segment_size=1 << 20)
    offsets = []
    offset = 0
    while offset < log.write_position:
        rec = log.read_record(offset, check_crc=False)
        offsets.append(offset)
        offset += rec.total_size
    bad = offsets[250]
    segment = log.segment_for(bad)
    segment.mm[bad + 28 : bad + 36] = (bad + 1).to_bytes(8, "big")  # PHYSICALOFFSET
    cqs = ConsumeQueueStore(tmp_path / "cq", 1000)
    dispatcher = ParallelDispatcher(log, cqs, None, 0, 2, batch_bytes=3000, inline_bytes=0)
    try:
        dispatcher.dispatch_until(log.write_position)
        assert dispatcher.dispatched_offset == bad
        assert f"dispatch stopped at commit-log offset {bad}" in caplog.text
        assert dispatcher.dispatch_until(log.write_position) == 0
        assert dispatcher.dispatched_offset == bad
        # the entries before the damaged record are all visible, in order
        for q in range(3):
            units = cqs.queues[("t", q)].read(0, 1000)
            assert [u.queue_offset for u in units] == list(range(len(units)))
            assert len(units) >= sum(1 for i in range(250) if i % 3 == q)  # records before the damage
    finally:
        dispatcher.close()
        cqs.close()


def test_other_sinks_get_every_request_in_log_order(tmp_path):
    log, _ = build_log(tmp_path / "log", [(f"t{i % 2}", i % 5) for i in range(500)], segment_size=16 * 1024)

    class Recorder:
        name = "recorder"

        def __init__(self) -> None:
            self.offsets: list[int] = []

        def dispatch(self, requests, changes) -> None:
            self.offsets.extend(r.commit_log_offset for r in requests)

    cqs = ConsumeQueueStore(tmp_path / "cq", 1000)
    dispatcher = ParallelDispatcher(log, cqs, None, 0, 2, batch_bytes=2000, inline_bytes=0)
    recorder = Recorder()
    dispatcher.add_sink(recorder)
    try:
        dispatcher.dispatch_until(log.write_position)
    finally:
        dispatcher.close()
        cqs.close()
    expected = []
    reference = Dispatcher(log, [], 0)
    reference.sinks = [type("S", (), {"name": "s", "dispatch": lambda self, reqs, ch: expected.extend(r.commit_log_offset for r in reqs)})()]
    reference.dispatch_until(log.write_position)
    assert recorder.offsets == expected and len(expected) == 500


def test_a_sink_that_refuses_a_run_gets_it_again_and_the_offset_waits_for_it(tmp_path):
    log, _ = build_log(tmp_path / "log", [(f"t{i % 2}", i % 5) for i in range(500)], segment_size=16 * 1024)
    expected: list[int] = []
    reference = Dispatcher(log, [], 0)
    reference.sinks = [type("S", (), {"name": "s", "dispatch": lambda self, reqs, ch: expected.extend(r.commit_log_offset for r in reqs)})()]
    reference.dispatch_until(log.write_position)

    class Refusing:
        """Takes every run but refuses each third call once (as a full disk refuses a write)."""

        name = "refusing"

        def __init__(self) -> None:
            self.offsets: list[int] = []
            self.calls = 0

        def dispatch(self, requests, changes) -> None:
            self.calls += 1
            if self.calls % 3 == 0:
                raise OSError(28, "No space left on device")
            self.offsets.extend(r.commit_log_offset for r in requests)

    cqs = ConsumeQueueStore(tmp_path / "cq", 1000)
    dispatcher = ParallelDispatcher(log, cqs, None, 0, 2, batch_bytes=2000, inline_bytes=0)
    sink = Refusing()
    dispatcher.add_sink(sink)
    refused = 0
    try:
        for _ in range(1000):
            if dispatcher.dispatched_offset == log.write_position:
                break
            try:
                dispatcher.dispatch_until(log.write_position)
            except OSError:
                refused += 1
                first_missing = expected[len(sink.offsets)]
                assert dispatcher.dispatched_offset <= first_missing  # never past a record the sink lacks
    finally:
        dispatcher.close()
        cqs.close()
    assert refused > 0
    assert sink.offsets == expected and len(expected) == 500  # each once, in log order
