"""PageWarmer: maps the active commit-log segment's pages writable ahead of the appends, on its
own thread.

The first write to each page of a file mapping costs the kernel a page-cache allocation, zeroing
and the filesystem's page_mkwrite, more with memory pressure.  Paid inside `put` it is most of
the cost of a 1 KiB append.  The
warmer pays it on another thread instead, with MADV_POPULATE_WRITE (Linux 5.14) called through
ctypes, which releases the GIL for the call (`mmap.madvise` holds it).  RocketMQ warms its mapped
files ahead in a background service for the same reason.

Only under async flush: the warmed pages are dirty zeros, and under sync flush every fsync would
write back the whole warmed stretch ahead, so there appends warm a little inline instead
(`Segment.warm`).

If the warmer falls behind, appends fault their pages in themselves: it only ever saves work.

Ownership: `request` is called with the append lock held and only records the wish; the warmer
thread alone calls madvise, under `_busy`, which `forget` takes before a segment may be unmapped,
so no madvise can touch a closed mapping.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import threading

from ..blocks import MADV_POPULATE_WRITE

log = logging.getLogger(__name__)

CHUNK = 512 << 10  # one madvise call at a time, so `forget` never waits long


def _load_madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


def mapping_address(mm: mmap.mmap) -> int:
    """The address of a writable mapping's first byte (stable while it stays open)."""
    view = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # release the buffer export at once, so the mapping can still be closed


class PageWarmer:
    """`request(segment, position, upto)` asks for the segment's pages from `position` (where
    appends are) to `upto` to be made writable; the thread does it in CHUNK steps, from where it
    last stopped (`segment.warm_end`) or `position` if that is further."""

    def __init__(self) -> None:
        self._madvise = _load_madvise()
        self.available = self._madvise is not None
        self._busy = threading.Lock()  # held around each madvise call
        self._wake = threading.Event()
        self._segment = None
        self._address = 0
        self._from = 0
        self._upto = 0
        self._stopping = False
        self.chunks = 0  # madvise calls made (tests)
        self._thread = threading.Thread(target=self._run, name="tidemq-page-warmer", daemon=True)
        if self.available:
            self._thread.start()

    def request(self, segment, position: int, upto: int) -> None:
        if segment is not self._segment:
            with self._busy:
                self._segment = segment
                self._address = mapping_address(segment.mm)
        self._from = position
        self._upto = min(upto, segment.size)
        self._wake.set()

    def forget(self, segment) -> None:
        """`segment` is about to be unmapped: wait for a madvise on it to end, warm it no more."""
        with self._busy:
            if self._segment is segment:
                self._segment = None

    def stop(self) -> None:
        with self._busy:
            self._stopping = True
            self._segment = None
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                with self._busy:
                    segment = self._segment
                    if self._stopping:
                        return
                    if segment is None or segment.warm_end >= self._upto:
                        break
                    start = max(segment.warm_end, self._from)
                    start -= start % mmap.PAGESIZE
                    # never past the page holding `upto`: blocks are allocated only that far
                    end = min(segment.size, start + CHUNK, -(-self._upto // mmap.PAGESIZE) * mmap.PAGESIZE)
                    if self._madvise(self._address + start, end - start, MADV_POPULATE_WRITE) != 0:
                        self._give_up(ctypes.get_errno())
                        return
                    segment.warm_end = end
                    self.chunks += 1

    def _give_up(self, errno: int) -> None:
        # an older kernel (EINVAL) or no memory to spare: appends fault their pages in themselves
        log.info("page warming off: madvise(MADV_POPULATE_WRITE) failed with errno %d", errno)
        self.available = False
        self._segment = None
