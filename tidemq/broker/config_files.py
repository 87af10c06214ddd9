"""The broker's config files in Apache RocketMQ 5.5.0's schemas (`{store}/config/`), so a store
moves between the two brokers with its topics, groups and consumed offsets.

    topics.json             {"dataVersion": {...}, "topicConfigTable": {name: {"topicName",
                            "readQueueNums", "writeQueueNums", "perm", "topicFilterType",
                            "topicSysFlag", "order", "attributes": {"message.type": ...}}}}
    subscriptionGroup.json  {"dataVersion", "forbiddenTable", "subscriptionGroupTable": {name:
                            {"groupName", "consumeEnable", ..., "retryMaxTimes",
                            "groupRetryPolicy": {"type": "CUSTOMIZED", "customizedRetryPolicy":
                            {"next": [ms, ...]}}, ...}}}
    consumerOffset.json     {"dataVersion", "offsetTable": {"topic@group": {"queueId": offset}}}
    lmqConsumerOffset.json  the same, kept instead by a broker with enableLmq (both are read and
                            written: which one RocketMQ reads is its configuration)

`dataVersion` is `{"counter", "stateVersion", "timestamp"}`, its counter bumped on each write.
Each file is rewritten whole (temp file, fsync, rename) after copying the previous one to
`{name}.bak`, as RocketMQ keeps one.  Every field tidemq does not know, in an entry or at the top
level, is kept as it was read.

tidemq's dataclasses map onto RocketMQ's entries by tables (`TOPIC_KEYS`, `GROUP_KEYS`); a
dataclass field without a RocketMQ key is kept among the entry's `attributes` under its own name
(JSON-encoded), so new settings persist without a schema change.  Files in tidemq's earlier
schema (a plain `{name: {dataclass fields}}`; groups in `subscriptionGroups.json`) are read too,
and written in RocketMQ's on the next change.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

TOPICS_FILE = "topics.json"
GROUPS_FILE = "subscriptionGroup.json"
LEGACY_GROUPS_FILE = "subscriptionGroups.json"  # tidemq's earlier name
OFFSETS_FILE = "consumerOffset.json"
LMQ_OFFSETS_FILE = "lmqConsumerOffset.json"  # where a broker with enableLmq keeps every offset
TOPIC_TABLE = "topicConfigTable"
GROUP_TABLE = "subscriptionGroupTable"
OFFSET_TABLE = "offsetTable"
OFFSET_KEY_SEPARATOR = "@"

MESSAGE_TYPE_ATTRIBUTE = "message.type"
# dataclass field -> RocketMQ key (queue_nums sets both read and write queue numbers)
TOPIC_KEYS = {"name": "topicName", "perm": "perm"}
TOPIC_ATTRIBUTE_KEYS = {"message_type": MESSAGE_TYPE_ATTRIBUTE}
GROUP_KEYS = {
    "name": "groupName",
    "retry_max_times": "retryMaxTimes",
    "fifo": "consumeMessageOrderly",
    "lite_bind_topic": "liteBindTopic",
}

# what RocketMQ 5.5.0 writes for a new entry, before tidemq's settings
TOPIC_DEFAULTS = {"topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
GROUP_DEFAULTS: dict[str, Any] = {
    "consumeEnable": True,
    "consumeFromMinEnable": True,
    "consumeBroadcastEnable": True,
    "consumeMessageOrderly": False,
    "retryQueueNums": 1,
    "retryMaxTimes": 16,
    "brokerId": 0,
    "whichBrokerWhenConsumeSlowly": 1,
    "notifyConsumerIdsChangedEnable": True,
    "groupSysFlag": 0,
    "consumeTimeoutMinute": 15,
    "subscriptionDataSet": None,
    "attributes": {},
}


# fastjson writes a map's integer keys bare ({0:250,1:250}), which JSON does not allow
_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    text = path.read_text()
    if not text.strip():
        return {}
    try:
        document = json.loads(text)
    except ValueError:
        try:
            document = json.loads(_BARE_KEY.sub(r'\1"\2"\3', text))
        except ValueError as exc:
            raise ValueError(f"config file {path} is not valid JSON: {exc}; fix or remove it") from None
    if type(document) is not dict:
        raise ValueError(f"config file {path} must hold a JSON object, not {type(document).__name__}; fix or remove it")
    return document


def write_json(path: Path, document: dict) -> None:
    """Replace `path` with `document`, keeping the previous file as `{name}.bak`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        shutil.copyfile(path, path.with_name(path.name + ".bak"))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(document, indent=1, ensure_ascii=False))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def bump_data_version(document: dict) -> None:
    version = document.get("dataVersion")
    if not isinstance(version, dict):
        version = {"counter": 0, "stateVersion": 0}
    version["counter"] = int(version.get("counter", 0)) + 1
    version.setdefault("stateVersion", 0)
    version["timestamp"] = time.time_ns() // 1_000_000
    document["dataVersion"] = version


class ConfigFile:
    """One of RocketMQ's table files: the whole document as read, its table of raw entries."""

    def __init__(self, path: Path, table_key: str, legacy_path: Path | None = None) -> None:
        self.path = path
        self.table_key = table_key
        document = read_json(path)
        self.legacy = False
        if document is None and legacy_path is not None:
            document = read_json(legacy_path)
        if document is None:
            document = {}
        elif table_key not in document and all(isinstance(v, dict) for v in document.values()) and document:
            document = {table_key: document}  # tidemq's earlier schema: the table alone
            self.legacy = True
        self.document = document
        table = document.get(table_key)
        self.table: dict[str, dict] = table if isinstance(table, dict) else {}
        document[table_key] = self.table

    def save(self) -> None:
        bump_data_version(self.document)
        write_json(self.path, self.document)


# -- dataclass <-> entry ------------------------------------------------------------------------


def _field_names(cls) -> list[str]:
    return [f.name for f in fields(cls)]


_MISSING = object()


def _from_entry(cls, name: str, entry: dict, legacy: bool, keys: dict[str, str], special):
    """A `cls` from a table entry: each field from its RocketMQ key (`keys`), from `special(field,
    entry, attributes)` (or _MISSING), else from the attribute of its own name; the dataclass
    default where none is there.  An entry of tidemq's earlier schema holds the fields as such."""
    names = _field_names(cls)
    if legacy:
        return cls(**{k: v for k, v in entry.items() if k in names})
    values: dict[str, Any] = {"name": entry.get(keys["name"], name)}
    attributes = entry.get("attributes") or {}
    for field_name in names:
        if field_name == "name":
            continue
        if field_name in keys:
            value = entry.get(keys[field_name], _MISSING)
        else:
            value = special(field_name, entry, attributes)
            if value is _MISSING and field_name in attributes:
                value = _attribute_value(attributes[field_name])
        if value is not _MISSING:
            values[field_name] = value
    return cls(**values)


def _to_entry(obj, entry: dict | None, defaults: dict, keys: dict[str, str], special) -> dict:
    """`entry` (as read, or None for RocketMQ's defaults) updated with `obj`'s fields: each to its
    RocketMQ key, or by `special(field, value, entry, attributes)` (True if it took it), else as
    the attribute of its own name (JSON)."""
    out = dict(defaults) if entry is None else dict(entry)
    attributes = dict(out.get("attributes") or {})
    for field_name in _field_names(type(obj)):
        value = getattr(obj, field_name)
        if field_name in keys:
            out[keys[field_name]] = value
        elif not special(field_name, value, out, attributes):
            attributes[field_name] = json.dumps(value)
    out["attributes"] = attributes
    return out


def _attribute_value(text):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _read_topic_field(field_name: str, entry: dict, attributes: dict):
    if field_name == "queue_nums":
        queues = [entry[k] for k in ("readQueueNums", "writeQueueNums") if isinstance(entry.get(k), int)]
        return max(queues) if queues else _MISSING
    if field_name in TOPIC_ATTRIBUTE_KEYS:
        key = TOPIC_ATTRIBUTE_KEYS[field_name]
        return attributes.get(key, attributes.get("+" + key, _MISSING))
    return _MISSING


def _write_topic_field(field_name: str, value, out: dict, attributes: dict) -> bool:
    if field_name == "queue_nums":
        out["readQueueNums"] = out["writeQueueNums"] = value
    elif field_name in TOPIC_ATTRIBUTE_KEYS:
        key = TOPIC_ATTRIBUTE_KEYS[field_name]
        attributes.pop("+" + key, None)
        attributes[key] = value
    else:
        return False
    return True


def _read_group_field(field_name: str, entry: dict, attributes: dict):
    if field_name != "retry_backoff_ms":
        return _MISSING
    policy = entry.get("groupRetryPolicy") or {}
    steps = (policy.get("customizedRetryPolicy") or {}).get("next")
    if policy.get("type", "CUSTOMIZED") == "CUSTOMIZED" and isinstance(steps, list) and steps:
        return [int(step) for step in steps]
    return _MISSING


def _write_group_field(field_name: str, value, out: dict, attributes: dict) -> bool:
    if field_name != "retry_backoff_ms":
        return False
    policy = dict(out.get("groupRetryPolicy") or {})
    if policy.get("type", "CUSTOMIZED") == "CUSTOMIZED":  # an exponential policy stays as it is
        policy["type"] = "CUSTOMIZED"
        policy["customizedRetryPolicy"] = dict(policy.get("customizedRetryPolicy") or {}, next=list(value))
    out["groupRetryPolicy"] = policy
    return True


def topic_from_entry(cls, name: str, entry: dict, legacy: bool):
    """A TopicConfig (`cls`) from a topics.json entry (or an entry of tidemq's earlier schema)."""
    return _from_entry(cls, name, entry, legacy, TOPIC_KEYS, _read_topic_field)


def topic_to_entry(topic, entry: dict | None) -> dict:
    """`entry` (a topics.json entry as read, or None) updated with the TopicConfig's settings."""
    return _to_entry(topic, entry, TOPIC_DEFAULTS, TOPIC_KEYS, _write_topic_field)


def group_from_entry(cls, name: str, entry: dict, legacy: bool):
    """A GroupConfig (`cls`) from a subscriptionGroup.json entry (or tidemq's earlier schema)."""
    return _from_entry(cls, name, entry, legacy, GROUP_KEYS, _read_group_field)


def group_to_entry(group, entry: dict | None) -> dict:
    """`entry` (a subscriptionGroup.json entry as read, or None) updated with the GroupConfig's."""
    return _to_entry(group, entry, GROUP_DEFAULTS, GROUP_KEYS, _write_group_field)


# -- consumed offsets ------------------------------------------------------------------------------


def offset_key(topic: str, group: str) -> str:
    return f"{topic}{OFFSET_KEY_SEPARATOR}{group}"


def parse_offset_key(key: str) -> tuple[str, str] | None:
    """(topic, group) of an offsetTable key; topics may hold no '@', groups may not either."""
    topic, separator, group = key.partition(OFFSET_KEY_SEPARATOR)
    return (topic, group) if separator and topic and group else None


class ConsumerOffsets:
    """Per `topic@group`, per queue id, the next offset to consume: the offsetTable of
    `consumerOffset.json` and of `lmqConsumerOffset.json` (a RocketMQ broker with `enableLmq`
    keeps every group's offsets there, and reads only that file).  Both are read, the larger
    offset winning, and both written."""

    def __init__(self, directory: Path) -> None:
        self.files = [ConfigFile(directory / name, OFFSET_TABLE) for name in (OFFSETS_FILE, LMQ_OFFSETS_FILE)]

    def offsets(self) -> dict[tuple[str, str], dict[int, int]]:
        """(group, topic) -> {queue id: offset}."""
        out: dict[tuple[str, str], dict[int, int]] = {}
        for config_file in self.files:
            for key, queues in self._offsets_in(config_file).items():
                merged = out.setdefault(key, {})
                for qid, offset in queues.items():
                    merged[qid] = max(offset, merged.get(qid, offset))
        return out

    @staticmethod
    def _offsets_in(config_file: ConfigFile) -> dict[tuple[str, str], dict[int, int]]:
        out: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues in config_file.table.items():
            parsed = parse_offset_key(key)
            if parsed is None or not isinstance(queues, dict):
                continue
            topic, group = parsed
            try:
                out[(group, topic)] = {int(qid): int(offset) for qid, offset in queues.items()}
            except (TypeError, ValueError):
                continue
        return out

    def forget(self, keys: list[tuple[str, str]]) -> None:
        """Drop the offsets of (group, topic) pairs whose queues are gone."""
        for config_file in self.files:
            removed = [config_file.table.pop(offset_key(topic, group), None) for group, topic in keys]
            if any(entry is not None for entry in removed):
                config_file.save()

    def update(self, offsets: dict[tuple[str, str], dict[int, int]]) -> bool:
        """Merge `offsets` ((group, topic) -> {qid: offset}) into the tables; save each that
        changed.  Returns whether any did."""
        saved = False
        for config_file in self.files:
            changed = False
            table = config_file.table
            for (group, topic), queues in offsets.items():
                key = offset_key(topic, group)
                current = table.get(key)
                if not isinstance(current, dict):
                    current = table[key] = {}
                for qid, offset in queues.items():
                    if current.get(str(qid), current.get(qid)) != offset:
                        current.pop(qid, None)
                        current[str(qid)] = offset
                        changed = True
            if changed:
                config_file.save()
                saved = True
        return saved
