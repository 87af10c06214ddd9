"""The lite subscription table: per client id the lite topics it subscribed, an index from each
lite topic's light queue to its subscribers, the clients' expiry deadlines, and the log that
keeps the table across a restart.

RocketMQ 5.5.0 keeps this table in memory only (its clients re-send their whole set every 30 s);
tidemq also logs it, so a restarted broker serves a returning client its set at once.

The log (`config/liteSubscription.log`) holds one JSON line per change: a client's additions and
removals, or its removal whole.  A change costs a line in proportion to the names it changes;
when the log holds more than twice the lines the live table needs (and at least
`_COMPACT_MIN_LINES`), it is rewritten from the table (temp file, fsync, rename), so its size
stays in proportion to the table.  Lines are written at once and made durable by `sync` (the
broker's maintenance round, and close): a process kill loses nothing; a machine crash loses at
most the changes since the last sync, which the clients' periodic complete sets restore.  A lost
line never loses a message: messages stay in their light queues until consumed."""

from __future__ import annotations

import errno
import heapq
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .append_file import AppendFile
from .config_files import read_json

log = logging.getLogger(__name__)

LOG_FILE = "liteSubscription.log"
OLD_FILE = "liteSubscription.json"  # the whole-table file of earlier versions, read once
_COMPACT_MIN_LINES = 10_000


@dataclass(slots=True)
class ClientLite:
    group: str
    bind_topic: str
    topics: set[str] = field(default_factory=set)
    version: int = -1
    seen: int = 0  # ms: the last sync, or when the broker read the set from its log


class LiteSubscriptions(AppendFile):
    """Per client id its lite topics; `by_queue` maps each subscribed light queue name to its
    subscribers' client ids (kept with the sets, so an arrival finds its subscribers without a
    walk); `active` counts (client, lite topic) pairs."""

    def __init__(self, directory: Path, now: int) -> None:
        self.directory = directory
        self.path = directory / LOG_FILE
        self.clients: dict[str, ClientLite] = {}
        self.by_queue: dict[str, set[str]] = {}
        self.active = 0
        self._due: list[tuple[int, str]] = []  # (deadline to look at the client again, client id)
        self._watched: set[str] = set()  # the client ids in _due
        self._fd = -1
        self._size = 0
        self._lines = 0
        self._dirty = False
        migrated = self._read_old(directory / OLD_FILE, now)
        if not migrated:
            self._replay(now)
        if migrated or self._lines > max(2 * len(self.clients), _COMPACT_MIN_LINES):
            self._rewrite()
            (directory / OLD_FILE).unlink(missing_ok=True)

    # -- reading ------------------------------------------------------------------------------

    def _read_old(self, path: Path, now: int) -> bool:
        document = read_json(path)
        if document is None:
            return False
        for client_id, entry in (document.get("subscriptions") or {}).items():
            try:
                topics = {str(t) for t in entry["liteTopicSet"]}
                client = ClientLite(str(entry["group"]), str(entry["topic"]), set(), int(entry.get("version", -1)), now)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("%s: the lite subscriptions of client %r left out: unreadable (%s)", path, client_id, exc)
                continue
            self._set(str(client_id), client, topics)
        return True

    def _replay(self, now: int) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            lines = f.read().split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            self._lines += 1
            try:
                entry = json.loads(line)
                client_id = str(entry["c"])
                if entry.get("x"):
                    self._set(client_id, None, set())
                    continue
                client = self.clients.get(client_id)
                if client is None or client.group != entry["g"] or client.bind_topic != entry["t"]:
                    client = ClientLite(str(entry["g"]), str(entry["t"]))
                topics = (set(client.topics) | {str(t) for t in entry.get("+", ())}) - set(entry.get("-", ()))
                client.version, client.seen = int(entry.get("v", client.version)), now
                self._set(client_id, client, topics)
            except (ValueError, KeyError, TypeError) as exc:
                torn = number == len(lines)  # the last line, without its newline: a write cut short
                log.log(logging.WARNING if torn else logging.ERROR, "%s: line %d left out (%s)", self.path, number, exc)

    # -- changing -----------------------------------------------------------------------------

    def update(self, client_id: str, client: ClientLite, topics: set[str]) -> None:
        """Make `topics` the client's set (empty: the client goes) and log the change; a
        `client` other than the one held (another group or bind topic) replaces it."""
        old = self.clients.get(client_id)
        replaced = old is not None and old is not client
        before = set() if old is None or replaced else set(old.topics)
        self._set(client_id, client if topics else None, topics)
        if not topics:
            if old is not None:
                self._write({"c": client_id, "x": 1})
            return
        if replaced:
            self._write({"c": client_id, "x": 1})
        added, removed = topics - before, before - topics
        if added or removed:
            entry: dict = {"c": client_id, "g": client.group, "t": client.bind_topic, "v": client.version}
            if added:
                entry["+"] = sorted(added)
            if removed:
                entry["-"] = sorted(removed)
            self._write(entry)

    def _set(self, client_id: str, client: ClientLite | None, topics: set[str]) -> None:
        """Index maintenance: the client's set becomes `topics` (None: the client goes)."""
        old = self.clients.pop(client_id, None)
        if old is not None:
            for name in old.topics:
                self._unindex(old.bind_topic, name, client_id)
            self.active -= len(old.topics)
        if client is None or not topics:
            return
        client.topics = set(topics)
        self.clients[client_id] = client
        self.active += len(topics)
        for name in topics:
            self.by_queue.setdefault(queue_name(client.bind_topic, name), set()).add(client_id)

    def _unindex(self, bind_topic: str, name: str, client_id: str) -> None:
        queue = queue_name(bind_topic, name)
        subscribers = self.by_queue.get(queue)
        if subscribers is not None:
            subscribers.discard(client_id)
            if not subscribers:
                del self.by_queue[queue]

    def discard(self, client_id: str, lite_topic: str) -> None:
        """Take one lite topic out of the client's set (the client goes with its last)."""
        client = self.clients.get(client_id)
        if client is None or lite_topic not in client.topics:
            return
        if len(client.topics) == 1:
            self.remove(client_id)
            return
        client.topics.discard(lite_topic)
        self._unindex(client.bind_topic, lite_topic, client_id)
        self.active -= 1
        self._write({"c": client_id, "g": client.group, "t": client.bind_topic, "v": client.version, "-": [lite_topic]})

    def remove(self, client_id: str) -> bool:
        if client_id not in self.clients:
            return False
        self.update(client_id, self.clients[client_id], set())
        return True

    # -- expiry -------------------------------------------------------------------------------

    def watch(self, client_id: str, due: int) -> None:
        """Look at the client at `due`, unless a look is pending already (then that look, finding
        the client seen since, sets the next): one entry per client at most."""
        if client_id not in self._watched:
            self._watched.add(client_id)
            heapq.heappush(self._due, (due, client_id))

    def due(self, now: int) -> list[str]:
        """The clients whose look is due at `now` (in deadline order); their looks are done."""
        out = []
        while self._due and self._due[0][0] <= now:
            _, client_id = heapq.heappop(self._due)
            self._watched.discard(client_id)
            if client_id in self.clients:
                out.append(client_id)
        return out

    # -- the log ------------------------------------------------------------------------------

    def _write(self, entry: dict) -> None:
        """Append one line, whole or not at all.  A refused write is logged and the change kept
        in memory only (the client's next complete set restores it after a restart)."""
        line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        try:
            if self._fd < 0:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._size = os.fstat(self._fd).st_size
            written = os.write(self._fd, line)
            if written != len(line):
                os.ftruncate(self._fd, self._size)
                raise OSError(errno.ENOSPC, f"{written} of {len(line)} bytes written")
        except OSError as exc:
            log.warning("%s: a lite subscription change not logged: %s", self.path, exc)
            return
        self._size += len(line)
        self._lines += 1
        self._dirty = True
        if self._lines > max(2 * len(self.clients), _COMPACT_MIN_LINES):
            try:
                self._rewrite()
            except OSError as exc:
                log.warning("%s: not compacted: %s", self.path, exc)

    def _rewrite(self) -> None:
        """Replace the log by one line per client (temp file, fsync, rename)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            for client_id, c in self.clients.items():
                entry = {"c": client_id, "g": c.group, "t": c.bind_topic, "v": c.version, "+": sorted(c.topics)}
                f.write((json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size
        self._lines, self._dirty = len(self.clients), False

    # -- queries ------------------------------------------------------------------------------

    def subscribers(self, group: str | None, bind_topic: str) -> dict[str, int]:
        """Per lite topic of `bind_topic`, how many clients (of `group`, or of any) subscribe it."""
        counts: dict[str, int] = {}
        for c in self.clients.values():
            if c.bind_topic == bind_topic and (group is None or c.group == group):
                for topic in c.topics:
                    counts[topic] = counts.get(topic, 0) + 1
        return counts


def queue_name(bind_topic: str, lite_topic: str) -> str:
    """`%LMQ%$B$L`: the light queue of lite topic L of bind topic B (RocketMQ's LiteUtil)."""
    return f"%LMQ%${bind_topic}${lite_topic}"
