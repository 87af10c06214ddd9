"""IndexFile: one file of the key index, RocketMQ's layout (spec §7).

Byte layout (big-endian):

    header   40 bytes   beginTs i64, endTs i64, beginPhy i64, endPhy i64,
                        hashSlotCount i32: the slots in use (one more each time an entry starts a
                                           chain, i.e. gets prevIndex 0),
                        indexCount i32 (starts at 1: entry 0 is never used)
    slots    hash_slots × 4 bytes   i32: the newest entry of the slot's chain, 0 = empty
    entries  max_entries × 20 bytes keyHash i32 + phyOffset i64 + timeDiff i32 + prevIndex i32
                                    = 4 + 8 + 4 + 4 = 20

    size = 40 + hash_slots × 4 + max_entries × 20   (defaults 5,000,000 / 20,000,000: 420,000,040)
    path = {store}/index/{yyyyMMddHHmmssSSS}         (UTC time of the file's first entry)

keyHash = abs(Java String.hashCode("topic#key")), with Integer.MIN_VALUE → 0; slot = keyHash %
hash_slots; timeDiff = whole seconds since beginTs, clamped to [0, 2^31 - 1].  A file holds at most
max_entries - 1 entries; a full file is followed by a new one.

The slot table's size is not in the file: it is configuration (maxHashSlotNum).  A file whose size
does not fit the configured geometry is opened with the default one if that fits, else with the
geometry its own entries prove (entry 1 holds beginPhy and entry indexCount - 1 endPhy), so an
index written under another configuration still reads.  Files of earlier tidemq versions kept the
table size in hashSlotCount: a writable open recounts the slots in use when the field is larger
than the entries could fill.

Entries are appended in commit-log order, a batch at a time, by the compiled loop or, where it is
not built, by its Python reference (`_write_python`; tests hold the two to the same bytes), so a
file is a pure function of the entries given to it: rebuilding after a crash produces the same bytes.  Ownership: one writer
(the dispatch thread); queries may run on other threads and read a consistent header because it
is written last.
"""

from __future__ import annotations

import datetime
import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..blocks import back_with_blocks

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size  # 8 × 4 + 4 + 4 = 40
SLOT_SIZE = 4
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = ENTRY.size  # 4 + 8 + 4 + 4 = 20
ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")])
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE and HEADER_SIZE == 40

PAGE_SIZE = mmap.PAGESIZE
MAX_SLOT_PAGES_BACKED_ONE_BY_ONE = 256  # more slot pages in one append: the whole table is backed
DEFAULT_HASH_SLOTS = 5_000_000
DEFAULT_MAX_ENTRIES = 20_000_000
INT_MAX = 0x7FFFFFFF

_index_append: Callable[..., None] | None
try:
    from .._dispatch import index_append as _index_append
except ImportError:  # the extension is optional: without it, the Python reference appends
    _index_append = None

# whether `append` runs the compiled loop; tests switch it off to compare the bytes
COMPILED = _index_append is not None
_I32 = struct.Struct(">i")


def file_size(hash_slots: int, max_entries: int) -> int:
    return HEADER_SIZE + hash_slots * SLOT_SIZE + max_entries * ENTRY_SIZE


def file_name(timestamp_ms: int) -> str:
    """yyyyMMddHHmmssSSS (UTC) of a store timestamp."""
    moment = datetime.datetime.fromtimestamp(max(timestamp_ms, 0) / 1000, tz=datetime.UTC)
    return moment.strftime("%Y%m%d%H%M%S") + f"{timestamp_ms % 1000:03d}"


# ---------------------------------------------------------------------------------------------
# Geometry of an existing file


def _agrees(mm, hash_slots: int, max_entries: int) -> bool:
    """Whether the file's bytes fit this geometry: entry 0 is zeros, entries 1 and
    indexCount - 1 hold the header's beginPhy and endPhy, and the last entry heads the chain of
    its hash's slot (a file without entries agrees with any geometry that fits its size)."""
    _, _, begin_phy, end_phy, _, count = HEADER.unpack_from(mm, 0)
    if hash_slots <= 0 or max_entries < 2 or file_size(hash_slots, max_entries) != len(mm):
        return False
    if count <= 1:
        return True
    if count > max_entries:
        return False
    entries_at = HEADER_SIZE + hash_slots * SLOT_SIZE
    if mm[entries_at : entries_at + ENTRY_SIZE] != bytes(ENTRY_SIZE):
        return False
    last_hash, last_phy = struct.unpack_from(">iq", mm, entries_at + (count - 1) * ENTRY_SIZE)
    first_phy = struct.unpack_from(">q", mm, entries_at + ENTRY_SIZE + 4)[0]
    head = _I32.unpack_from(mm, HEADER_SIZE + (last_hash % hash_slots) * SLOT_SIZE)[0] if last_hash >= 0 else -1
    return first_phy == begin_phy and last_phy == end_phy and head == count - 1


def _chains_hold(mm, hash_slots: int, count: int) -> bool:
    """Whether every slot heads a chain inside the file's entries and every entry's prev index
    and time difference are in range: what a guessed geometry must show, since a file's size and
    its last entry alone fit several (one record's entries share their phyOffset)."""
    slots = np.frombuffer(mm, dtype=">i4", count=hash_slots, offset=HEADER_SIZE)
    if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= count):
        return False
    entries = np.frombuffer(mm, dtype=ENTRY_DTYPE, count=count, offset=HEADER_SIZE + hash_slots * SLOT_SIZE)[1:]
    own = np.arange(1, count)
    return bool(np.all((entries["prev"] >= 0) & (entries["prev"] < own) & (entries["time_diff"] >= 0)))


def file_geometry(mm, hash_slots: int | None = None, max_entries: int | None = None) -> tuple[int, int] | None:
    """(hash slots, max entries) of an index file's bytes: the given geometry, the default one,
    or the one the entries prove (see the module docstring); None if none fits."""
    size = len(mm)
    candidates = [(hash_slots, max_entries), (DEFAULT_HASH_SLOTS, DEFAULT_MAX_ENTRIES)]
    legacy_slots = HEADER.unpack_from(mm, 0)[4]  # earlier tidemq versions: the table size
    if legacy_slots > 0 and (size - HEADER_SIZE - legacy_slots * SLOT_SIZE) % ENTRY_SIZE == 0:
        candidates.append((legacy_slots, (size - HEADER_SIZE - legacy_slots * SLOT_SIZE) // ENTRY_SIZE))
    for slots, entries in candidates:
        if slots is not None and entries is not None and _agrees(mm, slots, entries):
            return slots, entries
    _, _, _, end_phy, _, count = HEADER.unpack_from(mm, 0)
    if count <= 1:
        return None
    # the last entry's phyOffset field holds endPhy: each place it occurs names a slot count
    needle = struct.pack(">q", end_phy)
    first_field = HEADER_SIZE + SLOT_SIZE + (count - 1) * ENTRY_SIZE + 4  # with one slot
    at = mm.find(needle, first_field)
    while at >= 0:
        slots, rest = divmod(at - first_field, SLOT_SIZE)
        if not rest and (size - HEADER_SIZE - (slots + 1) * SLOT_SIZE) % ENTRY_SIZE == 0:
            entries = (size - HEADER_SIZE - (slots + 1) * SLOT_SIZE) // ENTRY_SIZE
            if _agrees(mm, slots + 1, entries) and _chains_hold(mm, slots + 1, count):
                return slots + 1, entries
        at = mm.find(needle, at + 1)
    return None


class IndexFile:
    def __init__(
        self, path: str | Path, hash_slots: int | None, max_entries: int | None, create: bool, read_only: bool = False
    ) -> None:
        """Create a file of the given geometry, or open one (the given geometry, None for the
        default, is tried first: see the module docstring)."""
        self.path = Path(path)
        if create:
            if hash_slots is None or max_entries is None:
                raise ValueError(f"index file {self.path}: a new file needs its hash slots and max entries")
            size = file_size(hash_slots, max_entries)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.ftruncate(fd, size)
                self.mm = mmap.mmap(fd, size)
                back_with_blocks(self.mm, 0, HEADER_SIZE)  # a full disk: an error, not a SIGBUS below
            except BaseException:
                if hasattr(self, "mm"):
                    self.mm.close()
                self.path.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)
            HEADER.pack_into(self.mm, 0, 0, 0, 0, 0, 0, 1)
        else:
            fd = os.open(self.path, os.O_RDONLY if read_only else os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                if size < HEADER_SIZE:
                    raise ValueError(f"index file {self.path} is {size} bytes, shorter than its header")
                self.mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE)
            finally:
                os.close(fd)
            geometry = file_geometry(self.mm, hash_slots, max_entries)
            if geometry is None:
                self.mm.close()
                raise ValueError(f"index file {self.path}: {size} bytes fit no hash-slot table its entries agree with")
            hash_slots, max_entries = geometry
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.slots_backed = False  # whether this process had the whole slot table's blocks allocated
        self.slots = np.frombuffer(self.mm, dtype=">i4", count=hash_slots, offset=HEADER_SIZE)
        self.entries = np.frombuffer(
            self.mm, dtype=ENTRY_DTYPE, count=max_entries, offset=HEADER_SIZE + hash_slots * SLOT_SIZE
        )
        if not create and not read_only:
            header = list(self.header())
            if header[4] > max(header[5], 1) - 1:  # more slots in use than entries: a table size
                header[4] = self._chains_started(max(header[5], 1))
                HEADER.pack_into(self.mm, 0, *header)

    def _chains_started(self, end: int) -> int:
        """The slots in use by entries [1, end): those entries that start a chain."""
        return int(np.count_nonzero(self.entries["prev"][1:end] == 0))

    # -- header -----------------------------------------------------------------------------------

    def header(self) -> tuple[int, int, int, int, int, int]:
        """(beginTs, endTs, beginPhy, endPhy, hashSlotCount, indexCount)."""
        return HEADER.unpack_from(self.mm, 0)

    @property
    def begin_timestamp(self) -> int:
        return self.header()[0]

    @property
    def end_timestamp(self) -> int:
        return self.header()[1]

    @property
    def end_phy(self) -> int:
        return self.header()[3]

    @property
    def index_count(self) -> int:
        return self.header()[5]

    @property
    def entry_count(self) -> int:
        return max(0, self.index_count - 1)

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.max_entries

    # -- writing ------------------------------------------------------------------------------------

    def append(
        self, hashes: np.ndarray | list[int], phys: np.ndarray | list[int], timestamps: np.ndarray | list[int]
    ) -> int:
        """Append entries (commit-log order); returns how many fitted.  The entries and their
        slots are written by the compiled loop or its Python reference (the same bytes), the
        header last."""
        begin_ts, _, begin_phy, _, slots_count, count = self.header()
        count = max(count, 1)
        n = min(len(hashes), self.max_entries - count)
        if n <= 0:
            return 0
        # the pages of the slots and entries written have disk blocks, or this raises having written nothing
        self._back_slots(hashes, n)
        back_with_blocks(self.mm, HEADER_SIZE + self.hash_slots * SLOT_SIZE + count * ENTRY_SIZE, n * ENTRY_SIZE)
        if count == 1:  # the file's first entry names its beginning
            begin_ts, begin_phy = int(timestamps[0]), int(phys[0])
        if COMPILED and _index_append is not None:
            columns = (np.ascontiguousarray(column[:n], dtype=np.int64) for column in (hashes, phys, timestamps))
            _index_append(self.mm, self.hash_slots, self.max_entries, count, *columns, begin_ts)
        else:
            listed = [c[:n] if type(c) is list else np.asarray(c[:n]).tolist() for c in (hashes, phys, timestamps)]
            self._write_python(listed[0], listed[1], listed[2], count, begin_ts)
        slots_count += int(np.count_nonzero(self.entries["prev"][count : count + n] == 0))
        HEADER.pack_into(
            self.mm, 0, begin_ts, int(timestamps[n - 1]), begin_phy, int(phys[n - 1]), slots_count, count + n
        )
        return n

    def _back_slots(self, hashes, n: int) -> None:
        """Have disk blocks behind the slots of `hashes[:n]` (`back_with_blocks`): page by page for
        a few pages, else the whole table, once per file (a busy log soon writes every page)."""
        if self.slots_backed:
            return
        if type(hashes) is list:
            pages = {(HEADER_SIZE + (h % self.hash_slots) * SLOT_SIZE) // PAGE_SIZE for h in hashes[:n]}
        else:
            at = HEADER_SIZE + (np.asarray(hashes[:n], dtype=np.int64) % self.hash_slots) * SLOT_SIZE
            pages = set(np.unique(at // PAGE_SIZE).tolist())
        if len(pages) > MAX_SLOT_PAGES_BACKED_ONE_BY_ONE:
            back_with_blocks(self.mm, HEADER_SIZE, self.hash_slots * SLOT_SIZE)
            self.slots_backed = True
            return
        for page in pages:
            back_with_blocks(self.mm, page * PAGE_SIZE, SLOT_SIZE)

    def _write_python(
        self, hashes: list[int], phys: list[int], timestamps: list[int], count: int, begin_ts: int
    ) -> None:
        """The entries from index `count` on and their slots, one entry at a time (the reference
        of `_dispatch.index_append`): each entry links to its slot's head and becomes the head.  A
        slot's head is followed if it is an entry below indexCount or one this call wrote for the
        same slot (a crash's leftover head may point at an entry this call wrote for another)."""
        mm = self.mm
        slots_at = HEADER_SIZE
        entries_at = HEADER_SIZE + self.hash_slots * SLOT_SIZE
        written: dict[int, int] = {}  # entry -> its slot
        index = count
        for key_hash, phy, timestamp in zip(hashes, phys, timestamps):
            slot = key_hash % self.hash_slots
            head = _I32.unpack_from(mm, slots_at + slot * SLOT_SIZE)[0]
            if not (0 < head < count or written.get(head) == slot):
                head = 0
            diff = min(max((timestamp - begin_ts) // 1000, 0), INT_MAX) if begin_ts > 0 else 0
            ENTRY.pack_into(mm, entries_at + index * ENTRY_SIZE, key_hash, phy, diff, head)
            _I32.pack_into(mm, slots_at + slot * SLOT_SIZE, index)
            written[index] = slot
            index += 1

    def truncate(self, commit_log_end: int, store_time_of) -> int:
        """Drop the entries of records at or past `commit_log_end`, restoring the chains, the
        header and the zeros exactly as they were before those entries; returns how many."""
        begin_ts, _, begin_phy, _, slots_count, count = self.header()
        count = max(count, 1)
        phys = self.entries["phy"][1:count].astype(np.int64)
        keep = 1 + int(np.searchsorted(phys, commit_log_end, side="left"))
        # entries past indexCount may exist (a crash between an entry and the header): drop them too
        written_end = count
        while written_end < self.max_entries and self.entries[written_end]["hash"] | self.entries[written_end]["phy"]:
            written_end += 1
        if keep == count and written_end == count:
            return 0
        # only the entries written are read: the rest of a large file stays unmapped
        previous = self.entries["prev"][:written_end].astype(np.int64)
        heads = self.slots.astype(np.int64)
        moved = heads >= keep
        while moved.any():
            where = np.nonzero(moved)[0]
            current = heads[where]
            current = np.where(current < written_end, current, 0)  # past them: zeros, no chain
            back = previous[current]
            back = np.where(back < current, back, 0)  # chains only go back; anything else is damage
            heads[where] = back
            moved = heads >= keep
        self.slots[:] = heads
        self.entries[keep:written_end] = np.zeros(written_end - keep, dtype=ENTRY_DTYPE)
        slots_count = self._chains_started(keep)
        if keep == 1:
            HEADER.pack_into(self.mm, 0, 0, 0, 0, 0, slots_count, 1)
        else:
            last_phy = int(self.entries[keep - 1]["phy"])
            last_ts = store_time_of(last_phy)
            if last_ts is None:
                last_ts = begin_ts + 1000 * int(self.entries[keep - 1]["time_diff"])
            HEADER.pack_into(self.mm, 0, begin_ts, last_ts, begin_phy, last_phy, slots_count, keep)
        return written_end - keep

    def entries_at_end(self, phy: int) -> int:
        """How many of the newest entries belong to the record at `phy`."""
        index = self.index_count - 1
        found = 0
        while index >= 1 and int(self.entries[index]["phy"]) == phy:
            found += 1
            index -= 1
        return found

    # -- reading ------------------------------------------------------------------------------------

    def lookup(self, hash_value: int, begin: int, end: int, max_num: int) -> list[int]:
        """Commit-log offsets of entries with this key hash stored within [begin, end], newest
        first (the caller checks the records: different keys may share a hash)."""
        begin_ts, _, _, _, _, count = self.header()
        found: list[int] = []
        index = int(self.slots[hash_value % self.hash_slots])
        # an append in progress links slots before it counts its entries: skip back to counted ones
        while count <= index < self.max_entries:
            previous = int(self.entries[index]["prev"])
            index = previous if previous < index else 0
        steps = 0
        while 0 < index < count and len(found) < max_num and steps < count:
            h, phy, diff, previous = self.entries[index].tolist()
            stored = begin_ts + 1000 * diff
            if h == hash_value and begin <= stored <= end:
                found.append(phy)
            if previous >= index:
                break
            index = previous
            steps += 1
        return found

    def flush(self) -> None:
        self.mm.flush()

    def close(self) -> None:
        del self.slots, self.entries
        try:
            self.mm.close()
        except BufferError:
            pass

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
