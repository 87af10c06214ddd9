"""Queue-file page-cache benchmark: how many pages of a ConsumeQueue file a single write reads in.

    .venv/bin/python bench/queue_files.py [--dir DIR] [--units N]

A dispatch worker makes a queue file (sparse past what it writes) and writes slot 0; the store
adopts the queue and maps the file when first used, then the dispatch thread writes a slot on a
page no one has touched.  The mapping is advised for random access (`map_queue_file`), so that
fault reads in that page, not the file's holes ahead of it.  Prints the pages of the file in the
page cache afterwards (mincore over a fresh mapping), against the two the writes touched, and
the same for a mapping without the advice, for comparison.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import struct
import sys
import tempfile
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from tidemq.store.queues.consume_queue import UNIT_SIZE, ConsumeQueue, FrontierTable, file_name, map_queue_file  # noqa: E402

PAGE = 10  # the untouched page the second write lands on


def resident_pages(path: Path) -> list[int]:
    """The pages of the file at `path` in the page cache (mincore over a fresh mapping)."""
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    pages = (len(mm) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    view = ctypes.c_char.from_buffer(mm)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    result = libc.mincore(ctypes.addressof(view), len(mm), vector)
    del view
    mm.close()
    if result != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return [page for page in range(pages) if vector[page] & 1]


def made_by_a_worker(root: Path, topic: str, units: int) -> Path:
    path = root / topic / "0" / file_name(0)
    made = map_queue_file(str(path), units * UNIT_SIZE)
    made[:UNIT_SIZE] = struct.pack(">qiq", 0, 100, 0)
    made.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=None, help="where to make the files (default: a temporary directory)")
    parser.add_argument("--units", type=int, default=20_000, help="units per queue file")
    args = parser.parse_args()
    slot = PAGE * mmap.PAGESIZE // UNIT_SIZE + 3
    unit = struct.pack(">qiq", 100, 100, 0)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = Path(scratch)
        path = made_by_a_worker(root, "adopted", args.units)
        queue = ConsumeQueue.adopted_many(root, args.units, FrontierTable(), [("adopted", 0)], [0], [1])[0]
        queue.mapping_of(0)[slot * UNIT_SIZE : (slot + 1) * UNIT_SIZE] = unit
        adopted = resident_pages(path)
        queue.close()
        plain_path = made_by_a_worker(root, "plain", args.units)
        fd = os.open(plain_path, os.O_RDWR)
        try:
            plain = mmap.mmap(fd, args.units * UNIT_SIZE)
        finally:
            os.close(fd)
        plain[slot * UNIT_SIZE : (slot + 1) * UNIT_SIZE] = unit
        plain.close()
        default = resident_pages(plain_path)
    pages = (args.units * UNIT_SIZE + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    print(f"queue file of {args.units} units ({pages} pages); writes touched pages 0 and {PAGE}")
    print(f"  adopted queue (random-access advice): {len(adopted)} pages resident {adopted[:12]}")
    print(f"  plain mapping (default advice):       {len(default)} pages resident")
    print(f"  pages read beyond the two written: {len(set(adopted) - {0, PAGE})} (random) / {len(set(default) - {0, PAGE})} (default)")


if __name__ == "__main__":
    main()
