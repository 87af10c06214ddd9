"""Topics and consumer groups: their configs, created on first use or by the admin, persisted as
JSON under `{store}/config/` (`topics.json`, `subscriptionGroups.json`, like RocketMQ's
`topics.json` and `subscriptionGroup.json`).  Written atomically (temp file + rename)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .config import DEFAULT_RETRY_BACKOFF_MS

TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "PRIORITY", "LITE")
DLQ_PREFIX = "%DLQ%"
RETRY_PREFIX = "%RETRY%"
DEFAULT_RETRY_MAX_TIMES = 16  # retryMaxTimes: 16 retries, 17 deliveries


@dataclass
class TopicConfig:
    name: str
    queue_nums: int = 8  # readQueueNums == writeQueueNums
    message_type: str = "NORMAL"  # the topic attribute message.type
    perm: int = 6  # read | write, as RocketMQ's PermName


@dataclass
class GroupConfig:
    name: str
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    retry_backoff_ms: list[int] = field(default_factory=lambda: list(DEFAULT_RETRY_BACKOFF_MS))

    @property
    def max_delivery_attempts(self) -> int:
        return self.retry_max_times + 1


def dead_letter_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


class Metadata:
    """The broker's topic and group tables.  Mutated on the broker's event loop or by an offline
    admin command; `_lock` only guards the file writes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self.topics: dict[str, TopicConfig] = {
            name: TopicConfig(**cfg) for name, cfg in self._load("topics.json").items()
        }
        self.groups: dict[str, GroupConfig] = {
            name: GroupConfig(**cfg) for name, cfg in self._load("subscriptionGroups.json").items()
        }

    def _load(self, name: str) -> dict:
        path = self.directory / name
        if not path.exists():
            return {}
        return json.loads(path.read_text())

    def _save(self, name: str, table: dict) -> None:
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / name
            tmp = path.with_suffix(".tmp")
            data = json.dumps({k: asdict(v) for k, v in sorted(table.items())}, indent=1)
            with open(tmp, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)

    def put_topic(self, topic: TopicConfig) -> TopicConfig:
        self.topics[topic.name] = topic
        self._save("topics.json", self.topics)
        return topic

    def put_group(self, group: GroupConfig) -> GroupConfig:
        self.groups[group.name] = group
        self._save("subscriptionGroups.json", self.groups)
        return group
