"""export, stats and the `tidemq pipeline` commands; the Java check."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

import pytest

from tidemq.cli import main
from tidemq.pipeline import JavaNotFoundError
from tidemq.pipeline.export import read_export, stats
from tidemq.pipeline.session import find_java, spark_session


def test_export_round_trips_every_column(spark, written_store, tmp_path, capsys):
    store, messages, _ = written_store
    out = tmp_path / "export"
    assert main(["pipeline", "export", "--store", str(store), "--out", str(out), "--master", "local[2]", "--partition-size", "1m"]) == 0
    assert "exported" in capsys.readouterr().out

    source = spark.read.format("tidemq-commitlog").option("partitionSize", "32k").load(str(store))
    back = read_export(spark, out)
    assert back.count() == len(messages)
    columns = source.columns
    assert sorted(map(tuple, back.select(*columns).collect())) == sorted(map(tuple, source.collect()))
    days = {row.day.isoformat() for row in back.select("day").distinct().collect()}
    expected_days = {datetime.fromtimestamp(r.store_timestamp / 1000, tz=timezone.utc).date().isoformat() for r in written_store[2]}
    assert days == expected_days
    topic_dirs = {p.name for p in out.iterdir() if p.is_dir()}
    assert len(topic_dirs) == len({m.topic for m in messages})
    assert all((out / d / f"day={day}").is_dir() for d in topic_dirs for day in days)


def test_stats_counts_bytes_times_and_rates(spark, written_store):
    store, messages, results = written_store
    report = stats(spark, store, bucket_seconds=1, partition_size="32k")

    by_topic = Counter(m.topic for m in messages)
    assert {t: v.messages for t, v in report.topics.items()} == dict(by_topic)
    for topic in by_topic:
        mine = [r for m, r in zip(messages, results) if m.topic == topic]
        totals = report.topics[topic]
        assert totals.bytes == sum(r.size for r in mine)
        first = min(r.store_timestamp for r in mine)
        assert int(totals.first_store_time.replace(tzinfo=timezone.utc).timestamp() * 1000) == first
    assert {k: v.messages for k, v in report.queues.items()} == dict(Counter((m.topic, m.queue_id) for m in messages))
    assert sum(r[1] for r in report.rates) == len(messages)
    assert sum(r[2] for r in report.rates) == sum(r.size for r in results)
    assert all(r[3] == r[1] for r in report.rates)  # one-second buckets


def test_cli_commands(spark, written_store, tmp_path, capsys):
    store, messages, _ = written_store
    conf = ["--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=4", "--partition-size", "32k"]
    assert main(["pipeline", "stats", "--store", str(store), *conf]) == 0
    out = capsys.readouterr().out
    assert "orders" in out and "msg/s" in out
    assert main(["pipeline", "rebuild", "--store", str(store), "--out", str(tmp_path / "cq"), "--no-key-index", *conf]) == 0
    assert "consume queue(s)" in capsys.readouterr().out
    for path in (store / "consumequeue").rglob("*"):
        if path.is_file():
            assert (tmp_path / "cq" / "consumequeue" / path.relative_to(store / "consumequeue")).read_bytes() == path.read_bytes()
    assert not (tmp_path / "cq" / "index").exists()


def test_a_missing_java_is_one_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(JavaNotFoundError, match="install"):
        spark_session("local[1]")
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="Java runtime"):
        find_java()
    assert main(["pipeline", "stats", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "install" in err[0]


def test_local_sessions_stay_on_loopback(spark):
    """Local mode binds the driver to 127.0.0.1, never to the machine's other interfaces."""
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"
    assert spark.conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert spark.sparkContext.uiWebUrl is None or "127.0.0.1" in spark.sparkContext.uiWebUrl
