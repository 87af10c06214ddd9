"""The jobs on a real standalone cluster whose worker Python has no tidemq, as on any cluster.

The driver is a child process (this process already holds a local SparkContext) running
`tidemq pipeline stats|export|rebuild --master spark://...` one after the other in one session,
first reading the store by its path, then through a file:// URI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from pipeline_logs import SEGMENT_SIZE, assert_same_files, dispatch_key_index
from spark_cluster import StandaloneCluster, worker_python

from tidemq.pipeline.export import read_export

# the jobs of one driver: each command's exit code and output, as JSON on the last line
DRIVER = """
import contextlib, io, json, sys
from tidemq.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    results.append([code, out.getvalue()])
print(json.dumps(results))
"""


def test_stats_export_and_rebuild_on_a_standalone_cluster(spark, written_store, tmp_path):
    store, messages, _ = written_store
    python = worker_python()
    # (run away from the checkout: `python -c` and `-m` look in the working directory first)
    assert subprocess.run([python, "-c", "import tidemq"], capture_output=True, cwd=tmp_path).returncode != 0
    assert subprocess.run([python, "-c", "import numpy, pyarrow"], capture_output=True, cwd=tmp_path).returncode == 0

    with StandaloneCluster(tmp_path / "cluster", cores=2, memory="1g") as cluster:
        spark_args = [
            "--master", cluster.url, "--partition-size", str(SEGMENT_SIZE // 2), "--no-progress",
            "--conf", f"spark.pyspark.python={python}", "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.executor.memory=1g",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
        ]  # fmt: skip
        runs = []
        for name, source in (("path", str(store)), ("uri", store.as_uri())):
            out = tmp_path / name
            runs += [
                ["pipeline", "stats", "--store", source, *spark_args],
                ["pipeline", "export", "--store", source, "--out", (out / "export").as_uri() if name == "uri" else str(out / "export"), *spark_args],
                ["pipeline", "rebuild", "--store", source, "--out", (out / "rebuild").as_uri() if name == "uri" else str(out / "rebuild"),
                 "--units-per-file", "100", "--hash-slots", "97", "--max-index-entries", "500", *spark_args],
            ]  # fmt: skip
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, json.dumps(runs)], capture_output=True, text=True, timeout=900, cwd=tmp_path
        )
        assert driver.returncode == 0, driver.stderr[-6000:]
        results = json.loads(driver.stdout.strip().splitlines()[-1])
        shipped = list((tmp_path / "cluster" / "work").rglob("tidemq-*.zip"))

    assert [code for code, _ in results] == [0] * len(runs), results
    assert shipped, "the executors got tidemq from the driver"
    dispatch_key_index(store, tmp_path / "expected-index", 97, 500)
    by_topic = Counter(m.topic for m in messages)
    for index, name in enumerate(("path", "uri")):
        stats_out = results[3 * index][1]
        assert all(f"  {topic:<40} {count:>10} msgs" in stats_out for topic, count in by_topic.items()), stats_out
        assert read_export(spark, tmp_path / name / "export").count() == len(messages)
        assert_same_files(store / "consumequeue", tmp_path / name / "rebuild" / "consumequeue")
        assert_same_files(tmp_path / "expected-index", tmp_path / name / "rebuild" / "index")
