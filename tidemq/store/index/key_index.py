"""The key index: a dispatch sink that indexes each message's UNIQ_KEY, every KEYS entry and its tag
(as the key "T#tag", as RocketMQ 5.5.0 does), so a message can be found by its client id, a
business key or its tag (RocketMQ's IndexService over
`index_file.IndexFile`s; spec §7).

    {store}/index/{yyyyMMddHHmmssSSS}   one IndexFile each, oldest first; the newest takes entries

Entries are appended in commit-log order, so `indexed_until` (the end of the last record handed
to the index) is a true prefix: recovery re-dispatches from there and the index skips any record
below it, so an entry is never indexed twice.  ROLLBACK records are not indexed.

Recovery (spec §6): after an abnormal exit, the entries of records at or past the checkpoint's
index offset (below it, every entry was flushed) are taken out and rebuilt from the log; a file
whose chains past that point do not hold is destroyed and rebuilt whole, as is, when the
checkpoint has no index offset (RocketMQ writes none), every file whose endTs is newer than its
index timestamp.  Then every file is cut back to the recovered log end, restoring its chains and header
exactly.  A clean exit's files are kept as they are.

Ownership: the dispatch thread appends (`dispatch` or `append_entries`), or has a parallel-dispatch
worker append into the newest file's mapping while it waits (`start_file` makes the files); the
maintenance thread flushes; `_lock` guards the file list for queries on other threads.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..dispatch.requests import DispatchBatch, DispatchRequest, QueueKey
from ..format import record
from ..format.index_keys import key_hash, key_hashes, record_index_keys
from .index_file import DEFAULT_HASH_SLOTS, DEFAULT_MAX_ENTRIES, IndexFile, file_name

log = logging.getLogger(__name__)

MAX_QUERY_RESULTS = 64  # maxMsgsNumBatch


def index_paths(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.isdigit() and len(p.name) == 17)


class KeyIndex:
    name = "key_index"
    reads_keys = True  # asks each batch for its index_keys (see DispatchSink)

    def __init__(
        self,
        directory: Path,
        hash_slots: int = DEFAULT_HASH_SLOTS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        read_only: bool = False,
    ) -> None:
        if hash_slots < 1 or max_entries < 2:
            raise ValueError(f"an index file needs at least 1 hash slot and 2 entries, not {hash_slots}/{max_entries}")
        self.directory = Path(directory)
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.read_only = read_only
        self._lock = threading.Lock()
        self.files: list[IndexFile] = []
        self._filled: list[IndexFile] = []  # files filled since the last flush (see `_new_file`)
        self.indexed_until = 0  # every record below this commit-log offset has been handed over
        self.flushed_until = 0  # every record below this commit-log offset has its entries on disk
        self.last_store_timestamp = 0
        for path in index_paths(self.directory):
            try:
                self.files.append(IndexFile(path, hash_slots, max_entries, create=False, read_only=read_only))
            except (OSError, ValueError) as exc:
                log.warning(
                    "index file %s is unusable (%s); it is ignored%s",
                    path,
                    exc,
                    "" if read_only else " and will be rebuilt",
                )
                if not read_only:
                    path.rename(path.with_name(path.name + ".bad"))
        if self.files:
            self.last_store_timestamp = self.files[-1].end_timestamp

    # -- recovery -----------------------------------------------------------------------------------

    def recover(
        self,
        log_end: int,
        log_start: int,
        abnormal: bool,
        checkpoint_timestamp: int,
        store_time_of: Callable[[int], int | None],
        keys_of: Callable[[int], tuple[int, int] | None] = lambda phy: None,
        flushed_offset: int = 0,
    ) -> None:
        """Make the index a prefix of the recovered log and set `indexed_until`.  `keys_of(phy)`
        gives (end, number of index keys) of the record at `phy`, or None if unreadable.

        After an abnormal exit, `flushed_offset` (the checkpoint's: every record below it had its
        entries on disk; 0 if unknown) bounds what is kept: the entries of records at or past it
        are taken out, and the index is rebuilt from there only.  A file whose chains past that
        point do not lead back (pages lost with the machine) is destroyed and rebuilt; without a
        flushed offset, so is every file newer than `checkpoint_timestamp` (RocketMQ's rule)."""
        with self._lock:
            check_chains = abnormal and flushed_offset > 0
            if check_chains:
                log_end = min(log_end, flushed_offset)
            elif abnormal:
                while self.files and self.files[-1].end_timestamp > checkpoint_timestamp:
                    doomed = self.files.pop()
                    log.info(
                        "key index: destroying %s (end %d newer than the checkpoint's %d); it is rebuilt",
                        doomed.path.name,
                        doomed.end_timestamp,
                        checkpoint_timestamp,
                    )
                    doomed.destroy()
            while self.files:
                last = self.files[-1]
                if check_chains and not _dropped_chains_hold(last, log_end):
                    log.info(
                        "key index: destroying %s (its chains past commit-log offset %d do not hold); it is rebuilt",
                        last.path.name,
                        log_end,
                    )
                    self.files.pop().destroy()
                    continue
                dropped = 0 if _holds_nothing_past(last, log_end) else last.truncate(log_end, store_time_of)
                if dropped:
                    log.info(
                        "key index: dropped %d entries of %s past commit-log offset %d",
                        dropped,
                        last.path.name,
                        log_end,
                    )
                if last.entry_count:
                    break
                self.files.pop().destroy()
            # the newest record's entries may be split over two files, and the second may have
            # been destroyed: unless all its entries are there, drop it everywhere and index it
            # again, whole
            covered = log_start
            if self.files:
                covered = self.files[-1].end_phy
                known = keys_of(covered)
                present = sum(f.entries_at_end(covered) for f in self.files[-2:])
                if known is not None and known[1] == present:
                    covered = known[0]
                while self.files and self.files[-1].end_phy >= covered:
                    self.files[-1].truncate(covered, store_time_of)
                    if self.files[-1].entry_count:
                        break
                    self.files.pop().destroy()
        self.indexed_until = min(max(covered, log_start), log_end)
        self.last_store_timestamp = self.files[-1].end_timestamp if self.files else 0

    def recover_from_log(
        self, commit_log, log_end: int, abnormal: bool, checkpoint_timestamp: int, flushed_offset: int = 0
    ) -> None:
        """`recover` with the record lookups done on `commit_log`."""

        def read(phy: int):
            result = commit_log.read_record(phy, check_crc=False, read_body=False, read_properties=False)
            return result if type(result) is record.Record else None

        def store_time_of(phy: int) -> int | None:
            rec = read(phy)
            return rec.store_timestamp if rec is not None else None

        def keys_of(phy: int) -> tuple[int, int] | None:
            result = commit_log.read_record(phy, check_crc=False, read_body=False)
            if type(result) is not record.Record:
                return None
            indexed = result.transaction_type != record.TRANSACTION_ROLLBACK
            return phy + result.total_size, len(
                record_index_keys(result.unique_key, result.keys, result.tags)
            ) if indexed else 0

        self.recover(
            log_end, commit_log.min_offset, abnormal, checkpoint_timestamp, store_time_of, keys_of, flushed_offset
        )

    # -- the sink protocol ------------------------------------------------------------------------------

    def dispatch(self, requests: list[DispatchRequest], changes: dict[QueueKey, int]) -> None:
        texts: list[str] = []
        phys: list[int] = []
        times: list[int] = []
        skip_below = self.indexed_until
        end = skip_below
        for req in requests:
            if req.commit_log_offset < skip_below:
                continue
            end = req.commit_log_offset + req.size
            if req.sysflag & record.TRANSACTION_TYPE_MASK == record.TRANSACTION_ROLLBACK:
                continue
            for key in record_index_keys(req.unique_key, req.keys, req.tags):
                texts.append(f"{req.topic}#{key}")
                phys.append(req.commit_log_offset)
                times.append(req.store_timestamp)
        if requests:
            self.last_store_timestamp = requests[-1].store_timestamp
        if texts:
            self.append_entries(key_hashes(texts), np.asarray(phys, np.int64), np.asarray(times, np.int64), end)
        else:
            self.indexed_until = max(self.indexed_until, end)

    def dispatch_batch(self, batch: DispatchBatch, changes: dict[QueueKey, int]) -> None:
        """`dispatch` in columnar form: the keys' hashes computed from the batch's columns."""
        columns = batch.columns
        if not len(columns):
            return
        offsets = columns.offsets
        end = self.indexed_until
        if int(offsets[-1]) >= end:
            end = int(offsets[-1]) + int(columns.sizes[-1])
        self.last_store_timestamp = int(columns.store_timestamps[-1])
        hashes, phys, times = columns.index_keys()
        if len(hashes):
            self.append_entries(hashes, phys, times, end)
        else:
            self.indexed_until = max(self.indexed_until, end)

    def append_entries(self, hashes, phys, timestamps, end: int) -> None:
        """Append entries in log order (records below `indexed_until` are skipped); `end` is
        the commit-log offset they cover up to.  The columns are NumPy arrays, or lists (a
        trickle's few entries)."""
        if len(phys) and int(phys[0]) < self.indexed_until:
            keep = np.asarray(phys) >= self.indexed_until
            hashes, phys, timestamps = np.asarray(hashes)[keep], np.asarray(phys)[keep], np.asarray(timestamps)[keep]
        done = 0
        total = len(hashes)
        while done < total:
            current = self.files[-1] if self.files else None
            if current is None or current.is_full:
                current = self._new_file(int(timestamps[done]))
            done += current.append(hashes[done:], phys[done:], timestamps[done:])
        if total:
            self.last_store_timestamp = int(timestamps[-1])
        self.indexed_until = max(self.indexed_until, end)

    def start_file(self, first_timestamp: int) -> IndexFile:
        """Begin a new newest file, for entries a dispatch worker appends (its first entry
        stored at `first_timestamp`)."""
        return self._new_file(first_timestamp)

    def _new_file(self, first_timestamp: int) -> IndexFile:
        """Begin a new newest file.  The one it follows is full; `flush` makes it durable, off
        the dispatch thread (a flush here would stall dispatch for the whole file; RocketMQ
        flushes it on a thread of its own too)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = max(first_timestamp, 0)
        names = {f.path.name for f in self.files}
        while file_name(stamp) in names or (self.directory / file_name(stamp)).exists():
            stamp += 1  # two files starting in the same millisecond
        created = IndexFile(self.directory / file_name(stamp), self.hash_slots, self.max_entries, create=True)
        with self._lock:
            if self.files:
                self._filled.append(self.files[-1])
            self.files.append(created)
        return created

    def covered_offset(self) -> int:
        return self.indexed_until

    def truncate(self, commit_log_end: int, store_time_of: Callable[[int], int | None] = lambda phy: None) -> None:
        """Drop the entries of records at or past `commit_log_end`; `store_time_of(phy)` gives
        the store time of a record, for the header's endTs (else it is the entry's whole
        seconds)."""
        with self._lock:
            while self.files:
                last = self.files[-1]
                last.truncate(commit_log_end, store_time_of)
                if last.entry_count:
                    break
                self.files.pop().destroy()
        self.indexed_until = min(self.indexed_until, commit_log_end)

    def flush(self) -> int:
        """Make every entry durable; returns the store time they cover (the checkpoint's index
        timestamp), read before flushing so that it never claims more than reached the disk.
        `flushed_until` becomes the commit-log offset below which every record's entries are
        durable (the checkpoint's index offset), read before flushing too."""
        until = self.indexed_until
        with self._lock:
            files = [f for f in self._filled if f in self.files]  # those filled since the last flush
            files += [f for f in self.files[-2:] if f not in files]
        covered = files[-1].end_timestamp if files else 0
        for f in files:
            f.flush()
        with self._lock:
            self._filled = [f for f in self._filled if f not in files]
        self.flushed_until = until
        return covered

    def close(self) -> None:
        with self._lock:
            for f in self.files:
                f.close()
            self.files.clear()

    # -- queries -----------------------------------------------------------------------------------------

    def lookup(
        self, topic: str, key: str, begin: int = 0, end: int = 2**63 - 1, max_num: int = MAX_QUERY_RESULTS
    ) -> list[int]:
        """Commit-log offsets of records that may carry `key` in `topic`, stored within [begin,
        end] (ms), newest first.  Entries keep whole seconds, so candidates are checked against
        the records by `query`."""
        hash_value = key_hash(f"{topic}#{key}")
        found: list[int] = []
        with self._lock:
            files = list(self.files)
        for f in reversed(files):
            begin_ts, end_ts = f.begin_timestamp, f.end_timestamp
            if end_ts < begin - 1000 or begin_ts > end:
                continue
            for phy in f.lookup(hash_value, begin - 1000, end, 4 * max_num):
                if phy not in found:
                    found.append(phy)
            if begin_ts < begin:
                break
        return found


def _first_entry_at(f: IndexFile, phy: int) -> int:
    """The index of the first entry of `f` for a record at or past commit-log offset `phy`
    (entries are in commit-log order); `index_count` if none is."""
    lo, hi = 1, max(f.index_count, 1)
    column = f.entries["phy"]
    while lo < hi:
        mid = (lo + hi) // 2
        if int(column[mid]) < phy:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _holds_nothing_past(f: IndexFile, phy: int) -> bool:
    """Whether `f` has no entry, counted or left past its count by a crash, for a record at or
    past `phy` (then cutting it back there changes nothing)."""
    count = max(f.index_count, 1)
    after = f.entries[count] if count < f.max_entries else None
    return (count == 1 or f.end_phy < phy) and (after is None or not (after["hash"] | after["phy"]))


def _dropped_chains_hold(f: IndexFile, phy: int) -> bool:
    """Whether the entries of records at or past `phy` can be taken out of `f` by following its
    chains back: every chain that starts among them runs, through entries of its own slot for
    records at or past `phy`, back to an earlier entry.  After the process alone died they
    always do; after the machine did, slots written after the last flush may point at entries
    that never reached the disk (past its header's count too)."""
    keep = _first_entry_at(f, phy)
    heads = f.slots.astype(np.int64)
    slots = np.nonzero(heads >= keep)[0]
    current = heads[slots]
    while len(slots):
        if int(current.max()) >= f.max_entries:
            return False
        entries = f.entries[current]
        back = entries["prev"].astype(np.int64)
        if (
            (entries["hash"].astype(np.int64) % f.hash_slots != slots).any()
            or (entries["phy"].astype(np.int64) < phy).any()
            or (back >= current).any()
            or (back < 0).any()
        ):
            return False
        further = back >= keep
        slots, current = slots[further], back[further]
    return True


def record_matches(rec: record.Record, topic: str, key: str, begin: int, end: int) -> bool:
    """Does the record really carry `key` in `topic`, stored within [begin, end]?"""
    if rec.topic != topic or not begin <= rec.store_timestamp <= end:
        return False
    return key in record_index_keys(rec.unique_key, rec.keys, rec.tags)


def query(
    index: KeyIndex,
    read_record: Callable[[int], record.Record | None],
    topic: str,
    key: str,
    begin: int = 0,
    end: int = 2**63 - 1,
    max_num: int = MAX_QUERY_RESULTS,
) -> list[record.Record]:
    """Records of `topic` carrying `key` (UNIQ_KEY or a KEYS entry) stored within [begin, end],
    newest first, at most `max_num`."""
    out = []
    for phy in index.lookup(topic, key, begin, end, max_num):
        rec = read_record(phy)
        if rec is not None and record_matches(rec, topic, key, begin, end):
            out.append(rec)
            if len(out) >= max_num:
                break
    return out


# ---------------------------------------------------------------------------------------------
# Read-only lookups on a store directory (the `tidemq store query` command): safe beside a
# running broker, files are mapped read-only.


class _LogReader:
    def __init__(self, store_dir: Path) -> None:
        from ..log.commit_log import segment_paths

        self._paths = {int(p.name): p for p in segment_paths(store_dir)}
        self._size = next(iter(self._paths.values())).stat().st_size if self._paths else 0
        self._maps: dict[int, mmap.mmap] = {}

    def read(self, offset: int) -> record.Record | None:
        if not self._size or offset < 0:
            return None
        base = offset - offset % self._size
        mm = self._maps.get(base)
        if mm is None:
            path = self._paths.get(base)
            if path is None:
                return None
            with open(path, "rb") as f:
                mm = self._maps[base] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        rec = record.decode(mm, offset - base, base_offset=base, check_crc=False)
        if type(rec) is not record.Record:
            return None
        rec.body = rec.body_bytes
        return rec

    def close(self) -> None:
        for mm in self._maps.values():
            mm.close()


def store_topics(store_dir: Path) -> list[str]:
    root = Path(store_dir) / "consumequeue"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def query_directory(
    store_dir: Path, topic: str, key: str, begin: int = 0, end: int = 2**63 - 1, max_num: int = MAX_QUERY_RESULTS
) -> list[record.Record]:
    index = KeyIndex(Path(store_dir) / "index", read_only=True)
    reader = _LogReader(Path(store_dir))
    try:
        return query(index, reader.read, topic, key, begin, end, max_num)
    finally:
        index.close()
        reader.close()


def find_by_id(store_dir: Path, msg_id: str, topic: str | None = None) -> list[record.Record]:
    """The message with this id: an offset message id (store host + commit-log offset) is read
    directly; anything else is looked up as a UNIQ_KEY in `topic`, or in every topic."""
    reader = _LogReader(Path(store_dir))
    try:
        try:
            _, offset = record.parse_message_id(msg_id)
        except record.CodecError:
            offset = None
        if offset is not None:
            rec = reader.read(offset)
            if rec is not None and rec.msg_id == msg_id.upper() and (topic is None or rec.topic == topic):
                return [rec]
        found: list[record.Record] = []
        index = KeyIndex(Path(store_dir) / "index", read_only=True)
        try:
            for name in [topic] if topic else store_topics(store_dir):
                found.extend(r for r in query(index, reader.read, name, msg_id) if r.unique_key == msg_id)
        finally:
            index.close()
        return found
    finally:
        reader.close()
