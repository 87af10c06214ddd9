"""An append-only file's descriptor: lines are written at once and made durable by `sync`."""

from __future__ import annotations

import os


class AppendFile:
    """Holds `_fd` (-1: not open) and `_dirty` (written since the last fsync)."""

    _fd: int = -1
    _dirty: bool = False

    def sync(self) -> None:
        """fsync what was written since the last sync."""
        if self._fd >= 0 and self._dirty:
            self._dirty = False
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1
