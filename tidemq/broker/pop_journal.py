"""The pop journal: an append-only file of in-flight table transitions, replayed on start.

`{store}/pop/journal` holds one JSON array per line:

    ["p", group, topic, [[qid, cursor], ...], [[qid, offset, commit_log_offset, attempt,
                                               invisible_until, generation, renew_owner, first_popped], ...]]
                                                    deliveries and read-cursor moves of one pop
    ["f", group, topic, qid, offset]               the entry is done (acked, dead-lettered, gone)
    ["F", group, topic, [[qid, offset], ...]]      several entries done (a batch ack)
    ["i", group, topic, qid, offset, invisible_until, generation, renew_owner]   new deadline
    ["x", group, topic]                            the subscription is forgotten (its light queue expired)

Each line is written with one `write` call before the client hears of the transition, so a killed
process loses nothing the kernel accepted.  A write the disk refuses in part or whole (full,
read-only) is cut back off (`ftruncate` to the last whole line) and raises JournalWriteError: the
journal always ends with a whole line, and the caller undoes the transition and fails the call; `sync()` (periodic, and at close) makes it survive a
power loss too.  A torn last line (killed mid-write) is dropped on replay.  On open, after replay,
the journal is rewritten as a snapshot of the live table (temp file, fsync, rename), and again
whenever it grows past `compact_bytes`."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .append_file import AppendFile
from .pop_state import Delivery, Subscription

log = logging.getLogger(__name__)


class JournalWriteError(OSError):
    """The disk refused a journal line: nothing of it is in the journal."""


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class PopJournal(AppendFile):
    def __init__(self, directory: Path, compact_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = directory
        self.path = directory / "journal"
        self.compact_bytes = compact_bytes
        self._fd = -1
        self._size = 0  # bytes of whole lines
        self._dirty = False
        self._torn = False  # bytes past _size that a refused write left (cut before the next line)
        self.write = os.write  # the writer (tests inject a disk that is full)
        # called with (group, topic) after each line written: that subscription's progress changed
        self.listener: Callable[[str, str], None] | None = None

    # -- replay ---------------------------------------------------------------------------------

    def replay(self) -> tuple[dict[tuple[str, str], Subscription], int]:
        """Rebuild the in-flight table; returns it and the highest handle generation seen.
        Raises ValueError naming the first damaged line that is not the last (`tidemq store
        repair` drops such lines)."""
        subs, generation, damaged = replay_lines(self.path)
        for number, _, reason, last in damaged:
            if not last:
                raise ValueError(
                    f"pop journal {self.path}: line {number} is corrupt: {reason}; "
                    f"'tidemq store repair' drops the damaged lines (redeliveries, never losses)"
                )
            log.warning("pop journal: dropped a torn last line (line %d): %s", number, reason)
        return subs, generation

    # -- writing --------------------------------------------------------------------------------

    def open(self, subs: Iterable[Subscription]) -> None:
        """Start a fresh journal holding a snapshot of `subs`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._rewrite(subs)

    def _rewrite(self, subs: Iterable[Subscription]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for sub in subs:
                f.write(snapshot_line(sub))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size

    def needs_compaction(self) -> bool:
        return self._size > self.compact_bytes

    def compact(self, subs: Iterable[Subscription]) -> None:
        self._rewrite(subs)

    def append(self, entry: list) -> None:
        """Write one line, whole, or raise JournalWriteError with the journal as it was."""
        line = (_dumps(entry) + "\n").encode()
        try:
            if self._torn:  # a refused write left part of a line: cut it first
                os.ftruncate(self._fd, self._size)
                self._torn = False
            written = self.write(self._fd, line)
        except OSError as exc:
            self._torn = True  # whatever the refused call left is cut before the next line
            raise JournalWriteError(exc.errno, f"{exc.strerror or exc} (pop journal {self.path})") from None
        if written != len(line):  # the disk took part of the line (full): take it back
            self._torn = True
            try:
                os.ftruncate(self._fd, self._size)
                self._torn = False
            except OSError:
                pass  # cut before the next line is written
            raise JournalWriteError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)} (pop journal {self.path}: {written} of {len(line)} bytes written)",
            )
        self._size += len(line)
        self._dirty = True
        if self.listener is not None:
            self.listener(entry[1], entry[2])


def replay_lines(path: Path) -> tuple[dict[tuple[str, str], Subscription], int, list[tuple[int, bytes, str, bool]]]:
    """The table the journal at `path` holds, the highest generation, and its damaged lines
    (number, bytes, reason, whether it is the last): a line that does not parse or apply is
    skipped.  Dropping a line can only bring deliveries back, never lose one."""
    subs: dict[tuple[str, str], Subscription] = {}
    generation = 0
    damaged: list[tuple[int, bytes, str, bool]] = []
    if not path.exists():
        return subs, generation, damaged
    lines = path.read_bytes().split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            entry = json.loads(line)
            generation = max(generation, _apply(subs, entry))
        except (ValueError, IndexError, TypeError, KeyError, AttributeError) as exc:
            damaged.append((number, line, str(exc), number >= len(lines) - 1))
    return subs, generation, damaged


def check_journal(directory: Path) -> list[str]:
    """Problems of the pop journal in `directory`: its damaged lines (a torn last line is not
    one: replay drops it)."""
    path = Path(directory) / "journal"
    return [
        f"pop journal {path}: line {number} is damaged ({reason})"
        for number, _, reason, last in replay_lines(path)[2]
        if not last
    ]


def repair_journal(directory: Path, keep_dir: Path) -> str | None:
    """Drop the damaged lines of the pop journal in `directory` (kept under `keep_dir`), so the
    broker starts; returns what was done, or None if nothing needed doing."""
    path = Path(directory) / "journal"
    _, _, damaged = replay_lines(path)
    if not damaged:
        return None
    keep_dir.mkdir(parents=True, exist_ok=True)
    kept = keep_dir / f"pop-journal-damaged-lines-{os.getpid()}-{int(os.path.getmtime(path))}"
    kept.write_bytes(b"".join(b"%d: %s\n" % (number, line) for number, line, _, _ in damaged))
    skip = {number for number, _, _, _ in damaged}
    lines = path.read_bytes().split(b"\n")
    good = b"".join(line + b"\n" for number, line in enumerate(lines, 1) if line and number not in skip)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(good)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return (
        f"pop journal: dropped {len(damaged)} damaged line(s) (kept in {kept}); the deliveries they "
        "recorded come back (redeliveries, never losses)"
    )


def delivery_fields(d: Delivery) -> list:
    return [
        d.queue_id,
        d.queue_offset,
        d.commit_log_offset,
        d.attempt,
        d.invisible_until,
        d.generation,
        d.renew_owner,
        d.first_popped,
    ]


def snapshot_line(sub: Subscription) -> bytes:
    cursors = [[qid, q.cursor] for qid, q in sorted(sub.queues.items())]
    deliveries = [delivery_fields(d) for q in sub.queues.values() for d in q.in_flight.values()]
    return (_dumps(["p", sub.group, sub.topic, cursors, deliveries]) + "\n").encode()


def _subscription(subs: dict[tuple[str, str], Subscription], group: str, topic: str) -> Subscription:
    sub = subs.get((group, topic))
    if sub is None:
        sub = subs[(group, topic)] = Subscription(group, topic)
    return sub


def _apply(subs: dict[tuple[str, str], Subscription], entry: list) -> int:
    kind, group, topic = entry[0], entry[1], entry[2]
    if kind == "x":  # the subscription is forgotten (its light queue expired)
        subs.pop((group, topic), None)
        return 0
    sub = _subscription(subs, group, topic)
    if kind == "p":
        generation = 0
        for qid, cursor in entry[3]:
            sub.advance(qid, cursor)
        for qid, offset, clo, attempt, until, gen, owner, first in entry[4]:
            sub.deliver(Delivery(qid, offset, clo, attempt, until, gen, owner, first))
            generation = max(generation, gen)
        return generation
    if kind == "f":
        sub.finish(entry[3], entry[4])
        return 0
    if kind == "F":
        for qid, offset in entry[3]:
            sub.finish(qid, offset)
        return 0
    if kind == "i":
        sub.set_invisible(entry[3], entry[4], entry[5], entry[6], entry[7])
        return entry[6]
    raise ValueError(f"unknown journal entry kind {kind!r}")
