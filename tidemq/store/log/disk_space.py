"""DiskSpaceGuard: appends stop before the store's disk is full, as RocketMQ's do.

RocketMQ refuses puts (SERVICE_NOT_AVAILABLE, "the broker's disk is full") once the commit log's
disk is more than `diskSpaceWarningLevelRatio` percent used (default 90), and takes them again
when it is below.  The space left is what dispatch needs to index the records already appended
(consume-queue units, key-index entries and slots) and the pop journal to record deliveries and
acks: reads go on while appends are refused.  Appends also fail on their own ENOSPC (the commit
log allocates its blocks before writing them), with nothing stored.

The guard is checked once per maintenance round (`check`) and read by every append (`full`, a
plain attribute).  `usage(path)` is `shutil.disk_usage` unless another is given (tests).
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..errors import StoreIOError

log = logging.getLogger(__name__)

DEFAULT_WARNING_LEVEL_RATIO = 90  # percent: RocketMQ's diskSpaceWarningLevelRatio


# a store is not opened on a disk with less than this free (or 1% of a smaller disk): opening
# writes (the lock and abort markers, units recovery rebuilds, the checkpoint), and on tmpfs even
# a read of a page of a mapped file never written takes a page of the disk
MIN_FREE_TO_OPEN = 1 << 20


def refuse_to_open_if_full(directory: Path, usage: Callable[[Path], tuple[int, int, int]] = shutil.disk_usage) -> None:
    """Raise StoreIOError (ENOSPC), saying which directory and how full its disk is, if that disk
    has less than MIN_FREE_TO_OPEN bytes (or 1% of it) free; nothing in the store is changed."""
    try:
        total, _, free = usage(directory)
    except OSError:
        return  # opening says what is wrong
    if free < min(MIN_FREE_TO_OPEN, total // 100):
        used = 100.0 * (total - free) / total if total > 0 else 100.0
        raise StoreIOError(errno.ENOSPC, f"{used:.1f}% used, {free} bytes free", str(directory))


class Usage(NamedTuple):
    total: int
    used: int
    free: int


class DiskSpaceGuard:
    def __init__(
        self,
        path: Path,
        warning_level_ratio: int = DEFAULT_WARNING_LEVEL_RATIO,
        usage: Callable[[Path], tuple[int, int, int]] = shutil.disk_usage,
    ) -> None:
        if not 1 <= warning_level_ratio <= 100:
            raise ValueError(
                f"disk space warning level ratio must be within 1-100 (percent), not {warning_level_ratio}"
            )
        self.path = path
        self.warning_level_ratio = warning_level_ratio
        self.usage = usage
        self.full = False
        self.used_percent = 0.0
        self.checkpoint_refused = False  # the last maintenance round could not save the checkpoint
        self.check()

    def check(self) -> bool:
        """Look at the disk again; returns whether appends are refused."""
        try:
            total, _, free = self.usage(self.path)
        except OSError as exc:
            log.warning("cannot read the free space of %s: %s", self.path, exc)
            return self.full
        self.used_percent = 100.0 * (total - free) / total if total > 0 else 0.0
        full = self.used_percent > self.warning_level_ratio
        if full and not self.full:
            log.error(
                "the disk of %s is %.1f%% used, over diskSpaceWarningLevelRatio (%d%%): appends are refused "
                "until space is freed",
                self.path,
                self.used_percent,
                self.warning_level_ratio,
            )
        elif self.full and not full:
            log.warning("the disk of %s is %.1f%% used again: appends are taken", self.path, self.used_percent)
        self.full = full
        return full

    def refusal(self) -> StoreIOError:
        """What an append raises while the disk is full (nothing stored)."""
        return StoreIOError(
            errno.ENOSPC,
            f"append refused, nothing stored: the store's disk is {self.used_percent:.1f}% "
            f"used, over diskSpaceWarningLevelRatio ({self.warning_level_ratio}%)",
        )
