"""Filling a small file system, as another process fills a shared disk."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def fill(directory: Path, leave: int) -> Path:
    """A file that takes the file system's free space but `leave` bytes (0: until ENOSPC)."""
    filler = directory / f"filler-{uuid.uuid4().hex[:6]}"
    stats = os.statvfs(directory)
    size = max(0, stats.f_bavail * stats.f_frsize - leave)
    try:
        with open(filler, "wb") as f:
            for _ in range(size >> 16):
                f.write(bytes(1 << 16))
            if not leave:
                while True:
                    f.write(bytes(4096))
                    f.flush()
    except OSError:  # ENOSPC: full (even before the file could be made)
        pass
    return filler
