"""export, stats and the `tidemq pipeline` commands; the Java check."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from datetime import datetime, timezone

import pytest

from tidemq.cli import main
from tidemq.pipeline import CorruptLogError, JavaNotFoundError, JobFailedError
from tidemq.pipeline.errors import explain
from tidemq.pipeline.export import read_export, stats
from tidemq.pipeline.session import find_java, spark_session

from pipeline_logs import SEGMENT_SIZE


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


def test_export_into_an_existing_folder_refuses_or_takes_a_mode(spark, written_store, tmp_path, capsys):
    store, messages, _ = written_store
    out = tmp_path / "export"
    out.mkdir()
    conf = ["--master", "local[2]", "--partition-size", "32k", "--no-progress", "--end-offset", str(16 * 1024)]
    assert main(["pipeline", "export", "--store", str(store), "--out", str(out), *conf]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists" in err[0] and "--mode overwrite" in err[0] and "--mode append" in err[0]
    assert list(out.iterdir()) == []
    assert main(["pipeline", "export", "--store", str(store), "--out", str(out), "--mode", "append", *conf]) == 0
    first = read_export(spark, out).count()
    assert 0 < first < len(messages)
    assert main(["pipeline", "export", "--store", str(store), "--out", str(out), "--mode", "append", *conf]) == 0
    assert read_export(spark, out).count() == 2 * first
    assert main(["pipeline", "export", "--store", str(store), "--out", str(out), "--mode", "overwrite", *conf]) == 0
    assert read_export(spark, out).count() == first


def test_offsets_bound_the_read_and_stages_report_progress(written_store, capsys):
    store, messages, results = written_store
    start, end = results[200].commit_log_offset + 1, results[900].commit_log_offset
    argv = ["pipeline", "stats", "--store", str(store), "--master", "local[2]", "--partition-size", "32k"]
    assert main([*argv, "--start-offset", str(start), "--end-offset", str(end)]) == 0
    captured = capsys.readouterr()
    # records starting at or after the first record boundary >= start, and before end
    inside = [m for m, r in zip(messages, results) if start <= r.commit_log_offset < end]
    assert len(inside) == 699
    for topic, count in Counter(m.topic for m in inside).items():
        assert f"  {topic:<40} {count:>10} msgs" in captured.out
    stages = [line for line in captured.err.splitlines() if line.startswith("[stage ")]
    assert stages and all(" done: " in line or " tasks  (" in line for line in stages)
    assert sum(" done: " in line for line in stages) >= 3  # the source's read and the aggregations


def test_a_corrupt_record_fails_the_job_in_one_line_naming_the_offset(written_store, tmp_path, capsys):
    store, messages, results = written_store
    copy = tmp_path / "broker-a"
    shutil.copytree(store, copy)
    victim = next(r for r in results[400:] if r.size > 200)
    segment = copy / "commitlog" / f"{victim.commit_log_offset - victim.commit_log_offset % SEGMENT_SIZE:020d}"
    data = bytearray(segment.read_bytes())
    data[victim.commit_log_offset % SEGMENT_SIZE + 120] ^= 0xFF
    segment.write_bytes(bytes(data))
    argv = ["pipeline", "stats", "--store", str(copy), "--master", "local[2]", "--partition-size", "32k", "--no-progress"]

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"corrupt record at commit-log offset {victim.commit_log_offset}" in err[0]
    assert f"--end-offset {victim.commit_log_offset}" in err[0] and "tidemq store repair" in err[0] and "-v" in err[0]
    assert main(["-v", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("tidemq: broker broker-a: corrupt record")
    assert main([*argv, "--end-offset", str(victim.commit_log_offset)]) == 0
    out = capsys.readouterr().out
    counted = sum(int(line.split()[1]) for line in out.split("queues:")[0].splitlines()[1:])
    assert counted == results.index(victim)


def test_the_executors_python_is_the_callers_choice(monkeypatch):
    from tidemq.pipeline import session

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert session.executor_python("local[2]", {}) == sys.executable
    assert session.executor_python("spark://h:7077", {}) is None  # Spark's own default, python3
    assert session.executor_python("spark://h:7077", {"spark.pyspark.python": "/opt/py/bin/python"}) == "/opt/py/bin/python"
    monkeypatch.setenv("PYSPARK_PYTHON", "/env/python")
    assert session.executor_python("local[2]", {}) == "/env/python"
    assert session.executor_python("local[2]", {"spark.pyspark.python": "/conf/python"}) == "/conf/python"
    # a cluster master gets tidemq's pure-Python package in spark.submit.pyFiles, after the caller's
    conf = session.session_conf("spark://h:7077", {"spark.submit.pyFiles": "deps.zip"})
    deps, shipped = conf["spark.submit.pyFiles"].split(",")
    assert deps == "deps.zip" and shipped.endswith(".zip")
    with zipfile.ZipFile(shipped) as archive:
        names = archive.namelist()
    assert "tidemq/store/format/record.py" in names and "tidemq/pipeline/source.py" in names
    assert not [n for n in names if not n.endswith(".py")]  # no compiled parts: any platform runs it
    assert "spark.submit.pyFiles" not in session.session_conf("local[2]", {})
    assert "spark.submit.pyFiles" not in session.session_conf("spark://h:7077", {"spark.tidemq.shipPackage": "false"})


def test_the_callers_spark_pyspark_python_is_used_and_a_bad_one_is_one_line(written_store, tmp_path):
    store = written_store[0]
    missing = tmp_path / "no-such-python"
    command = [sys.executable, "-m", "tidemq.cli", "pipeline", "stats", "--store", str(store), "--master", "local[1]",
               "--no-progress", "--conf", f"spark.pyspark.python={missing}"]  # fmt: skip
    child = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert child.returncode == 2
    said = [line for line in child.stderr.splitlines() if line.startswith("tidemq:")]
    assert len(said) == 1, child.stderr[-3000:]
    assert said[0].startswith(f"tidemq: Spark cannot start the Python '{missing}'") and "spark.pyspark.python=PATH" in said[0]
    assert "Traceback" not in child.stderr


@pytest.mark.parametrize(
    "text, expected",
    [
        ("py4j.protocol.Py4JJavaError: ...\nPythonException: ...\ntidemq.pipeline.errors.CorruptLogError: broker b: corrupt record at commit-log offset 7",
         "broker b: corrupt record at commit-log offset 7"),
        ('java.io.IOException: Cannot run program "/opt/py": error=2', "Spark cannot start the Python '/opt/py'"),
        ("ModuleNotFoundError: No module named 'pyarrow'", "the workers' Python has no module 'pyarrow'"),
        ("ModuleNotFoundError: No module named 'tidemq.store'", "Spark's workers cannot import tidemq.store"),
        ("[PATH_ALREADY_EXISTS] Path file:/tmp/out already exists. Set mode", "file:/tmp/out already exists: choose --mode"),
        ("org.apache.spark.SparkException: Job aborted\nTraceback ...\nValueError: option batchSize bad\n\tat org.apache...",
         "the Spark job failed: ValueError: option batchSize bad"),
    ],
)  # fmt: skip
def test_spark_failures_are_explained_in_one_line(text, expected):
    explained = explain(text)
    assert str(explained).startswith(expected) and "\n" not in str(explained)
    assert isinstance(explained, CorruptLogError if "Corrupt" in text else JobFailedError)
