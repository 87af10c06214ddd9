"""Disk blocks behind the pages of a shared file mapping, allocated before the pages are written.

A page of a sparse file written through a mapping on a full disk ends the process with SIGBUS;
`back_with_blocks` has the blocks allocated first, or raises StoreIOError (ENOSPC) having written
nothing, so the writer can wait for space.  Shared by the parts that write mapped files in place
(consume queues, whether through `mmap.mmap` or `_queue_file.Mapping`, and the key index); the
compiled copy loop of batch dispatch (`_dispatch.write_runs`) does the same for each copy."""

from __future__ import annotations

import errno
import mmap
from collections.abc import Callable
from typing import Any

from .errors import StoreIOError

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14


_PAGE = mmap.PAGESIZE
_populate = hasattr(mmap.mmap, "madvise")
_back_pages: Callable[[Any, int, int], None] | None
try:  # any writable mapping, `_queue_file.Mapping`s too
    from ._dispatch import back_pages as _back_pages
except ImportError:  # without the extension: `mmap.mmap`s only
    _back_pages = None


def back_with_blocks(mm, start: int, length: int) -> None:
    """Have the disk blocks behind the pages of the shared file mapping `mm[start:start+length]`
    allocated before they are written, or raise StoreIOError (ENOSPC) having written nothing: a
    page of a sparse file written on a full disk would otherwise end the process with SIGBUS.
    (MADV_POPULATE_WRITE, Linux 5.14: where the kernel or the mapping lacks it, nothing is done.)"""
    global _populate
    if length <= 0:
        return
    if _back_pages is not None:
        try:
            _back_pages(mm, start, length)
        except OSError as exc:
            raise StoreIOError(exc.errno, str(exc.strerror)) from None
        return
    if not _populate or not isinstance(mm, mmap.mmap):
        return
    first = start - start % _PAGE
    try:
        mm.madvise(MADV_POPULATE_WRITE, first, min(len(mm), start + length) - first)
    except OSError as exc:
        if exc.errno == errno.EFAULT:  # the fault that would have been a SIGBUS
            raise StoreIOError(errno.ENOSPC, "no disk block for a mapped page: the store's disk is full") from None
        if exc.errno == errno.EINVAL:  # an older kernel
            _populate = False
            return
        raise
