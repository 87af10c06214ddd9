"""Topics and consumer groups: their configs, created on first use or by the admin, persisted
under `{store}/config/` in RocketMQ's `topics.json` and `subscriptionGroup.json` (see
`config_files`: RocketMQ's schemas, unknown fields kept, tidemq's earlier files read too).
Written atomically (temp file + rename)."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .admin_fields import TOPIC_TYPES, group_entry_problem, topic_entry_problem
from .config import DEFAULT_RETRY_BACKOFF_MS
from .config_files import (
    GROUP_TABLE,
    GROUPS_FILE,
    LEGACY_GROUPS_FILE,
    TOPIC_TABLE,
    TOPICS_FILE,
    ConfigFile,
    group_from_entry,
    group_to_entry,
    topic_from_entry,
    topic_to_entry,
)

__all__ = ["TOPIC_TYPES", "GroupConfig", "Metadata", "TopicConfig", "dead_letter_topic"]
log = logging.getLogger(__name__)
DLQ_PREFIX = "%DLQ%"
RETRY_PREFIX = "%RETRY%"
DEFAULT_RETRY_MAX_TIMES = 16  # retryMaxTimes: 16 retries, 17 deliveries


@dataclass
class TopicConfig:
    name: str
    queue_nums: int = 8  # readQueueNums == writeQueueNums
    message_type: str = "NORMAL"  # the topic attribute message.type
    perm: int = 6  # read | write, as RocketMQ's PermName

    @property
    def priority_levels(self) -> int:
        """A PRIORITY topic's number of priority levels, 0 for other topics: one queue per level,
        so the queue count is the level count (RocketMQ keeps no other)."""
        return self.queue_nums if self.message_type == "PRIORITY" else 0


@dataclass
class GroupConfig:
    name: str
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    retry_backoff_ms: list[int] = field(default_factory=lambda: list(DEFAULT_RETRY_BACKOFF_MS))
    fifo: bool = False  # consumeMessageOrderly: each message group is delivered in order
    lite_bind_topic: str = ""  # liteBindTopic: a lite group consumes lite topics of this topic only

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
        self._topic_file = ConfigFile(directory / TOPICS_FILE, TOPIC_TABLE)
        self._group_file = ConfigFile(directory / GROUPS_FILE, GROUP_TABLE, directory / LEGACY_GROUPS_FILE)
        self.topics: dict[str, TopicConfig] = {
            name: topic for name, topic in _usable(self._topic_file, topic_from_entry, TopicConfig, topic_entry_problem)
        }
        self.groups: dict[str, GroupConfig] = {
            name: group for name, group in _usable(self._group_file, group_from_entry, GroupConfig, group_entry_problem)
        }
        if self._topic_file.legacy:  # rewritten in RocketMQ's schema from now on
            self._topic_file.table.update({name: topic_to_entry(t, None) for name, t in self.topics.items()})
        if self._group_file.legacy:
            self._group_file.table.update({name: group_to_entry(g, None) for name, g in self.groups.items()})

    def put_topic(self, topic: TopicConfig) -> TopicConfig:
        self.topics[topic.name] = topic
        with self._lock:
            table = self._topic_file.table
            table[topic.name] = topic_to_entry(topic, table.get(topic.name))
            self._topic_file.save()
        return topic

    def put_group(self, group: GroupConfig) -> GroupConfig:
        self.groups[group.name] = group
        with self._lock:
            table = self._group_file.table
            table[group.name] = group_to_entry(group, table.get(group.name))
            self._group_file.save()
        return group


def _usable(config_file, from_entry, cls, problem):
    """The (name, config) pairs of a config file's usable entries; an entry that does not convert
    or that `problem` refuses is left out and logged, so one bad entry never breaks the others."""
    for name, entry in config_file.table.items():
        try:
            config = from_entry(cls, name, entry, config_file.legacy)
            why = problem(name, asdict(config))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            why = f"unreadable ({exc})"
        if why is None:
            yield name, config
        else:
            log.error("config file %s: entry %r left out: %s", config_file.path, name, why)
