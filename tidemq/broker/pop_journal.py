"""The pop journal: an append-only file of in-flight table transitions, replayed on start.

`{store}/pop/journal` holds one JSON array per line:

    ["p", group, topic, [[qid, cursor], ...], [[qid, offset, commit_log_offset, attempt,
                                               invisible_until, generation, renew_owner, first_popped], ...]]
                                                    deliveries and read-cursor moves of one pop
    ["f", group, topic, qid, offset]               the entry is done (acked, dead-lettered, gone)
    ["F", group, topic, [[qid, offset], ...]]      several entries done (a batch ack)
    ["i", group, topic, qid, offset, invisible_until, generation, renew_owner]   new deadline

Each line is written with one `write` call before the client hears of the transition, so a killed
process loses nothing the kernel accepted; `sync()` (periodic, and at close) makes it survive a
power loss too.  A torn last line (killed mid-write) is dropped on replay.  On open, after replay,
the journal is rewritten as a snapshot of the live table (temp file, fsync, rename), and again
whenever it grows past `compact_bytes`."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterable

from .pop_state import Delivery, Subscription

log = logging.getLogger(__name__)

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class PopJournal:
    def __init__(self, directory: Path, compact_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = directory
        self.path = directory / "journal"
        self.compact_bytes = compact_bytes
        self._fd = -1
        self._size = 0
        self._dirty = False

    # -- replay ---------------------------------------------------------------------------------

    def replay(self) -> tuple[dict[tuple[str, str], Subscription], int]:
        """Rebuild the in-flight table; returns it and the highest handle generation seen."""
        subs: dict[tuple[str, str], Subscription] = {}
        generation = 0
        if not self.path.exists():
            return subs, generation
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        for number, line in enumerate(lines):
            if not line:
                continue
            try:
                entry = json.loads(line)
                generation = max(generation, _apply(subs, entry))
            except (ValueError, IndexError, TypeError) as exc:
                if number >= len(lines) - 2:
                    log.warning("pop journal: dropped a torn last line (%d bytes): %s", len(line), exc)
                    break
                raise ValueError(f"pop journal {self.path}: line {number + 1} is corrupt: {exc}") from None
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
        line = (_dumps(entry) + "\n").encode()
        os.write(self._fd, line)
        self._size += len(line)
        self._dirty = True

    def sync(self) -> None:
        if self._fd >= 0 and self._dirty:
            self._dirty = False
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1


def delivery_fields(d: Delivery) -> list:
    return [d.queue_id, d.queue_offset, d.commit_log_offset, d.attempt, d.invisible_until,
            d.generation, d.renew_owner, d.first_popped]


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
