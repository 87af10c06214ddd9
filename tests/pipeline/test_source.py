"""The tidemq-commitlog data source: every column, ranges, offsets, pruning, brokers, damage."""

from __future__ import annotations

import logging
import shutil

import pytest
from pipeline_logs import LONG_TOPIC, sample_messages, write_store

from tidemq.pipeline import CorruptLogError
from tidemq.pipeline import plan as planning
from tidemq.pipeline.columns import COLUMN_NAMES, SCHEMA, select_schema
from tidemq.pipeline.errors import job_errors
from tidemq.pipeline.rebuild import rebuild
from tidemq.pipeline.source import ReadSettings, read_range
from tidemq.store import record
from tidemq.store.format.special_queues import DELAY_LEVELS_MS, SCHEDULE_TOPIC

SMALL = str(24 * 1024)


def read(spark, path, **options):
    reader = spark.read.format("tidemq-commitlog").option("partitionSize", SMALL)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load(path)


def test_every_column_of_every_record(spark, written_store):
    store, messages, results = written_store
    df = read(spark, str(store)).selectExpr("*", "unix_millis(born_timestamp) AS born_ms", "unix_millis(store_timestamp) AS store_ms")
    rows = sorted(df.collect(), key=lambda r: r.commit_log_offset)
    assert len(rows) == len(messages)
    assert any(r.topic == LONG_TOPIC for r in rows)
    assert any(r.topic == SCHEDULE_TOPIC for r in rows)
    for row, message, result in zip(rows, messages, results):
        assert row.broker == store.name
        assert (row.commit_log_offset, row.size, row.queue_offset) == (result.commit_log_offset, result.size, result.queue_offset)
        assert (row.topic, row.queue_id, row.tags) == (message.topic, message.queue_id, message.tags)
        if message.topic == SCHEDULE_TOPIC:  # as its ConsumeQueue unit: when it is due
            assert row.tags_code == result.store_timestamp + DELAY_LEVELS_MS[int(message.properties["DELAY"]) - 1]
        else:
            assert row.tags_code == record.tags_code(message.tags)
        assert row.keys == (message.keys or [])
        assert row.unique_key == result.unique_key
        assert row.properties.get("trace") == message.properties.get("trace")
        assert bytes(row.body) == message.body
        assert row.store_ms == result.store_timestamp and row.born_ms > 0
        address, port = message.born_host
        assert row.born_host == (f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
        assert row.store_host == "127.0.0.1:10911"
        assert row.sysflag & record.TRANSACTION_TYPE_MASK == message.sysflag
        assert row.reconsume_times == message.reconsume_times


def test_ranges_are_record_aligned_and_split_segments(written_store):
    store, _, results = written_store
    logs = planning.resolve([str(store)])
    ranges = planning.plan(logs, 8 * 1024)
    starts = {r.commit_log_offset for r in results}
    segments = {r.segment_start for r in ranges}
    assert len(ranges) > 3 * len(segments)  # many tasks per segment
    for part in ranges:
        assert part.lo in starts or part.lo == part.segment_start
        assert part.hi - part.segment_start <= 64 * 1024
    # consecutive ranges of a segment meet exactly
    for a, b in zip(ranges, ranges[1:]):
        if a.segment_start == b.segment_start:
            assert a.hi == b.lo


def test_offset_range_options(spark, written_store):
    store, _, results = written_store
    lo, hi = results[100].commit_log_offset, results[900].commit_log_offset
    offsets = [r.commit_log_offset for r in read(spark, str(store), startOffset=lo + 1, endOffset=hi).select("commit_log_offset").collect()]
    assert sorted(offsets) == [r.commit_log_offset for r in results[101:900]]


def test_column_pruning_by_option_and_by_schema(spark, written_store):
    store, messages, _ = written_store
    df = read(spark, str(store), columns="topic,commit_log_offset,size")
    assert df.columns == ["commit_log_offset", "size", "topic"]
    assert df.count() == len(messages)
    df = spark.read.format("tidemq-commitlog").schema("queue_id int, topic string").load(str(store))
    assert sorted(df.groupBy("topic").count().collect()) == sorted(
        (t, sum(1 for m in messages if m.topic == t)) for t in {m.topic for m in messages}
    )
    with pytest.raises(Exception, match="no column"):
        read(spark, str(store), columns="topic,nope").schema


def test_a_read_without_body_never_copies_one(written_store, monkeypatch):
    store, messages, _ = written_store
    calls = []
    real_decode = record.decode

    def spy(*args, **kwargs):
        calls.append((kwargs["read_body"], kwargs["read_properties"]))
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(record, "decode", spy)
    settings = ReadSettings({}, select_schema(["topic", "queue_offset"]))
    part = planning.plan(planning.resolve([str(store)]), 1 << 20)[0]
    batches = list(read_range(part, settings))
    assert batches and batches[0].schema.names == ["topic", "queue_offset"]
    assert set(calls) == {(False, False)}
    settings = ReadSettings({}, select_schema(["tags", "body"]))
    calls.clear()
    list(read_range(part, settings))
    assert set(calls) == {(True, True)}


def test_arrow_and_row_output_agree(spark, written_store):
    store, _, _ = written_store
    arrow = read(spark, str(store), endOffset=20000).collect()
    rows = read(spark, str(store), endOffset=20000, output="rows").collect()
    assert sorted(arrow) == sorted(rows) and len(arrow) > 50
    assert SCHEMA.fieldNames() == COLUMN_NAMES


def test_several_brokers(spark, written_store, tmp_path):
    store, messages, _ = written_store
    other = tmp_path / "broker-z"
    write_store(other, sample_messages(40, seed=9))
    df = spark.read.format("tidemq-commitlog").load([str(store), str(other / "commitlog")])
    counts = dict(df.groupBy("broker").count().collect())
    assert counts == {store.name: len(messages), "broker-z": 40}
    named = spark.read.format("tidemq-commitlog").option("brokers", "a,b").load([str(store), str(other)])
    assert sorted(dict(named.groupBy("broker").count().collect())) == ["a", "b"]


def _copy(store, tmp_path, name):
    copy = tmp_path / name
    shutil.copytree(store / "commitlog", copy / "commitlog")
    return copy


def test_a_torn_tail_ends_the_read_at_the_last_valid_record(spark, written_store, tmp_path, caplog):
    store, messages, results = written_store
    copy = _copy(store, tmp_path, "torn")
    last = results[-1]
    segment = copy / "commitlog" / f"{last.commit_log_offset - last.commit_log_offset % (64 * 1024):020d}"
    data = bytearray(segment.read_bytes())
    pos = last.commit_log_offset % (64 * 1024)
    data[pos + 100 : pos + last.size] = bytes(last.size - 100)  # the crash left the rest unwritten
    segment.write_bytes(bytes(data))

    df = read(spark, str(copy), columns="commit_log_offset")
    assert df.count() == len(messages) - 1
    bad = planning.tail_damage(planning.resolve([str(copy)])[0])
    assert bad is not None and bad.offset == last.commit_log_offset
    caplog.set_level(logging.WARNING, logger="tidemq.pipeline")
    settings = ReadSettings({}, select_schema(["commit_log_offset"]))
    part = [p for p in planning.plan(planning.resolve([str(copy)]), 1 << 20) if p.lo <= last.commit_log_offset < p.hi][0]
    got = [o for b in read_range(part, settings) for o in b.column(0).to_pylist()]
    assert got[-1] == results[-2].commit_log_offset
    assert f"torn tail at commit-log offset {last.commit_log_offset}" in caplog.text
    # a job says so in its report, and indexes nothing past the last valid record
    report = rebuild(spark, copy, tmp_path / "out", units_per_file=100, key_index=False, partition_size="32k")
    assert [m for m in report.messages if f"torn tail at commit-log offset {last.commit_log_offset}" in m]
    assert report.entries == sum(1 for m in messages[:-1] if m.sysflag & 0xC in (0, 8))


def test_a_corrupt_record_in_the_middle_stops_the_read_with_an_error(spark, written_store, tmp_path):
    store, _, results = written_store
    copy = _copy(store, tmp_path, "corrupt")
    victim = next(r for r in results[300:] if r.size > 200)
    segment = copy / "commitlog" / f"{victim.commit_log_offset - victim.commit_log_offset % (64 * 1024):020d}"
    data = bytearray(segment.read_bytes())
    data[victim.commit_log_offset % (64 * 1024) + 120] ^= 0xFF  # a bit flip in the body
    segment.write_bytes(bytes(data))

    with pytest.raises(CorruptLogError, match=f"corrupt record at commit-log offset {victim.commit_log_offset}"):
        with job_errors():
            read(spark, str(copy), columns="commit_log_offset").count()
    before = read(spark, str(copy), columns="commit_log_offset", endOffset=victim.commit_log_offset)
    assert before.count() == results.index(victim)
