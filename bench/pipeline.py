"""Spark pipeline benchmark: rebuild throughput and decode rates, against the store's own code.

    .venv/bin/python bench/pipeline.py [--mb 384] [--body 512] [--repeat 3] [--dir DIR]

Writes a commit log of about `--mb` MB through the real store, then, in one run, prints:
- rebuild throughput (MB/s of commit log) of the ConsumeQueue files on Spark with local[1] and
  local[2], and of the store's own single dispatcher on the same log (with the byte-identical
  check of both outputs);
- the store's single-thread decode rate (record.decode over the log, as the rebuild reads it) and
  the decode rate of Spark tasks (a full read of the rebuild's columns into a no-op sink, local[1]),
  i.e. per core;
- the Arrow path (read() yields pyarrow.RecordBatch) against yielding rows, all columns, local[1]
  (on the first 64 MB);
- rebuild and read throughput on a Spark standalone cluster on 127.0.0.1 (master and one worker
  started from the pyspark package) with two executors of one core each, whose Python is a
  separate virtualenv without tidemq (tidemq shipped to them as pure Python), on the same log.
  `--no-cluster` leaves it out.

Targets (issue 5): local[2] >= 1.6x local[1]; Spark-task decode within 2x of the store's own
single-thread rate per core.  The machine is shared and has 2 cores: compare within one run;
rounds alternate the masters and the best time of each measurement is kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "pipeline"))

from spark_cluster import StandaloneCluster, worker_python  # noqa: E402

from tidemq.pipeline import plan as planning  # noqa: E402
from tidemq.pipeline import spark_session  # noqa: E402
from tidemq.pipeline.rebuild import UNIT_COLUMNS, rebuild  # noqa: E402
from tidemq.store import Message, MessageStore, StoreConfig, record  # noqa: E402
from tidemq.store.dispatch.sequential import Dispatcher  # noqa: E402
from tidemq.store.log.commit_log import CommitLog  # noqa: E402
from tidemq.store.queues.queue_set import ConsumeQueueStore  # noqa: E402

SEGMENT = 64 << 20
UNITS_PER_FILE = 300_000
TOPICS = 8
QUEUES = 8


def write_log(store: Path, mb: int, body_size: int) -> int:
    """Messages into a fresh store until the log holds about `mb` MB; returns the log's bytes."""
    body = os.urandom(body_size)
    target = mb << 20
    with MessageStore(store, StoreConfig(segment_size=SEGMENT)) as s:
        i = 0
        end = 0
        while end < target:
            r = s.put(Message(f"topic-{i % TOPICS}", body, i % QUEUES, tags=f"tag-{i % 5}", keys=[f"k{i}"]))
            end = r.commit_log_offset + r.size
            i += 1
        s.wait_dispatched(timeout=600)
    return end


def store_dispatch(store: Path, out: Path, end: int) -> float:
    """Seconds for the store's own single dispatcher to build every ConsumeQueue from the log."""
    commit_log = CommitLog(store / "commitlog", SEGMENT)
    queues = ConsumeQueueStore(out, UNITS_PER_FILE)
    dispatcher = Dispatcher(commit_log, [queues], commit_log.min_offset)
    t0 = time.perf_counter()
    dispatcher.dispatch_until(end, notify=False)
    queues.flush()
    elapsed = time.perf_counter() - t0
    queues.close()
    commit_log.close()
    return elapsed


def store_decode(store: Path, **options) -> tuple[float, int]:
    """Seconds for one thread to decode every record with `record.decode`, and the count."""
    count = 0
    t0 = time.perf_counter()
    for base, path, _ in planning.segments(str(store / "commitlog")):
        segment = planning.open_segment(path, base)
        pos = 0
        while True:
            result = record.decode(segment.buf, pos, base_offset=base, **options)
            if type(result) is not record.Record:
                break
            pos += result.total_size
            count += 1
        del result
        segment.close()
    return time.perf_counter() - t0, count


CLUSTER = "cluster"


def session(master: str, cluster: StandaloneCluster | None = None):
    conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g"}
    if master == CLUSTER:
        master = cluster.url
        conf.update({
            "spark.pyspark.python": worker_python(), "spark.executor.cores": "1", "spark.cores.max": "2",
            "spark.executor.memory": "1g", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        })  # fmt: skip
    spark = spark_session(master, conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed_read(spark, store: Path, partition_size: str, **options) -> float:
    reader = spark.read.format("tidemq-commitlog").option("partitionSize", partition_size)
    for key, value in options.items():
        reader = reader.option(key, value)
    t0 = time.perf_counter()
    reader.load(str(store)).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def same_files(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all((a / f).read_bytes() == (b / f).read_bytes() for f in files_a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=384, help="commit-log size to write (MB)")
    parser.add_argument("--body", type=int, default=512, help="message body bytes")
    parser.add_argument("--partition-size", default="32m", help="bytes of log per Spark task")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (masters alternate); the best of each is kept")
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    parser.add_argument("--no-cluster", action="store_true", help="local masters only")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="tidemq-bench-pipeline-"))
    root.mkdir(parents=True, exist_ok=True)
    store = root / "store"
    best: dict[str, float] = {}
    cluster: StandaloneCluster | None = None

    def keep(name: str, seconds: float) -> None:
        best[name] = min(seconds, best.get(name, float("inf")))

    try:
        t0 = time.perf_counter()
        size = write_log(store, args.mb, args.body)
        mb = size / 1e6
        print(f"log: {mb:.1f} MB, {args.body}-byte bodies, {TOPICS} topics x {QUEUES} queues, written in {time.perf_counter() - t0:.1f} s")
        print(f"best of {args.repeat} rounds; Spark tasks of {args.partition_size} of log")
        slice_end = min(size, 64 << 20)  # the Arrow / rows comparison reads this much
        warm = root / "warm"
        write_log(warm, 1, args.body)
        records = 0
        masters = ["local[1]", "local[2]"] + ([] if args.no_cluster else [CLUSTER])
        if not args.no_cluster:
            cluster = StandaloneCluster(root / "cluster", cores=2, memory="2g").start()
        for round_ in range(args.repeat):
            shutil.rmtree(root / "dispatcher", ignore_errors=True)
            keep("dispatch", store_dispatch(store, root / "dispatcher", size))
            seconds, records = store_decode(store, check_crc=True, read_body=False, read_properties=True)
            keep("store decode", seconds)
            for master in masters:
                spark = session(master, cluster)
                # warm up the JVM, its classes and the Python workers on a small store before timing
                for _ in range(2):
                    shutil.rmtree(root / "warm-out", ignore_errors=True)
                    t = time.perf_counter()
                    rebuild(spark, warm, root / "warm-out", units_per_file=UNITS_PER_FILE, key_index=False)
                    keep(f"tiny rebuild {master}", time.perf_counter() - t)
                keep(f"tiny read {master}", timed_read(spark, store, args.partition_size, endOffset=str(1 << 20)))
                keep(f"tiny read {master}", timed_read(spark, store, args.partition_size, endOffset=str(1 << 20)))
                out = root / f"rebuild-{master.strip('local[]')}"
                shutil.rmtree(out, ignore_errors=True)
                t = time.perf_counter()
                rebuild(spark, store, out, units_per_file=UNITS_PER_FILE, key_index=False, partition_size=args.partition_size)
                keep(f"rebuild {master}", time.perf_counter() - t)
                assert same_files(root / "dispatcher", out / "consumequeue"), "rebuild differs from the dispatcher's files"
                keep(f"decode {master}", timed_read(spark, store, args.partition_size, columns=UNIT_COLUMNS))
                if master == "local[1]":
                    keep("arrow local[1]", timed_read(spark, store, args.partition_size, endOffset=str(slice_end)))
                    keep("rows local[1]", timed_read(spark, store, args.partition_size, endOffset=str(slice_end), output="rows"))
                spark.stop()

        print(f"{'store dispatcher (1 thread):':<34}{mb / best['dispatch']:8.1f} MB/s  ({records / best['dispatch']:,.0f} records/s)")
        print(f"{'store decode (1 thread):':<34}{mb / best['store decode']:8.1f} MB/s  ({records / best['store decode']:,.0f} records/s)")
        for name in [f"rebuild {m}" for m in masters]:
            print(f"{name + ' (Spark):':<34}{mb / best[name]:8.1f} MB/s  (byte-identical to the dispatcher)")
        for name in [f"decode {m}" for m in masters]:
            print(f"{name + ' (Spark read):':<34}{mb / best[name]:8.1f} MB/s  ({records / best[name]:,.0f} records/s)")
        overhead = best["tiny read local[1]"]
        marginal = best["decode local[1]"] - overhead
        print(f"{'  job overhead (1 MB read):':<34}{overhead:8.2f} s;  tasks alone: {mb / marginal:.1f} MB/s")
        print(f"{'  fixed cost (rebuild of 1 MB):':<34}" + ", ".join(f"{best[f'tiny rebuild {m}']:.2f} s {m}" for m in masters))
        for name in ("arrow local[1]", "rows local[1]"):
            print(f"{name + ', all columns:':<34}{slice_end / 1e6 / best[name]:8.1f} MB/s  (first {slice_end / 1e6:.0f} MB)")
        print()
        print(f"rebuild local[2] / local[1]:           {best['rebuild local[1]'] / best['rebuild local[2]']:.2f}x  (target >= 1.6x)")
        print(f"read    local[2] / local[1]:           {best['decode local[1]'] / best['decode local[2]']:.2f}x")
        print(f"Spark-task decode vs store decode:     {best['decode local[1]'] / best['store decode']:.2f}x the time per core, "
              f"{marginal / best['store decode']:.2f}x without the job overhead (target <= 2x)")
        print(f"rebuild local[1] vs store dispatcher:  {best['dispatch'] / best['rebuild local[1]']:.2f}x the dispatcher's speed")
        print(f"rebuild local[2] vs store dispatcher:  {best['dispatch'] / best['rebuild local[2]']:.2f}x the dispatcher's speed")
        print(f"Arrow batches vs rows:                 {best['rows local[1]'] / best['arrow local[1]']:.2f}x faster")
        if CLUSTER in masters:
            print(f"rebuild cluster (2 executors) / local[1]: {best['rebuild local[1]'] / best['rebuild cluster']:.2f}x, "
                  f"/ local[2]: {best['rebuild local[2]'] / best['rebuild cluster']:.2f}x")
            print(f"read    cluster (2 executors) / local[1]: {best['decode local[1]'] / best['decode cluster']:.2f}x, "
                  f"/ local[2]: {best['decode local[2]'] / best['decode cluster']:.2f}x")
    finally:
        if cluster is not None:
            cluster.stop()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
