"""Rebuild the key index (`{store}/index/`, spec §7) from the CommitLog on Spark.

The index is one sequence of entries in commit-log order — each entry links to the previous one of
its hash slot, across the whole file — so it is written by a single task: Spark decodes the log
in parallel, turns each record into its entries (UNIQ_KEY first, then every KEYS entry, then "T#tag"; ROLLBACK
records get none, as the store's sink does), sorts them by commit-log offset into one partition,
and that task appends them with the store's own `KeyIndex.append_entries`, so the files are
byte-identical to what the store's dispatcher builds.  For an index directory that is not local
(a URI), the task builds the files in a local temporary directory and copies them there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from ..store import record
from ..store.format.index_keys import TAG_KEY_PREFIX, key_hashes
from ..store.index.index_file import DEFAULT_HASH_SLOTS, DEFAULT_MAX_ENTRIES, IndexFile
from ..store.index.key_index import KeyIndex, index_paths
from . import files

SINK_NAME = "tidemq-keyindex"
INDEX_COLUMNS = "topic,commit_log_offset,size,store_timestamp,unique_key,keys,tags,sysflag"


def index_geometry(directory: Path) -> tuple[int, int] | None:
    """(hash slots, max entries) of an existing index's files, which keep their geometry: read
    by `IndexFile` from the first file it accepts."""
    for path in index_paths(directory):
        try:
            index_file = IndexFile(path, None, None, create=False, read_only=True)
        except ValueError:
            continue  # a damaged or empty file says nothing about the geometry
        try:
            return index_file.hash_slots, index_file.max_entries
        finally:
            index_file.close()
    return None


@dataclass
class IndexSummary(WriterCommitMessage):
    entries: int
    files: int


def append_entries(
    batches: Iterator[pa.RecordBatch], directory: str, hash_slots: int, max_entries: int
) -> IndexSummary:
    """Entries sorted by (commit-log offset, position in the record) into a fresh KeyIndex
    (what a retried task or an earlier run left there is removed first: KeyIndex appends)."""
    files.remove_tree(directory)
    if files.is_local(directory):
        return _append_entries(batches, directory, hash_slots, max_entries)
    building = tempfile.mkdtemp(prefix="tidemq-index-")
    try:
        summary = _append_entries(batches, os.path.join(building, "index"), hash_slots, max_entries)
        files.upload_tree(os.path.join(building, "index"), directory)
        return summary
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _append_entries(
    batches: Iterator[pa.RecordBatch], directory: str, hash_slots: int, max_entries: int
) -> IndexSummary:
    index = KeyIndex(Path(directory), hash_slots, max_entries)
    entries = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            topics = batch.column("topic").to_pylist()
            keys = batch.column("key").to_pylist()
            phys = batch.column("commit_log_offset").to_numpy().astype(np.int64)
            ends = phys + batch.column("size").to_numpy().astype(np.int64)
            times = batch.column("store_ms").to_numpy().astype(np.int64)
            hashes = key_hashes([f"{t}#{k}" for t, k in zip(topics, keys)])
            index.append_entries(hashes, phys, times, int(ends[-1]))
            entries += batch.num_rows
        index.flush()
        return IndexSummary(entries, len(index.files))
    finally:
        index.close()


class KeyIndexSink(DataSource):
    """`tidemq-keyindex`: write-only; options path (the index directory), hashSlots, maxEntries."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def writer(self, schema, overwrite: bool) -> KeyIndexWriter:
        return KeyIndexWriter(self.options["path"], int(self.options["hashSlots"]), int(self.options["maxEntries"]))


class KeyIndexWriter(DataSourceArrowWriter):
    def __init__(self, directory: str, hash_slots: int, max_entries: int) -> None:
        self.directory, self.hash_slots, self.max_entries = directory, hash_slots, max_entries

    def write(self, iterator: Iterator[pa.RecordBatch]) -> IndexSummary:
        return append_entries(iterator, self.directory, self.hash_slots, self.max_entries)


def key_entries(df):
    """One row per index entry, in one partition, in the order the store's sink appends them."""
    from pyspark.sql import functions as F

    mask = record.TRANSACTION_TYPE_MASK
    df = df.where(df.sysflag.bitwiseAND(mask) != record.TRANSACTION_ROLLBACK)
    none = F.array().cast("array<string>")
    unique = F.when(df.unique_key.isNotNull() & (df.unique_key != ""), F.array(df.unique_key)).otherwise(none)
    # the tag last, as the key "T#tag" (index_keys.record_index_keys)
    tag = F.when(df.tags.isNotNull() & (df.tags != ""), F.array(F.concat(F.lit(TAG_KEY_PREFIX), df.tags))).otherwise(
        none
    )
    entries = df.select(
        "topic",
        "commit_log_offset",
        "size",
        F.unix_millis("store_timestamp").alias("store_ms"),
        F.posexplode(F.concat(unique, df["keys"], tag)).alias("pos", "key"),
    )
    return entries.repartition(1).sortWithinPartitions("commit_log_offset", "pos")


def write_key_index(spark, df, directory: str, hash_slots: int | None, max_entries: int | None) -> None:
    """Append the entries of `df` (the source with INDEX_COLUMNS) into a new index at `directory`."""
    spark.dataSource.register(KeyIndexSink)
    (
        key_entries(df)
        .write.format(SINK_NAME)
        .mode("append")
        .option("hashSlots", str(hash_slots or DEFAULT_HASH_SLOTS))
        .option("maxEntries", str(max_entries or DEFAULT_MAX_ENTRIES))
        .save(directory)
    )
