"""Light queues in `rebuild`: where each goes, and the key-value tables written on the driver.

A light queue (`%LMQ%name`, queue 0: multi-dispatch, `tidemq.store.light`) is rebuilt in one of
the store's two forms (`light_queue_store`):

- `"file"`: RocketMQ's file queue `consumequeue/%LMQ%name/0/`, written by the same tasks and
  `QueueFilesWriter` as every other queue, so byte-identical to what the store's dispatch writes.
- `"kv"`: the store's LMDB tables (`lightqueue/`, `tidemq.store.light.kv`).

Asked for neither, the rebuild keeps the store's form: `kv` if it has the tables, and then the
light queues it holds as file queues (a store RocketMQ wrote, then tidemq) stay files, as the
store keeps them; `file` if it has light file queues only; else the store's default, `kv` (`file` for an output
that is not local).

The tables are written on the driver, from the light queues' unit rows streamed to it in order
(`toLocalIterator`: one partition in the driver's memory at a time).  Not by the tasks: LMDB is
one memory-mapped file with one writer at a time and a lock file that works on a local file
system only, so executors on other machines cannot share it, and executors need not have the
`lmdb` package.  The rows carry about 28 bytes a unit, so the driver's share is the writing.

What the log cannot give back, the tables of the store keep: an in-place rebuild carries each
surviving queue's consumer offsets (and their commit times) over from the old tables.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..store.format.special_queues import LMQ_PREFIX, LMQ_QUEUE_ID
from ..store.light.queues import KV_DIRECTORY, LIGHT_QUEUE_STORES
from ..store.queues.consume_queue import UNIT_DTYPE
from . import files

log = logging.getLogger(__name__)

DEFAULT_LIGHT_QUEUE_STORE = "kv"  # StoreConfig.light_queue_store's default
TABLE_BATCH = 16 * 1024  # units handed to the tables' writer at a time


def file_light_queues(store: str) -> list[str]:
    """The light queues `store` holds as RocketMQ file queues (`consumequeue/%LMQ%name/0/`)."""
    root = files.join(store, "consumequeue")
    if not files.is_dir(root):
        return []
    found = []
    for name, _, is_dir in files.listdir(root):
        if is_dir and name.startswith(LMQ_PREFIX) and files.is_dir(files.join(root, name, str(LMQ_QUEUE_ID))):
            found.append(name)
    return found


def light_queue_store_of(store: str, choice: str | None, out_is_local: bool = True) -> str:
    """`choice` if given; else the form the store's light queues are in: `kv` if it has the
    tables, `file` if it has light file queues and no tables, else the store's default (`file`
    when the output is not local: the tables are written on a local file system only)."""
    if choice is not None:
        if choice not in LIGHT_QUEUE_STORES:
            raise ValueError(f"light queue store must be one of {', '.join(LIGHT_QUEUE_STORES)}, not {choice!r}")
        return choice
    if files.is_dir(files.join(store, KV_DIRECTORY)):
        return "kv"
    if file_light_queues(store) or not out_is_local:
        return "file"
    return DEFAULT_LIGHT_QUEUE_STORE


def table_rows(units_df, kept_as_files: Iterable[str]):
    """(the rows for the file sink, the rows for the tables) of the queue-units DataFrame."""
    from pyspark.sql import functions as F

    light = F.col("topic").startswith(LMQ_PREFIX) & (F.col("queue_id") == LMQ_QUEUE_ID)
    kept = sorted(kept_as_files)
    if kept:
        light = light & ~F.col("topic").isin(kept)
    return units_df.filter(~light), units_df.filter(light)


def write_tables(rows: Iterable, directory: Path, dispatched: int, old: Path | None = None) -> tuple[int, int] | None:
    """Write the light queues' unit rows (topic, queue_offsets, units, store_times; in order of
    queue, then commit-log offset) into new tables at `directory`, as the store's dispatch
    writes them (`KvLightQueues.write`: each unit at its slot, a later one at a slot replacing
    an earlier); mark `dispatched`; carry consumer offsets over from the tables at `old`.
    Returns (queues, units), or None (and no tables made) if there is no row and no old tables."""
    from ..store.light.kv import KvLightQueues

    had_tables = old is not None and (old / "data.mdb").is_file()
    rows = iter(rows)
    first = next(rows, None)
    if first is None and not had_tables:
        return None
    kv = KvLightQueues(directory)
    units_written = 0
    try:
        batch: list[tuple[str, int, int, int, int, int]] = []
        for row in itertools.chain([first] if first is not None else [], rows):
            offsets = np.frombuffer(row["queue_offsets"], ">i8").tolist()
            units = np.frombuffer(row["units"], UNIT_DTYPE)
            times = np.frombuffer(row["store_times"], ">i8").tolist()
            batch += zip(
                [row["topic"]] * len(offsets),
                offsets,
                units["offset"].tolist(),
                units["size"].tolist(),
                units["tags_code"].tolist(),
                times,
            )
            if len(batch) >= TABLE_BATCH:
                kv.write(batch, -1)
                units_written += len(batch)
                batch = []
        kv.write(batch, -1)
        units_written += len(batch)
        kv.mark_dispatched(dispatched)
        if had_tables:
            assert old is not None
            carry_consumer_offsets(old, kv)
        queues = kv.count()
        kv.flush()
    finally:
        kv.close()
    return queues, units_written


def carry_consumer_offsets(old: Path, kv) -> int:
    """Copy each group's consumed offset of a light queue from the tables at `old` (opened
    read-only: safe beside a broker that has them open) into `kv`, for the queues `kv` has; the
    queue's last activity is the later of the two.  Returns how many offsets were carried."""
    import lmdb  # the driver's: see the module docstring

    from ..store.light.kv import GROUP_ROW, QUEUE_ROW

    env = lmdb.open(str(old), readonly=True, max_dbs=8, max_readers=1024, create=False)
    carried = 0
    try:
        with env.begin() as txn:
            groups = env.open_db(b"groups", txn=txn, create=False)
            queues = env.open_db(b"queues", txn=txn, create=False)
            names: dict[bytes, str] = {}
            for key, value in txn.cursor(db=groups):
                number = bytes(key[:8])
                if number not in names:
                    row = txn.get(number, db=queues)
                    names[number] = "" if row is None else bytes(row[QUEUE_ROW.size :]).decode("utf-8")
                if not names[number]:
                    continue
                offset, when = GROUP_ROW.unpack(value)
                if kv.commit_consumer_offset(bytes(key[8:]).decode("utf-8"), names[number], offset, when):
                    carried += 1
    finally:
        env.close()
    if carried:
        log.info("rebuild: carried %d light-queue consumer offset(s) over from the old tables", carried)
    return carried
