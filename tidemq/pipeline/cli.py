"""`tidemq pipeline rebuild|export|stats`: the Spark jobs on the command line.

Every command takes `--master URL` (default local[*]), passes Spark settings through with
repeated `--conf key=value`, bounds the commit-log range with `--start-offset` / `--end-offset`,
and prints a line per Spark stage on stderr while it runs (`--no-progress`: none).  A failure is
one line saying what failed and what to do; `tidemq -v` adds Spark's traceback (and Spark's
warnings while the job runs)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback

PIPELINE_EXTRA = "the pipeline needs pyspark and pyarrow: pip install 'tidemq[pipeline]'"


def _session(args: argparse.Namespace):
    from .session import parse_conf, spark_session

    conf = parse_conf(args.conf)
    conf.setdefault("spark.ui.showConsoleProgress", "false")  # the stage lines below say it
    spark = spark_session(args.master, conf)
    # Spark's own log repeats a task's failure with its whole traceback: kept for -v
    verbose = getattr(args, "verbose", False)
    spark.sparkContext.setLogLevel("WARN" if verbose else "FATAL")
    logging.getLogger("py4j").setLevel(logging.DEBUG if verbose else logging.WARNING)
    return spark


def _progress(spark, args: argparse.Namespace):
    if args.no_progress:
        return contextlib.nullcontext()
    from .progress import StageProgress

    return StageProgress(spark).track()


def _offsets(args: argparse.Namespace) -> dict:
    return {"start_offset": args.start_offset, "end_offset": args.end_offset}


def _rebuild(args: argparse.Namespace) -> int:
    from .rebuild import rebuild

    if bool(args.out) == bool(args.in_place):
        raise ValueError("rebuild needs --out OUT or --in-place (with the broker stopped)")
    spark = _session(args)
    with _progress(spark, args):
        report = rebuild(
            spark,
            args.store,
            args.out,
            in_place=args.in_place,
            units_per_file=args.units_per_file,
            key_index=not args.no_key_index,
            hash_slots=args.hash_slots,
            max_entries=args.max_index_entries,
            partition_size=args.partition_size,
            light_queue_store=args.light_queue_store,
            **_offsets(args),
        )
    for line in report.messages:
        print(f"warning: {line}")
    print(f"rebuilt {len(report.queues)} consume queue(s), {report.entries} entries, into {report.out}/consumequeue")
    if report.light_queue_tables:
        print(
            f"rebuilt {report.light_queues} light queue(s), {report.light_units} units, "
            f"into the key-value tables {report.light_queue_tables}"
        )
    if report.key_index:
        print(f"rebuilt the key index into {report.key_index}")
    for topic, queue_id, entries, files, min_offset, max_offset, _ in report.queues:
        print(f"  {topic}/{queue_id}  entries {entries}  offsets [{min_offset}, {max_offset})  files {files}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export

    spark = _session(args)
    with _progress(spark, args):
        report = export(
            spark, args.store, args.out, mode=args.mode, partition_size=args.partition_size, **_offsets(args)
        )
    for line in report.messages:
        print(f"warning: {line}")
    print(f"exported {args.store} to {report.out} (Parquet, partitioned by topic and day)")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from .export import stats

    spark = _session(args)
    with _progress(spark, args):
        report = stats(
            spark, args.store, bucket_seconds=args.bucket, partition_size=args.partition_size, **_offsets(args)
        )
    for warning in report.messages:
        print(f"warning: {warning}")

    def line(name: str, t) -> str:
        return f"  {name:<40} {t.messages:>10} msgs {t.bytes:>14} bytes  {t.first_store_time} .. {t.last_store_time}"

    print("topics:")
    for topic, totals in report.topics.items():
        print(line(topic, totals))
    print("queues:")
    for (topic, queue_id), totals in report.queues.items():
        print(line(f"{topic}/{queue_id}", totals))
    print(f"rates ({report.bucket_seconds}-second buckets):")
    for start, messages, size, rate in report.rates:
        print(f"  {start}  {messages:>10} msgs {size:>14} bytes  {rate:10.1f} msg/s")
    return 0


def _one_line_errors(func):
    """A missing Java, a missing extra, a corrupt log or a failed job: one line on stderr (and
    with -v, the traceback Spark gave)."""

    def run(args: argparse.Namespace) -> int:
        from .errors import CorruptLogError, JobFailedError
        from .session import JavaNotFoundError

        try:
            return func(args)
        except ModuleNotFoundError as exc:
            if exc.name not in ("pyspark", "pyarrow", "py4j"):
                raise
            print(f"tidemq: {PIPELINE_EXTRA}", file=sys.stderr)
            return 2
        except (JavaNotFoundError, CorruptLogError, JobFailedError) as exc:
            cause, verbose = exc.__cause__, getattr(args, "verbose", False)
            if cause is not None and verbose:
                traceback.print_exception(cause, file=sys.stderr)
            hint = " (tidemq -v pipeline ... shows Spark's traceback)" if cause is not None and not verbose else ""
            print(f"tidemq: {exc}{hint}", file=sys.stderr)
            return 2

    return run


def add_commands(commands) -> None:
    """Add `pipeline` and its subcommands to the `tidemq` parser's subcommands."""
    pipeline = commands.add_parser("pipeline", help="Spark jobs over commit logs: rebuild, export, stats")
    jobs = pipeline.add_subparsers(dest="pipeline_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--store",
            required=True,
            help="store directory (holding commitlog/): a path or a file://, hdfs://, s3:// URI",
        )
        p.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
        p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="a Spark setting; repeatable")
        p.add_argument(
            "--partition-size",
            help="bytes of commit log per Spark task (default 64m; a whole segment for a remote store)",
        )
        p.add_argument("--start-offset", type=int, help="read records at or after this commit-log offset")
        p.add_argument("--end-offset", type=int, help="read records before this commit-log offset")
        p.add_argument("--no-progress", action="store_true", help="print no line per Spark stage")

    p = jobs.add_parser("rebuild", help="build the ConsumeQueue files from the commit log")
    common(p)
    p.add_argument(
        "--out", help="directory to write consumequeue/ and index/ to (a path or URI every executor reaches)"
    )
    p.add_argument("--in-place", action="store_true", help="replace the stopped store's own indexes")
    p.add_argument(
        "--units-per-file", type=int, help="consume-queue units per file (default: the store's, else 300000)"
    )
    p.add_argument("--no-key-index", action="store_true", help="rebuild the consume queues only")
    p.add_argument(
        "--light-queue-store",
        choices=["file", "kv"],
        help="light queues (%%LMQ%%name) as RocketMQ's file queues, or in the key-value tables lightqueue/ "
        "(default: the form the store's are in, else kv)",
    )
    p.add_argument("--hash-slots", type=int, help="key-index hash slots per file (default: the store's, else 5000000)")
    p.add_argument(
        "--max-index-entries", type=int, help="key-index entries per file (default: the store's, else 20000000)"
    )
    p.set_defaults(func=_one_line_errors(_rebuild))

    p = jobs.add_parser("export", help="messages to Parquet, partitioned by topic and day")
    common(p)
    p.add_argument("--out", required=True, help="a directory path or URI (file://, hdfs://, s3a://, ...)")
    p.add_argument(
        "--mode",
        default="errorifexists",
        choices=["errorifexists", "overwrite", "append", "ignore"],
        help="if --out exists: refuse (errorifexists, the default), replace it, add to it, or do nothing",
    )
    p.set_defaults(func=_one_line_errors(_export))

    p = jobs.add_parser("stats", help="per-topic and per-queue counts, bytes, store times, rates")
    common(p)
    p.add_argument("--bucket", type=int, default=60, help="seconds per rate bucket (default 60)")
    p.set_defaults(func=_one_line_errors(_stats))
