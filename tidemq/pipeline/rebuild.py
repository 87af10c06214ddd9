"""Rebuild a store's ConsumeQueue files from its CommitLog on Spark.

    each range of the log -> per queue: its entries' packed units, PREPARED / ROLLBACK records
                             dropped (`tidemq-queueunits`, the source grouped by queue)
    -> repartition by queue, sort each queue's chunks into commit-log order
    -> each task writes its queues' files (`tidemq-consumequeue`, an Arrow data sink)

With `key_index`, the key index is rebuilt too (`key_index.py`).  The ConsumeQueue files are
byte-identical to what the store's dispatcher builds (`tidemq.store.queues.consume_queue`):
20-byte units `>qiq`, files of `units_per_file` units named by their 20-digit byte offset and
preallocated full-size, and a queue whose first entry is not slot 0 starts at the file holding it,
with blank units (0, 0x7FFFFFFF, 0) below the entry.  `QueueFilesWriter` replays the dispatcher's
rule for every entry — write the slot unless it is below the queue's commit frontier — so even an
odd log (a queue offset repeated or skipped) gives the same bytes.

Light queues (`%LMQ%name`, queue 0; a unit per name of a record's `INNER_MULTI_DISPATCH` at the
offset its `INNER_MULTI_QUEUE_OFFSET` gives) are rebuilt as file queues along with the others, or
into the store's key-value tables on the driver (`light_queues.py` says where and why).

Tasks write the files themselves, so on a cluster `out` must be a filesystem every executor sees:
a shared path, or a URI (`files`: hdfs://, s3://, ...).  The store may be a URI too; rebuilding
in place needs a local store (its lock is a local file lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from ..store import record
from ..store.errors import StoreLockedError
from ..store.format.special_queues import LMQ_PREFIX, LMQ_QUEUE_ID, PROPERTY_DELAY, lmq_units, queue_tags_code
from ..store.light.queues import KV_DIRECTORY
from ..store.queues.consume_queue import BLANK_UNIT, DEFAULT_UNITS_PER_FILE, UNIT_DTYPE, UNIT_SIZE, file_name
from ..store.queues.queue_set import spread_topic_directories
from . import SOURCE_NAME, files
from . import plan as planning
from .columns import arrow_schema, select_schema
from .errors import job_errors
from .light_queues import file_light_queues, light_queue_store_of, table_rows, write_tables
from .source import CommitLogDataSource, CommitLogReader, record_batches

log = logging.getLogger(__name__)

UNIT_COLUMNS = "topic,queue_id,queue_offset,commit_log_offset,size,tags_code,sysflag"
SINK_NAME = "tidemq-consumequeue"
UNITS_SOURCE = "tidemq-queueunits"
UNITS_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("first_offset", LongType(), False),
        StructField("queue_offsets", BinaryType(), False),
        StructField("units", BinaryType(), False),
        # a light queue's (`%LMQ%name`/0) units' store times `>q`... (the key-value tables keep
        # them); empty for other queues
        StructField("store_times", BinaryType(), False),
    ]
)
UNITS_ARROW_SCHEMA = arrow_schema(UNITS_SCHEMA)


class QueueFilesWriter:
    """One queue's files, written as the dispatcher would from its entries in commit-log order.

    Files wholly below the commit frontier can no longer change and are written out at once, so
    memory holds about one file per queue being written."""

    def __init__(self, root: str, topic: str, queue_id: int, units_per_file: int) -> None:
        self.directory = files.join(root, topic, str(queue_id))
        self.topic, self.queue_id = topic, queue_id
        self.units_per_file = units_per_file
        self.file_bytes = units_per_file * UNIT_SIZE
        self.buffers: dict[int, bytearray] = {}  # first slot of a file -> its bytes, not yet written
        self.next_file: int | None = None  # first slot of the next file to create
        self.min_offset = 0
        self.frontier = 0
        self.pending: set[int] = set()
        self.entries = 0
        self.files = 0
        self.max_physical_offset = 0

    def _start(self, first_offset: int) -> None:
        start = first_offset - first_offset % self.units_per_file
        files.makedirs(self.directory)
        buf = self.buffers[start] = bytearray(self.file_bytes)
        count = first_offset - start
        buf[: count * UNIT_SIZE] = BLANK_UNIT * count
        self.next_file = start + self.units_per_file
        self.min_offset = self.frontier = first_offset

    def _buffer_for(self, slot: int) -> tuple[int, bytearray]:
        start = slot - slot % self.units_per_file
        next_file = self.next_file
        assert next_file is not None  # _start ran at the first entry
        while next_file <= start:
            self.buffers[next_file] = bytearray(self.file_bytes)
            next_file += self.units_per_file
        self.next_file = next_file
        return start, self.buffers[start]

    def add(self, queue_offsets: np.ndarray, units: np.ndarray) -> None:
        """Entries in commit-log order: queue offsets and their (offset, size, tags code) units."""
        if not len(units):
            return
        if self.next_file is None:
            self._start(int(queue_offsets[0]))
        n = len(units)
        first = int(queue_offsets[0])
        if (
            not self.pending
            and first == self.frontier
            and int(queue_offsets[-1]) == first + n - 1
            and (n == 1 or bool(np.all(np.diff(queue_offsets) == 1)))
        ):
            self._put_run(first, units)
        else:
            for q, unit in zip(queue_offsets.tolist(), units):
                self._put_one(q, unit)
        self.max_physical_offset = max(self.max_physical_offset, int(np.max(units["offset"] + units["size"])))
        self._write_settled()

    def _put_run(self, first: int, units: np.ndarray) -> None:
        done = 0
        while done < len(units):
            slot = first + done
            start, buf = self._buffer_for(slot)
            take = min(len(units) - done, start + self.units_per_file - slot)
            pos = (slot - start) * UNIT_SIZE
            buf[pos : pos + take * UNIT_SIZE] = units[done : done + take].tobytes()
            done += take
        self.frontier = first + len(units)
        self.entries += len(units)

    def _put_one(self, q: int, unit: np.void) -> None:
        if q < self.frontier:
            return  # the dispatcher skips a slot below the frontier
        start, buf = self._buffer_for(q)
        pos = (q - start) * UNIT_SIZE
        buf[pos : pos + UNIT_SIZE] = unit.tobytes()
        self.entries += 1
        if q == self.frontier:
            frontier = q + 1
            while frontier in self.pending:
                self.pending.remove(frontier)
                frontier += 1
            self.frontier = frontier
        else:
            self.pending.add(q)

    def _write_settled(self) -> None:
        for start in sorted(self.buffers):
            if start + self.units_per_file > self.frontier:
                break
            self._write(start, self.buffers.pop(start))

    def _write(self, start: int, buf: bytearray) -> None:
        # the file is preallocated full-size like the store's (ftruncate: zeros read back from the
        # hole); only the bytes up to the last non-zero unit are written
        used = len(buf.rstrip(b"\0")) if buf[-1:] == b"\0" else len(buf)
        used += -used % UNIT_SIZE
        files.write_file(
            files.join(self.directory, file_name(start * UNIT_SIZE)), memoryview(buf)[:used], self.file_bytes
        )
        self.files += 1

    def close(self) -> tuple:
        for start in sorted(self.buffers):
            self._write(start, self.buffers.pop(start))
        return (
            self.topic,
            self.queue_id,
            self.entries,
            self.files,
            self.min_offset,
            self.frontier,
            self.max_physical_offset,
        )


# ---------------------------------------------------------------------------------------------
# Map side: `tidemq-queueunits`, the commit-log source grouped by queue within each range.  Each
# Spark task turns its range into one row per queue — the packed 20-byte units and queue offsets
# of that queue's entries, in log order — so the shuffle moves a few large rows instead of one row
# per message.


class QueueUnitsSource(CommitLogDataSource):
    """`tidemq-queueunits`: per range and queue, (topic, queue_id, first commit-log offset,
    queue offsets `>q`..., units `>qiq`..., store times `>q`... of a light queue's units) of the
    entries the dispatcher would write."""

    @classmethod
    def name(cls) -> str:
        return UNITS_SOURCE

    def schema(self) -> StructType:
        return UNITS_SCHEMA

    def reader(self, schema: StructType) -> QueueUnitsReader:
        return QueueUnitsReader(self._logs(), self.options)

    def streamReader(self, schema: StructType):
        raise ValueError(f"{UNITS_SOURCE} is for batch rebuilds only")


class QueueUnitsReader(CommitLogReader):
    def __init__(self, logs, options) -> None:
        super().__init__(logs, options, select_schema(UNIT_COLUMNS.split(",")))

    def read(self, partition):
        return queue_units(partition, self.settings)


def queue_units(part, settings) -> Iterator[pa.RecordBatch]:
    groups: dict[tuple[str, int], tuple[list, list, list, list, list | None]] = {}
    indexed = record.QUEUE_ENTRY_KINDS
    mask, tags_code, tags = record.TRANSACTION_TYPE_MASK, record.tags_code, record.PROPERTY_TAGS

    def add(queue: tuple[str, int], queue_offset: int, r, code: int) -> None:
        group = groups.get(queue)
        if group is None:
            light = queue[1] == LMQ_QUEUE_ID and queue[0].startswith(LMQ_PREFIX)
            group = groups[queue] = ([], [], [], [], [] if light else None)
        group[0].append(queue_offset)
        group[1].append(r.commit_log_offset)
        group[2].append(r.total_size)
        group[3].append(code)
        if group[4] is not None:
            group[4].append(r.store_timestamp)

    for batch in record_batches(part, settings):
        for r in batch:
            if r.sysflag & mask not in indexed:
                continue  # PREPARED and ROLLBACK records get no queue entry
            properties = r.properties
            code = tags_code(properties.get(tags))
            add(
                (r.topic, r.queue_id),
                r.queue_offset,
                r,
                queue_tags_code(r.topic, properties.get(PROPERTY_DELAY), r.store_timestamp, code),
            )
            # a light queue's unit points at this record (special_queues)
            for lmq_topic, lmq_queue_id, lmq_offset in lmq_units(r.topic, r.queue_id, properties.get):
                add((lmq_topic, lmq_queue_id), lmq_offset, r, code)
    if not groups:
        return
    columns: tuple[list, ...] = ([], [], [], [], [], [])
    for (topic, queue_id), (queue_offsets, offsets, sizes, codes, store_times) in groups.items():
        units = np.empty(len(offsets), dtype=UNIT_DTYPE)
        units["offset"], units["size"], units["tags_code"] = offsets, sizes, codes
        times = np.asarray(store_times, ">i8").tobytes() if store_times is not None else b""
        for column, value in zip(
            columns,
            (topic, queue_id, offsets[0], np.asarray(queue_offsets, ">i8").tobytes(), units.tobytes(), times),
        ):
            column.append(value)
    yield pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, UNITS_ARROW_SCHEMA)], schema=UNITS_ARROW_SCHEMA
    )


def write_queue_files(batches: Iterator[pa.RecordBatch], root: str, units_per_file: int) -> list[tuple]:
    """Queue-units rows of one partition, sorted by queue then first commit-log offset, become
    that partition's queues' files; returns one summary per queue."""
    writer: QueueFilesWriter | None = None
    summaries: list[tuple] = []
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in ("topic", "queue_id", "queue_offsets", "units")]
        for topic, queue_id, queue_offsets, units in zip(*columns):
            if writer is None or (writer.topic, writer.queue_id) != (topic, queue_id):
                if writer is not None:
                    summaries.append(writer.close())
                writer = QueueFilesWriter(root, topic, queue_id, units_per_file)
            writer.add(np.frombuffer(queue_offsets, ">i8"), np.frombuffer(units, UNIT_DTYPE))
    if writer is not None:
        summaries.append(writer.close())
    return summaries


@dataclass
class QueueSummaries(WriterCommitMessage):
    rows: list[tuple]


class ConsumeQueueSink(DataSource):
    """`tidemq-consumequeue`: a write-only source that turns sorted queue entries into files.
    Options: path (the consumequeue root), unitsPerFile, summaryFile (where the driver-side commit
    leaves the per-queue summaries as JSON)."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def writer(self, schema, overwrite: bool) -> ConsumeQueueWriter:
        return ConsumeQueueWriter(
            self.options["path"], int(self.options["unitsPerFile"]), self.options.get("summaryFile")
        )


class ConsumeQueueWriter(DataSourceArrowWriter):
    def __init__(self, root: str, units_per_file: int, summary_file: str | None) -> None:
        self.root, self.units_per_file, self.summary_file = root, units_per_file, summary_file

    def write(self, iterator: Iterator[pa.RecordBatch]) -> QueueSummaries:
        return QueueSummaries(write_queue_files(iterator, self.root, self.units_per_file))

    def commit(self, messages: list) -> None:
        if self.summary_file:
            rows = sorted(tuple(r) for m in messages if m is not None for r in m.rows)
            Path(self.summary_file).write_text(json.dumps(rows))


@dataclass
class RebuildReport:
    out: str  # the directory holding consumequeue/ (and index/)
    queues: list[tuple] = field(default_factory=list)  # summary rows, sorted by topic and queue
    entries: int = 0
    key_index: str | None = None  # the index directory, if the key index was rebuilt
    light_queue_store: str = "kv"  # where the light queues went: "file" (consumequeue/) or "kv"
    light_queue_tables: str | None = None  # the key-value tables' directory, if written
    light_queues: int = 0  # light queues in the tables
    light_units: int = 0  # units written into the tables
    messages: list[str] = field(default_factory=list)


def units_per_file_of(store: str) -> int | None:
    """The units per file of a store's existing consume-queue files (they keep their size)."""
    root = files.join(store, "consumequeue")
    if not files.is_dir(root):
        return None
    for topic, _, topic_is_dir in files.listdir(root):
        if not topic_is_dir:
            continue
        for queue, _, queue_is_dir in files.listdir(files.join(root, topic)):
            if not queue_is_dir:
                continue
            for name, size, is_dir in files.listdir(files.join(root, topic, queue)):
                if not is_dir and name.isdigit() and len(name) == 20 and size >= UNIT_SIZE:
                    return size // UNIT_SIZE
    return None


@contextlib.contextmanager
def stopped_store(store: Path):
    """Hold the store's lock for the duration: refuse if a broker (or anyone) holds it."""
    path = store / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise StoreLockedError(
                f"store {store} is in use (pid {holder}): stop its broker before rebuilding its indexes in place"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def report_tail(store: str, messages: list[str]) -> None:
    for commit_log in planning.resolve([store]):
        bad = planning.tail_damage(commit_log)
        if bad is not None:
            msg = (
                f"torn tail at commit-log offset {bad.offset} ({bad.reason}): "
                f"read up to the last valid record, which ends there"
            )
            log.warning("broker %s: %s", commit_log.broker, msg)
            messages.append(msg)


def rebuild(
    spark,
    store: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    in_place: bool = False,
    units_per_file: int | None = None,
    key_index: bool = True,
    hash_slots: int | None = None,
    max_entries: int | None = None,
    partition_size: int | str | None = None,
    queue_partitions: int | None = None,
    start_offset: int | None = None,
    end_offset: int | None = None,
    light_queue_store: str | None = None,
) -> RebuildReport:
    """Build the indexes of `store` from its commit log: `out/consumequeue/` and (with
    `key_index`) `out/index/`, laid out as in a store; or with `in_place` replace the stopped
    store's own.  File geometry (units per file, hash slots, entries per index file) is taken
    from the store's existing files when not given, else the defaults.  `start_offset` /
    `end_offset` bound the commit-log range read (as the source's startOffset / endOffset).
    Light queues go into `light_queue_store` ("file" or "kv": `light_queues.py`), the tables into
    `out/lightqueue/` (a local directory); by default each goes where the store has it."""
    from .key_index import INDEX_COLUMNS, index_geometry, write_key_index

    store = files.normalize(store)
    if in_place == (out is not None):
        raise ValueError("rebuild needs exactly one of an output directory or in_place")
    if in_place and not files.is_local(store):
        raise ValueError(f"{store}: an in-place rebuild needs a local store (it takes the store's lock); use --out")
    if not files.is_dir(files.join(store, "commitlog")):
        raise FileNotFoundError(f"{store}: no commitlog directory")
    units_per_file = units_per_file or units_per_file_of(store) or DEFAULT_UNITS_PER_FILE
    geometry = (index_geometry(Path(store) / "index") if files.is_local(store) else None) or (None, None)
    hash_slots, max_entries = hash_slots or geometry[0], max_entries or geometry[1]
    out_is_local = files.is_local(files.normalize(out) if out is not None else store)
    light_store = light_queue_store_of(store, light_queue_store, out_is_local)
    if light_store == "kv" and not out_is_local:
        raise ValueError(
            "the key-value light-queue tables (LMDB) are written on a local file system: give a local --out"
        )
    lock = stopped_store(Path(store)) if in_place else contextlib.nullcontext()
    with lock:
        target = files.normalize(out) if out is not None else os.path.join(store, "rebuild.tmp")  # one of them
        if in_place:
            shutil.rmtree(target, ignore_errors=True)
        files.makedirs(target)
        report = RebuildReport(out=store if in_place else target, light_queue_store=light_store)
        report_tail(store, report.messages)

        def reader(source: str):
            read = spark.read.format(source).option("checkCRC", "true")
            for option, value in (
                ("partitionSize", partition_size),
                ("startOffset", start_offset),
                ("endOffset", end_offset),
            ):
                if value is not None:
                    read = read.option(option, str(value))
            return read

        spark.dataSource.register(QueueUnitsSource)
        with job_errors():  # the source plans (in Python, started by Spark) when it is loaded
            df = reader(UNITS_SOURCE).load(store)
        table_df = None
        if light_store == "kv":
            # one scan of the log for both passes (files, then tables): the queue units are kept;
            # by default the store's own file light queues stay files, as the store keeps them
            units_df = df.persist(StorageLevel.MEMORY_AND_DISK)
            df, table_df = table_rows(units_df, file_light_queues(store) if light_queue_store is None else [])
        df = df.repartition(queue_partitions or spark.sparkContext.defaultParallelism, "topic", "queue_id")
        df = df.sortWithinPartitions("topic", "queue_id", "first_offset")
        queues_dir = files.join(target, "consumequeue")
        files.makedirs(queues_dir)
        if files.is_local(queues_dir):
            spread_topic_directories(Path(queues_dir))  # as the store marks its own (the topics' directories spread)
        # the driver-side commit leaves the per-queue summaries here (the driver's machine)
        summary_dir = tempfile.mkdtemp(prefix="tidemq-rebuild-")
        summary = Path(summary_dir) / "summary.json"
        spark.dataSource.register(ConsumeQueueSink)
        try:
            with job_errors():
                (
                    df.write.format(SINK_NAME)
                    .mode("append")
                    .option("unitsPerFile", str(units_per_file))
                    .option("summaryFile", str(summary))
                    .save(queues_dir)
                )
            report.queues = [tuple(r) for r in json.loads(summary.read_text())]
        finally:
            shutil.rmtree(summary_dir, ignore_errors=True)
        report.entries = sum(r[2] for r in report.queues)
        tables_written = False
        if table_df is not None:
            tables = Path(target) / KV_DIRECTORY
            shutil.rmtree(tables, ignore_errors=True)
            old = Path(store) / KV_DIRECTORY if files.is_local(store) else None
            with job_errors():
                rows = table_df.orderBy("topic", "first_offset").toLocalIterator()
                written = write_tables(rows, tables, dispatched_mark(store, end_offset), old)
            units_df.unpersist()
            if written is not None:
                tables_written = True
                report.light_queues, report.light_units = written
                report.light_queue_tables = files.join(store if in_place else target, KV_DIRECTORY)
        if key_index:
            with job_errors():
                entries = reader(SOURCE_NAME).option("columns", INDEX_COLUMNS).load(store)
                write_key_index(spark, entries, files.join(target, "index"), hash_slots, max_entries)
            report.key_index = files.join(store if in_place else target, "index")
        if in_place:
            names = ["consumequeue"] + (["index"] if key_index else []) + ([KV_DIRECTORY] if tables_written else [])
            _swap_in(Path(store), Path(target), names)
    return report


def dispatched_mark(store: str, end_offset: int | None) -> int:
    """The tables' `dispatched` mark after a rebuild: the end of the log's valid records (or
    `end_offset`, if the read stopped before it), as the store's dispatch leaves it."""
    end = 0
    for commit_log in planning.resolve([store]):
        bad = planning.tail_damage(commit_log)
        end = max(end, bad.offset if bad is not None else planning.chain_end(commit_log))
    return min(end, end_offset) if end_offset is not None else end


def _swap_in(store: Path, built: Path, names: list[str]) -> None:
    """Replace store/<name> with built/<name> for each name; the old ones are deleted."""
    for name in names:
        live, old, new = store / name, store / f"{name}.old", built / name
        if old.exists():
            shutil.rmtree(old)
        if live.exists():
            live.rename(old)
        if new.exists():
            new.rename(live)
        if old.exists():
            shutil.rmtree(old)
        log.info("rebuild: replaced %s with the rebuilt one", live)
    shutil.rmtree(built, ignore_errors=True)
