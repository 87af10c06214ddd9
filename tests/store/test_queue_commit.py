"""Committing a parallel-dispatch batch's runs of slots (`queue_commit`): the compiled row index
and its Python twin agree, and the committer advances, starts and reports queues the same with
either."""

from __future__ import annotations

import numpy as np
import pytest

from tidemq.store.dispatch import commit as queue_commit
from tidemq.store.dispatch.commit import PythonRowIndex, QueueCommitter
from tidemq.store.dispatch.messages import QueueRuns
from tidemq.store.queues.queue_set import ConsumeQueueStore

UNITS = 1000


def test_the_compiled_row_index_is_built():
    assert queue_commit._RowIndex is not None, "tidemq/store/_dispatch.c was not compiled at install"


def _indexes():
    return [queue_commit._RowIndex(), PythonRowIndex()]


def test_row_index_keeps_rows_by_code_as_it_grows():
    for index in _indexes():
        codes = [(t << 32) | q for t in range(40) for q in range(0, 5000, 3)] + [(7 << 32) | 0xFFFFFFFF]
        for row, code in enumerate(codes):
            index.set(code, row)
        index.set(codes[5], 99)  # a queue given another row
        assert len(index) == len(codes)
        assert [index.get(code) for code in codes] == [99 if i == 5 else i for i in range(len(codes))]
        assert index.get((40 << 32) | 1) == -1
        with pytest.raises(ValueError, match="not negative"):
            index.set(1, -1)


@pytest.mark.parametrize("seed", range(20))
def test_compiled_and_python_advance_agree(seed):
    rng = np.random.default_rng(seed)
    topics = int(rng.integers(1, 6))
    numbers = rng.permutation(np.arange(topics, dtype=np.int64) * 3)  # the committer's numbers for the batch's topic ids
    queues = [(t, q) for t in range(topics) for q in range(60)]
    picked = rng.choice(len(queues), size=min(len(queues), int(rng.integers(1, 200))), replace=False)
    topic_ids = np.array([queues[i][0] for i in picked], dtype=np.int32)
    queue_ids = np.array([queues[i][1] for i in picked], dtype=np.int32)
    negative = rng.random(len(picked)) < 0.05
    queue_ids[negative] = -1 - queue_ids[negative]  # read as unsigned: 2**32 - 1 - q
    codes = [(int(numbers[t]) << 32) | (q & 0xFFFFFFFF) for t, q in zip(topic_ids.tolist(), queue_ids.tolist())]
    # most runs' queues have rows (each its own, in any order), some not
    table = len(codes) + int(rng.integers(0, 20))
    known = {code: int(row) for code, row in zip(codes, rng.permutation(table)) if rng.random() < 0.8}
    frontiers = rng.integers(0, 50, table).astype(np.int64)
    files_end = frontiers + rng.integers(-5, 60, table)
    pending = rng.random(table) < 0.1
    # most runs start at their row's frontier, some not
    at_frontier = frontiers[[known.get(code, 0) for code in codes]]
    firsts = np.where(rng.random(len(picked)) < 0.8, at_frontier, rng.integers(0, 60, len(picked))).astype(np.int64)
    counts = rng.integers(1, 8, len(picked)).astype(np.int64)
    skip = (rng.random(len(picked)) < 0.1) if seed % 2 else None
    results = []
    for index in _indexes():
        for code, row in known.items():
            index.set(code, row)
        table_frontiers = frontiers.copy()
        rows = np.full(len(picked), 12345, dtype=np.int64)
        left = index.advance(numbers, topic_ids, queue_ids, firsts, counts, table_frontiers, files_end, pending, skip, rows)
        results.append((left, rows, table_frontiers))
    (left_c, rows_c, frontiers_c), (left_p, rows_p, frontiers_p) = results
    assert left_c == left_p == int(np.count_nonzero(rows_c < 0))
    assert np.array_equal(rows_c, rows_p)
    assert np.array_equal(frontiers_c, frontiers_p)
    expected = np.array([known.get(code, -1) for code in codes])
    fast = rows_c >= 0
    assert np.array_equal(np.where(fast, rows_c, -2 - rows_c), expected)
    assert np.array_equal(frontiers_c[rows_c[fast]], (firsts + counts)[fast])
    assert np.array_equal(fast, (expected >= 0) & (frontiers[expected] == firsts) & ~pending[expected]
                          & (firsts + counts <= files_end[expected]) & (True if skip is None else ~skip))
    untouched = np.setdiff1d(np.arange(table), rows_c[fast])
    assert np.array_equal(frontiers_c[untouched], frontiers[untouched])


def test_advance_refuses_what_does_not_fit():
    frontiers, files_end, pending = np.zeros(4, np.int64), np.full(4, 100, np.int64), np.zeros(4, bool)
    one = np.ones(1, np.int64)
    for index in _indexes():
        index.set(0, 9)
        rows = np.zeros(1, np.int64)
        with pytest.raises(ValueError, match="topic id 1 of 1"):
            index.advance(np.zeros(1, np.int64), np.ones(1, np.int32), np.zeros(1, np.int32), one, one, frontiers, files_end,
                          pending, None, rows)
        with pytest.raises(ValueError, match="row 9, past the table's 4"):
            index.advance(np.zeros(1, np.int64), np.zeros(1, np.int32), np.zeros(1, np.int32), one, one, frontiers, files_end,
                          pending, None, rows)
    with pytest.raises(ValueError, match="topic_ids must be a contiguous column of 1 4-byte items"):
        queue_commit._RowIndex().advance(np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int32), one, one,
                                         frontiers, files_end, pending, None, np.zeros(1, np.int64))


def _runs(entries, extras=None):
    """QueueRuns of (topic, queue id, first slot, count)."""
    names = sorted({topic for topic, _, _, _ in entries})
    return QueueRuns(names, np.array([names.index(t) for t, _, _, _ in entries], np.int32),
                     np.array([q for _, q, _, _ in entries], np.int32), np.array([f for _, _, f, _ in entries], np.int64),
                     np.array([c for _, _, _, c in entries], np.int64), extras or {})


@pytest.mark.parametrize("compiled", [True, False])
def test_committer_starts_advances_and_reports_queues(tmp_path, monkeypatch, compiled):
    if not compiled:
        monkeypatch.setattr(queue_commit, "_RowIndex", None)
    store = ConsumeQueueStore(tmp_path / "cq", UNITS)
    committer = QueueCommitter(store)
    frontier = lambda topic, queue_id: store.queues[(topic, queue_id)].commit_frontier  # noqa: E731

    # a batch starting many queues at their first slot, and one starting mid-file
    changes = {}
    committer.commit(_runs([("a", q, 0, 3) for q in range(50)] + [("b", 0, 5, 2)]), changes, True)
    assert changes == {**{("a", q): 3 for q in range(50)}, ("b", 0): 7}
    assert [frontier("a", q) for q in range(50)] == [3] * 50 and frontier("b", 0) == 7

    # runs at their frontiers advance together; a run past its frontier waits; one with extras
    # (slots that do not continue its run) commits them too
    changes = {}
    committer.commit(_runs([("a", q, 3, 2) for q in range(49)] + [("a", 49, 6, 1), ("b", 0, 7, 1)], {50: [9]}), changes, True)
    assert changes == {("a", q): 5 for q in range(49)} | {("b", 0): 8}
    assert frontier("a", 49) == 3 and frontier("b", 0) == 8
    committer.commit(_runs([("a", 1, 5, 1), ("a", 49, 3, 3), ("b", 0, 8, 1)]), changes := {}, False)
    # those whose waiting slots joined are reported; those advanced together only to listeners
    assert changes == {("a", 49): 7, ("b", 0): 10}
    assert frontier("a", 1) == 6 and frontier("a", 49) == 7 and frontier("b", 0) == 10

    # a run crossing into the queue's next file is committed one by one, its file mapped
    committer.commit(_runs([("a", 0, 5, UNITS)]), changes := {}, True)
    assert changes == {("a", 0): UNITS + 5} and frontier("a", 0) == UNITS + 5
    committer.commit(_runs([("a", 0, UNITS + 5, 1)]), changes := {}, True)
    assert changes == {("a", 0): UNITS + 6}


@pytest.mark.parametrize("compiled", [True, False])
def test_committer_adopts_new_queues_together_beside_queues_loaded_from_disk(tmp_path, monkeypatch, compiled):
    if not compiled:
        monkeypatch.setattr(queue_commit, "_RowIndex", None)
    units = 4
    first = ConsumeQueueStore(tmp_path / "cq", units)
    for q in range(3):  # queue 0 fills its first file; 1 and 2 stop inside it
        cq = first.get_or_create("old", q)
        for slot in range(units if q == 0 else 2):
            cq.put(slot, 1000 * q + 100 * slot, 100, 0)
    first.close()
    store = ConsumeQueueStore(tmp_path / "cq", units)  # the three loaded, unknown to a new committer
    committer = QueueCommitter(store)
    loaded = {q: store.queues[("old", q)] for q in range(3)}
    runs = ([("new", q, 0, 2) for q in range(30)] + [("late", 0, 8, 3)]
            + [("old", 0, units, 2), ("old", 1, 2, 1), ("old", 2, 3, 1)])
    committer.commit(_runs(runs), changes := {}, True)
    # the loaded queues kept their objects: one moved past its file into the next, one moved
    # inside it, and the one whose run starts past its frontier waits
    assert all(store.queues[("old", q)] is loaded[q] for q in range(3))
    assert changes == {**{("new", q): 2 for q in range(30)}, ("late", 0): 11, ("old", 0): units + 2, ("old", 1): 3}
    assert [loaded[q].commit_frontier for q in range(3)] == [units + 2, 3, 2]
    assert [qf.start for qf in loaded[0]._files] == [0, units]
    late = store.queues[("late", 0)]
    assert (late.min_offset, late.commit_frontier, [qf.start for qf in late._files]) == (8, 11, [8])
    new = [store.queues[("new", q)] for q in range(30)]
    assert len({cq.row for cq in new + list(loaded.values()) + [late]}) == 34
    assert all(cq.min_offset == 0 and cq.commit_frontier == 2 and cq._files[0].path == f"{tmp_path}/cq/new/{cq.queue_id}/{0:020d}"
               and cq._files[0]._mm is None for cq in new)
    # every queue is known now: the next batch's runs at their frontiers advance together, and
    # reach the queue objects readers hold
    committer.commit(_runs([("new", q, 2, 1) for q in range(30)] + [("late", 0, 11, 1), ("old", 0, units + 2, 1),
                                                                       ("old", 1, 3, 1)]), changes := {}, True)
    assert changes == {**{("new", q): 3 for q in range(30)}, ("late", 0): 12, ("old", 0): units + 3, ("old", 1): 4}
    assert [cq.commit_frontier for cq in new] == [3] * 30 and loaded[1].commit_frontier == 4
    # the waiting slot of old/2 joins when its gap fills
    committer.commit(_runs([("old", 2, 2, 1)]), changes := {}, True)
    assert changes == {("old", 2): 4}
