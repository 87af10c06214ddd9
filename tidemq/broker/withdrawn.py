"""Records whose send was reported failed after they were appended: the broker never delivers them.

Under sync flush a send appends first and then waits for the fsync that covers its bytes.  When
that wait fails (the disk does not flush in time, the store closes, the call is cancelled) the
client hears of a failure and retries; the record is in the log all the same and would become
visible once a later fsync covers it, a duplicate of the retry.  So before the failure is told,
the record's commit-log offset is added here, and pops skip it as they skip a filtered-out entry.

`{store}/pop/withdrawn` holds one commit-log offset per line, in decimal, appended and fsynced
before the client hears of the failure.  A torn last line (killed mid-write) is ignored: its send
was never answered.  Owned by the broker's event loop."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class Withdrawn:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "withdrawn"
        self.offsets: set[int] = set()
        try:
            lines = self.path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return
        for line in lines[:-1]:  # the part after the last newline is empty or torn
            if line.strip().isdigit():
                self.offsets.add(int(line))

    def __contains__(self, commit_log_offset: int) -> bool:
        return commit_log_offset in self.offsets

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def add(self, commit_log_offsets: list[int]) -> None:
        """Withdraw these records for good; durable on return, unless the disk refuses (then the
        records are still never delivered by this process, and the error is logged)."""
        self.offsets.update(commit_log_offsets)
        data = b"".join(b"%d\n" % offset for offset in commit_log_offsets)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(f"short write: {written} of {len(data)} bytes")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error(
                "could not record withdrawn records at commit-log offsets %s in %s: %s; after a "
                "restart they may be delivered although their sends were reported failed",
                commit_log_offsets,
                self.path,
                exc,
            )
