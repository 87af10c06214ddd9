"""Dispatch of a trickle (a few records per round, as at light load): built on the dispatching
thread without the batch machinery, into the same files the batch path and the sequential
dispatcher write."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from trees import same_tree

from tidemq.store import record
from tidemq.store.dispatch.parallel import ParallelDispatcher
from tidemq.store.dispatch.sequential import Dispatcher
from tidemq.store.dispatch.trickle import MAX_RECORDS
from tidemq.store.index.key_index import KeyIndex
from tidemq.store.log.commit_log import CommitLog
from tidemq.store.queues.queue_set import ConsumeQueueStore

KINDS = [record.TRANSACTION_NOT] * 6 + [record.TRANSACTION_PREPARED, record.TRANSACTION_COMMIT, record.TRANSACTION_ROLLBACK]
LONG_TOPIC = "v2-" + "x" * 140  # more than 127 bytes: the v2 layout


def mixed_log(directory: Path, count: int, seed: int, segment_size: int = 4096) -> tuple[CommitLog, dict, list[int]]:
    """Records of several kinds (transaction states, a v2 topic, IPv6 hosts, with and without
    tags and keys) in small segments (so blanks close them); returns the log, each queue's
    entry count, and every record's end offset."""
    rng = random.Random(seed)
    log = CommitLog(directory / "commitlog", segment_size)
    assigned: dict[tuple[str, int], int] = {}
    ends = []
    for i in range(count):
        topic = rng.choice(["a", "b", LONG_TOPIC])
        queue_id = rng.randrange(3)
        kind = rng.choice(KINDS)
        properties = {record.PROPERTY_UNIQ_KEY: f"U{seed}-{i:08d}"}
        if rng.random() < 0.7:
            properties[record.PROPERTY_TAGS] = rng.choice(["paid", "sent", "ÿ-tag"])
        if rng.random() < 0.6:
            properties[record.PROPERTY_KEYS] = " ".join(f"k{rng.randrange(50)}" for _ in range(rng.randrange(1, 4)))
        born = ("::1", 4000) if rng.random() < 0.3 else ("127.0.0.1", 4000)
        store = ("fe80::2", 10911) if rng.random() < 0.2 else ("127.0.0.1", 10911)
        encoded = record.prepare(topic=topic, body=b"b%d" % i * rng.randrange(1, 30), queue_id=queue_id,
                                 properties_bytes=record.encode_properties(properties), store_host=store,
                                 born_host=born, born_timestamp=1_700_000_000_000 + i, sysflag=kind)
        takes_offset = kind in (record.TRANSACTION_NOT, record.TRANSACTION_COMMIT)
        key = (topic, queue_id)
        offset = assigned.get(key, 0) if takes_offset else 0
        log.append(encoded, offset, 1_700_000_000_000 + 3 * i)
        ends.append(log.write_position)
        if takes_offset:
            assigned[key] = offset + 1
    return log, assigned, ends


def build(log: CommitLog, out: Path, dispatcher_of, stops: list[int]):
    queues = ConsumeQueueStore(out / "consumequeue", 8)
    index = KeyIndex(out / "index", 16, 40)
    dispatcher = dispatcher_of(queues, index)
    announced: dict = {}

    def listener(changes) -> None:
        for key, frontier in changes.items():
            assert frontier > announced.get(key, 0), "a listener was told of nothing new"
            # announced entries are readable, in order, with no gap
            units = queues.queues[key].read(0, 10_000)
            assert [u.queue_offset for u in units] == list(range(len(units))) and len(units) >= frontier
            announced[key] = frontier

    dispatcher.listeners.append(listener)
    dispatched = sum(dispatcher.dispatch_until(stop) for stop in stops)
    queues.close()
    index.close()
    return dispatcher, dispatched, announced


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rounds_of_a_few_records_build_the_files_of_the_sequential_dispatcher(tmp_path, seed):
    log, assigned, ends = mixed_log(tmp_path / "log", 300, seed)
    assert len(log.segments) > 5  # rounds cross blanks
    build(log, tmp_path / "sequential", lambda queues, index: Dispatcher(log, [queues, index], 0), [log.write_position])
    rng = random.Random(seed)
    stops, i = [], 0
    while i < len(ends):  # rounds of 1 to MAX_RECORDS records, as a light stream of sends makes them
        i = min(len(ends), i + rng.randrange(1, MAX_RECORDS + 1))
        stops.append(ends[i - 1])
    dispatcher, dispatched, announced = build(
        log, tmp_path / "trickled", lambda queues, index: ParallelDispatcher(log, queues, index, 0, 2, inline_bytes=0), stops
    )
    try:
        assert dispatched == len(ends)
        assert dispatcher.dispatched_offset == log.write_position
        assert dispatcher.trickles >= len(stops) and dispatcher.inline_batches == 0 and dispatcher.worker_batches == 0
        assert not dispatcher.worker_pids()  # no process was started for a trickle
        assert announced == assigned
        assert same_tree(tmp_path / "sequential", tmp_path / "trickled") == []
    finally:
        dispatcher.close()


def test_more_than_a_trickle_goes_the_batch_way(tmp_path):
    log, _, ends = mixed_log(tmp_path / "log", MAX_RECORDS + 1, 9, segment_size=1 << 20)
    dispatcher, dispatched, _ = build(
        log, tmp_path / "out", lambda queues, index: ParallelDispatcher(log, queues, index, 0, 2), [log.write_position]
    )
    try:
        assert dispatched == MAX_RECORDS + 1
        assert dispatcher.trickles == 0 and dispatcher.inline_batches == 1
    finally:
        dispatcher.close()


def test_a_trickle_stops_at_a_damaged_record_and_the_batch_path_reports_it(tmp_path, caplog):
    log, _, ends = mixed_log(tmp_path / "log", 6, 4, segment_size=1 << 20)
    bad = ends[2]  # the fourth record: its PHYSICALOFFSET lies
    log.segment_for(bad).mm[bad + 28 : bad + 36] = (bad + 1).to_bytes(8, "big")
    dispatcher, dispatched, _ = build(
        log, tmp_path / "out", lambda queues, index: ParallelDispatcher(log, queues, index, 0, 2), [log.write_position]
    )
    try:
        assert dispatched == 3 and dispatcher.dispatched_offset == bad
        assert f"dispatch stopped at commit-log offset {bad}" in caplog.text
    finally:
        dispatcher.close()
