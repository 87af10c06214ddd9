"""The streaming reader tails a live store: offsets are commit-log positions."""

from __future__ import annotations

import json

import pytest
from pipeline_logs import sample_messages, store_config

from tidemq.store import MessageStore


def offsets(spark, table: str) -> list[int]:
    return sorted(r.commit_log_offset for r in spark.sql(f"SELECT commit_log_offset FROM {table}").collect())


def test_the_stream_sees_records_appended_while_it_runs(spark, tmp_path):
    store = MessageStore(tmp_path / "live", store_config())
    query = None
    try:
        written = [store.put(m).commit_log_offset for m in sample_messages(200)]
        stream = (
            spark.readStream.format("tidemq-commitlog")
            .option("columns", "commit_log_offset,topic,queue_offset")
            .option("partitionSize", "32k")
            .load(str(tmp_path / "live"))
        )
        query = stream.writeStream.format("memory").queryName("tail").start()
        query.processAllAvailable()
        assert offsets(spark, "tail") == written

        # appended while the query runs, across segment rolls
        written += [store.put(m).commit_log_offset for m in sample_messages(400, seed=1)]
        query.processAllAvailable()
        assert offsets(spark, "tail") == written
    finally:
        if query is not None:
            query.stop()
        store.close()


def test_available_now_resumes_from_its_checkpoint_in_bounded_batches(spark, tmp_path):
    store = MessageStore(tmp_path / "live2", store_config())
    checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")

    def run() -> list[int]:
        stream = (
            spark.readStream.format("tidemq-commitlog")
            .option("columns", "commit_log_offset")
            .option("maxBytesPerTrigger", "40k")
            .load(str(tmp_path / "live2"))
        )
        query = stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
        query = query.trigger(availableNow=True).start()
        query.awaitTermination()
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    try:
        first = [store.put(m).commit_log_offset for m in sample_messages(300)]
        batches = run()
        assert len(batches) >= 2 and sum(batches) == len(first)  # bounded micro-batches

        more = [store.put(m).commit_log_offset for m in sample_messages(100, seed=2)]
        assert sum(run()) == len(more)  # only what was appended since
        got = sorted(r.commit_log_offset for r in spark.read.parquet(out).collect())
        assert got == first + more
    finally:
        store.close()


def test_latest_start_and_several_brokers(spark, tmp_path):
    a = MessageStore(tmp_path / "a", store_config())
    b = MessageStore(tmp_path / "b", store_config())
    query = None
    try:
        for m in sample_messages(50):
            a.put(m)
        stream = (
            spark.readStream.format("tidemq-commitlog")
            .option("columns", "broker,commit_log_offset")
            .option("startingOffsets", "latest")
            .option("paths", json.dumps([str(tmp_path / "a"), str(tmp_path / "b")]))  # readStream.load takes one path
            .load()
        )
        query = stream.writeStream.format("memory").queryName("brokers").start()
        query.processAllAvailable()
        assert spark.sql("SELECT * FROM brokers").count() == 0  # what was there before is skipped
        new_a = [a.put(m).commit_log_offset for m in sample_messages(30, seed=4)]
        new_b = [b.put(m).commit_log_offset for m in sample_messages(20, seed=5)]
        query.processAllAvailable()
        rows = spark.sql("SELECT broker, commit_log_offset FROM brokers").collect()
        assert sorted(r.commit_log_offset for r in rows if r.broker == "a") == new_a
        assert sorted(r.commit_log_offset for r in rows if r.broker == "b") == new_b
    finally:
        if query is not None:
            query.stop()
        a.close()
        b.close()


def test_a_numeric_start_must_be_where_a_record_starts(spark, tmp_path):
    with MessageStore(tmp_path / "n", store_config()) as store:
        written = [store.put(m) for m in sample_messages(40)]
    end = written[-1].commit_log_offset + written[-1].size

    def run(start) -> list[int]:
        stream = (
            spark.readStream.format("tidemq-commitlog")
            .option("columns", "commit_log_offset")
            .option("startingOffsets", str(start))
            .load(str(tmp_path / "n"))
        )
        query = stream.writeStream.format("memory").queryName(f"from_{start}").start()
        try:
            query.processAllAvailable()
            return offsets(spark, f"from_{start}")
        finally:
            query.stop()

    tenth = written[10].commit_log_offset
    assert run(tenth) == [r.commit_log_offset for r in written[10:]]
    assert run(end) == []  # the end of the log: a tail of what comes next
    with pytest.raises(Exception, match=f"inside a record; the next record starts at {tenth}"):
        run(tenth - 5)
    with pytest.raises(Exception, match=f"past the end of its log, {end}"):
        run(end + 100)
