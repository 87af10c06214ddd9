"""CommitLog: every message appended once, in fixed-size mmapped segments.

    {store}/commitlog/{20-digit start offset}    segment_size bytes each (1 GiB default)

A segment is created sparse, its full size but no blocks (as RocketMQ's are), and blocks are
allocated (fallocate) ahead of the write position in steps of ALLOCATE_STEP before any page there
is written or warmed: a full disk is an error from `reserve`, with nothing written, never a SIGBUS
on a mapped page, and one message takes megabytes of disk, not a whole segment.  A record never spans two segments: when one does not fit with 8
bytes to spare, the rest of the segment gets a blank filler (`record.encode_blank`) and the record
goes to the next segment, whose start offset is `offset + size - offset % size`.

Ownership: one writer.  `append` is called with the store's append lock held; `write_position`
and the segment list change only under it.  Readers on other threads use `view()`, which never
blocks on the lock; `_segments_lock` guards the list against retention's deletions.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from pathlib import Path

from ..format import record
from ..format.record import BLANK_SIZE, EncodedMessage
from .page_warmer import MADV_POPULATE_WRITE, PageWarmer

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_SIZE = 1 << 30
# Appends map the segment this far ahead of them at a time.  The warmed pages are dirty (zeros)
# until written, so a flush writes back up to this much ahead once: small enough not to show
# in an fsync's latency, big enough to replace 256 page faults with one call.
WARM_AHEAD = 1 << 20
# With a background PageWarmer (async flush), appends ask it to keep the segment warm this far
# ahead, again every BACKGROUND_WARM_STEP bytes.  Each flush writes back at most this much of
# zeros ahead of the data once.
BACKGROUND_WARM_AHEAD = 8 << 20
BACKGROUND_WARM_STEP = 2 << 20
# Blocks are allocated this far ahead of the write position at a time (and at least as far as
# pages are warmed).
ALLOCATE_STEP = 16 << 20
_populate_write = hasattr(mmap.mmap, "madvise")


def segment_name(start: int) -> str:
    return f"{start:020d}"


def segment_paths(store_dir: Path) -> list[Path]:
    directory = Path(store_dir) / "commitlog"
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.isdigit() and len(p.name) == 20)


class Segment:
    __slots__ = ("start", "size", "path", "fd", "mm", "warm_end", "allocated_end")

    def __init__(self, path: Path, start: int, size: int, create: bool) -> None:
        self.start = start
        self.size = size
        self.path = path
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # sparse: blocks come with `allocate`
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        self.fd = fd
        self.warm_end = 0  # pages below this position are mapped writable (see `warm`)
        self.allocated_end = 0  # blocks below this position are allocated (see `allocate`)

    def allocate(self, needed: int, wanted: int) -> int:
        """Have blocks allocated for the segment's bytes up to `wanted`, or at least `needed` if
        the disk has no room for more; returns how far they are.  Raises OSError (ENOSPC) if not
        even `needed` fits, having written nothing."""
        if needed <= self.allocated_end and wanted <= self.allocated_end:
            return self.allocated_end
        for end in (min(self.size, wanted), min(self.size, needed)):
            try:
                _allocate(self.fd, self.allocated_end, end)
            except OSError:
                if end == min(self.size, needed):
                    raise
                continue
            self.allocated_end = max(self.allocated_end, end)
            break
        return self.allocated_end

    def warm(self, position: int, upto: int, chunk: int) -> int:
        """Map the pages from `position` to `upto` (rounded up to `chunk`) writable in one system call
        (MADV_POPULATE_WRITE), so that appends do not take a page fault every 4 KiB; returns
        how far the segment is warm.  Where the kernel cannot do it, pages fault in as written."""
        global _populate_write
        if upto <= self.warm_end:
            return self.warm_end
        # never past the page holding the allocated end (see `allocate`)
        end = min(self.size, -(-upto // chunk) * chunk, -(-self.allocated_end // mmap.PAGESIZE) * mmap.PAGESIZE)
        if end <= self.warm_end:
            return self.warm_end
        if _populate_write:
            start = max(self.warm_end, position)
            start -= start % mmap.PAGESIZE
            try:
                self.mm.madvise(MADV_POPULATE_WRITE, start, end - start)
            except (OSError, ValueError):
                _populate_write = False  # an older kernel: nothing to gain, nothing lost
        self.warm_end = end
        return end

    @property
    def end(self) -> int:
        return self.start + self.size

    def sync(self) -> None:
        # fdatasync releases the GIL (msync through mmap.flush would not), and on Linux writes back
        # pages dirtied through a shared mapping.
        os.fdatasync(self.fd)

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass  # a reader still holds a view; the mapping is released with it
        try:
            os.close(self.fd)
        except OSError:
            pass


def _allocate(fd: int, start: int, end: int) -> None:
    """Allocate blocks for [start, end) of a file (already that long)."""
    if end <= start:
        return
    try:
        os.posix_fallocate(fd, start, end - start)
    except OSError as exc:
        import errno

        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # the filesystem cannot reserve: pages get their blocks as they are written


class CommitLog:
    def __init__(
        self,
        directory: Path,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        warm_ahead: int = WARM_AHEAD,
        background_warm: bool = False,
    ) -> None:
        if segment_size < 4096:
            raise ValueError(f"segment size {segment_size} is too small (at least 4096 bytes)")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._segments_lock = threading.Lock()
        self.segments: list[Segment] = []
        paths = sorted(p for p in self.directory.iterdir() if p.name.isdigit() and len(p.name) == 20)
        sizes = [p.stat().st_size for p in paths]
        if sizes and max(sizes) > 0:
            # an existing log keeps the segment size it was written with
            segment_size = max(sizes)
        self.segment_size = segment_size
        for path, size in zip(paths, sizes):
            start = int(path.name)
            if start % segment_size:
                raise ValueError(
                    f"commit-log segment {path.name} is not aligned to the {segment_size}-byte segment size"
                )
            if size < segment_size:
                log.warning(
                    "commit-log segment %s is %d bytes, shorter than %d; extending it", path, size, segment_size
                )
            self.segments.append(Segment(path, start, segment_size, create=False))
        self._active: Segment | None = None  # the segment being appended to (append lock held)
        self._ready_end = 0  # records ending at or below this offset fit the active segment's warm pages
        self.warm_ahead = warm_ahead  # 0: pages fault in as they are written
        # background_warm: a PageWarmer thread warms ahead instead of the appends (async flush)
        self._warmer: PageWarmer | None = None
        if background_warm and warm_ahead and _populate_write:
            warmer = PageWarmer()
            self._warmer = warmer if warmer.available else None
        # set by recovery; until then, the end of the last segment's data is unknown
        self.write_position = self.segments[0].start if self.segments else 0
        self.flushed_position = self.write_position

    # -- reading ----------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        with self._segments_lock:
            return self.segments[0].start if self.segments else self.write_position

    def segment_for(self, offset: int) -> Segment | None:
        with self._segments_lock:
            segments = self.segments
            if not segments:
                return None
            index = (offset - segments[0].start) // self.segment_size
            if 0 <= index < len(segments):
                return segments[index]
        return None

    def view(self, offset: int, size: int) -> memoryview | None:
        """`size` bytes at `offset` from one segment, or None if not held."""
        segment = self.segment_for(offset)
        if segment is None:
            return None
        pos = offset - segment.start
        if pos + size > segment.size:
            return None
        return memoryview(segment.mm)[pos : pos + size]

    def read_record(self, offset: int, **decode_options) -> record.DecodeResult | None:
        segment = self.segment_for(offset)
        if segment is None:
            return None
        return record.decode(segment.mm, offset - segment.start, base_offset=segment.start, **decode_options)

    def next_segment_start(self, offset: int) -> int:
        return offset + self.segment_size - offset % self.segment_size

    # -- writing (append lock held) -----------------------------------------------------------

    def _ensure_segment(self, offset: int) -> Segment:
        segment = self.segment_for(offset)
        if segment is not None:
            return segment
        start = offset - offset % self.segment_size
        segment = Segment(self.directory / segment_name(start), start, self.segment_size, create=True)
        with self._segments_lock:
            self.segments.append(segment)
        return segment

    def warm_region(self) -> tuple[mmap.mmap, int, int] | None:
        """The active segment's mapping, the commit-log offset of its first byte, and the offset
        up to which records may be written in it without `reserve` (its warm pages); None before
        the first `reserve`.  A record ending past that offset goes through `reserve`."""
        segment = self._active
        if segment is None or self._ready_end <= self.write_position:
            return None
        return segment.mm, segment.start, self._ready_end

    def reserve(self, size: int) -> tuple[mmap.mmap, int, int]:
        """Where the next `size`-byte record goes: (segment mapping, position in it, commit-log
        offset).  Rolls to a new segment, closing the current one with a blank, when the record
        does not fit with 8 bytes to spare.  The caller writes the whole record there, then sets
        `write_position` to offset + size.  Raises OSError if no segment can be made, leaving the
        log as it was."""
        offset = self.write_position
        segment = self._active
        if offset + size <= self._ready_end and segment is not None:  # the common case: room in warm pages
            return segment.mm, offset - segment.start, offset
        if size + BLANK_SIZE > self.segment_size:
            raise ValueError(f"a {size}-byte record cannot fit a {self.segment_size}-byte segment")
        segment = self._active
        if segment is None or not segment.start <= offset < segment.end:
            segment = self._active = self._ensure_segment(offset)
        pos = offset - segment.start
        room = segment.size - pos
        if size + BLANK_SIZE > room:
            made = self.segment_for(segment.end) is None
            next_segment = self._ensure_segment(segment.end)  # may raise: nothing written yet
            try:
                next_segment.allocate(size + BLANK_SIZE, size + BLANK_SIZE)  # may raise too
                segment.allocate(pos + BLANK_SIZE, pos + BLANK_SIZE)
            except OSError:
                if made:  # no segment without blocks: a reader of its first page would fault (tmpfs)
                    self._drop(next_segment)
                raise
            segment.mm[pos : pos + BLANK_SIZE] = record.encode_blank(room)
            segment, pos = next_segment, 0
            self._active = segment
            self.write_position = offset = segment.start
        # blocks for the record and the blank that may follow it, and as far ahead as pages warm
        warm_to = pos + size + (BACKGROUND_WARM_AHEAD if self._warmer is not None else self.warm_ahead)
        allocated = segment.allocate(pos + size + BLANK_SIZE, max(warm_to, pos + size + ALLOCATE_STEP))  # may raise
        if self._warmer is not None:
            self._warmer.request(segment, pos, min(pos + size + BACKGROUND_WARM_AHEAD, allocated))
            ready = min(segment.size, pos + size + BACKGROUND_WARM_STEP)
        elif self.warm_ahead:
            ready = segment.warm(pos, min(pos + size + self.warm_ahead, allocated), self.warm_ahead)
        else:
            ready = min(segment.size, pos + size + (1 << 20))  # no warming: only bounds the fast path
        self._ready_end = segment.start + min(ready, allocated - BLANK_SIZE, segment.size - BLANK_SIZE)
        return segment.mm, pos, offset

    def append(self, message: EncodedMessage, queue_offset: int, store_timestamp: int) -> int:
        """Write an encoded record at the write position; returns its commit-log offset."""
        size = message.total_size
        mm, pos, offset = self.reserve(size)
        message.pack_into(mm, pos, queue_offset, offset, store_timestamp)
        self.write_position = offset + size
        return offset

    # -- durability ---------------------------------------------------------------------------

    def flush(self) -> int:
        """Make everything written so far durable; returns the flushed position."""
        target = self.write_position
        if target <= self.flushed_position:
            return self.flushed_position
        with self._segments_lock:
            segments = [s for s in self.segments if s.end > self.flushed_position and s.start < target]
        for segment in segments:
            segment.sync()
        self.flushed_position = max(self.flushed_position, target)
        return self.flushed_position

    # -- recovery and retention -------------------------------------------------------------

    def truncate(self, end: int) -> None:
        """Forget everything at and after `end`: zero the rest of its segment, delete later ones."""
        with self._segments_lock:
            later = [s for s in self.segments if s.start > end]
            for segment in later:
                self.segments.remove(segment)
        self._active = None
        self._ready_end = 0
        for segment in later:
            self._remove(segment)
        last = self.segment_for(end)
        if last is not None:
            pos = end - last.start
            _zero(last.mm, pos, last.size, last.fd)
            last.sync()
        self.write_position = end
        self.flushed_position = min(self.flushed_position, end)

    def delete_segments_before(self, offset: int) -> list[Segment]:
        """Remove whole segments that end at or before `offset` (never the one being written)."""
        with self._segments_lock:
            doomed = [s for s in self.segments[:-1] if s.end <= offset and s.end <= self.write_position]
            self.segments = [s for s in self.segments if s not in doomed]
        for segment in doomed:
            self._remove(segment)
        return doomed

    def _drop(self, segment: Segment) -> None:
        """Take a segment just made, with nothing written in it, out again."""
        with self._segments_lock:
            self.segments = [s for s in self.segments if s is not segment]
        self._remove(segment)

    def _remove(self, segment: Segment) -> None:
        """Unmap and delete a segment already taken out of `segments` (no warming on it after)."""
        if self._warmer is not None:
            self._warmer.forget(segment)
        segment.close()
        segment.path.unlink(missing_ok=True)

    def close(self) -> None:
        self._active = None
        self._ready_end = 0
        if self._warmer is not None:
            self._warmer.stop()
        with self._segments_lock:
            for segment in self.segments:
                segment.close()
            self.segments = []


def _zero(mm: mmap.mmap, start: int, end: int, fd: int | None = None, chunk: int = 1 << 20) -> None:
    """Zero [start, end) of the mapping of file `fd`, writing only chunks that are not zero
    already.  The file's holes (SEEK_DATA / SEEK_HOLE: never written, they read as zeros) are
    skipped without being read, so a mostly empty segment is not paged in whole."""
    zeros = bytes(chunk)
    pos = start
    while pos < end:
        stop = end
        if fd is not None:
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
                stop = min(end, os.lseek(fd, pos, os.SEEK_HOLE))
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # nothing but holes from here to the end of the file
                    return
                fd = None  # a file system without SEEK_DATA: compare every chunk
        while pos < stop:
            n = min(chunk, stop - pos)
            if mm[pos : pos + n] != zeros[:n]:  # memcmp, not a per-byte Python loop
                mm[pos : pos + n] = zeros[:n]
            pos += n
