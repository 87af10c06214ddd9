"""Consume-queue units that are not a record's own plain unit, as RocketMQ 5.5.0 writes them.

- **Delay levels.**  A record of `SCHEDULE_TOPIC_XXXX` with a `DELAY` property (its level) gets,
  as its unit's tags code, the time it is due: its store timestamp plus the level's delay
  (`messageDelayLevel`, 18 levels by default; a level above the last counts as the last; a level
  without a delay gives store time + 1000).  Level 0 or none keeps the tag's hash.
- **Light message queues (LMQ, multi-dispatch).**  A record whose `INNER_MULTI_DISPATCH` names
  queues (comma-separated, `INNER_MULTI_QUEUE_OFFSET` their offsets in the same order) also has a
  unit in each of them, pointing at the record itself: queue 0 for an `%LMQ%` name, the record's
  own queue id otherwise; the unit's tags code is the record's.  Names with a path separator are
  skipped; records of retry, system (`rmq_sys_`) and delay-level topics are not multi-dispatched,
  and neither is a record whose two lists differ in length.

Pure functions over property values: the dispatcher, `store check` and the Spark rebuild share them.
"""

from __future__ import annotations

from collections.abc import Callable

from .record import PROPERTY_INNER_MULTI_DISPATCH, PROPERTY_INNER_MULTI_QUEUE_OFFSET

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
PROPERTY_DELAY = "DELAY"
LMQ_PREFIX = "%LMQ%"
RETRY_PREFIX = "%RETRY%"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
LMQ_QUEUE_ID = 0
MULTI_DISPATCH_SEPARATOR = ","

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
UNKNOWN_LEVEL_DELAY_MS = 1000


def parse_delay_levels(text: str) -> list[int]:
    """`messageDelayLevel` ("1s 5s ... 2h") as milliseconds, level 1 first."""
    levels = []
    for word in text.split():
        unit = _UNIT_MS.get(word[-1:])
        if unit is None or not word[:-1].isdigit():
            raise ValueError(f"delay level {word!r} is not a number followed by s, m, h or d")
        levels.append(int(word[:-1]) * unit)
    return levels


DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def deliver_timestamp(level: int, store_timestamp: int, levels_ms: list[int] = DELAY_LEVELS_MS) -> int:
    """When a message stored at `store_timestamp` with delay `level` (>= 1) is due."""
    level = min(level, len(levels_ms))
    delay = levels_ms[level - 1] if level >= 1 else UNKNOWN_LEVEL_DELAY_MS
    return store_timestamp + delay


def queue_tags_code(topic: str, delay_level: str | None, store_timestamp: int, tags_code: int) -> int:
    """The tags code of a record's own unit: `tags_code` (the tag's hash), except for a
    delay-level record (see the module docstring)."""
    if topic != SCHEDULE_TOPIC or delay_level is None:
        return tags_code
    try:
        level = int(delay_level)
    except ValueError:
        return tags_code
    return deliver_timestamp(level, store_timestamp) if level > 0 else tags_code


def multi_dispatches(topic: str) -> bool:
    """Whether a record of `topic` is multi-dispatched (RocketMQ's isNeedHandleMultiDispatch)."""
    return not (topic.startswith((RETRY_PREFIX, SYSTEM_TOPIC_PREFIX)) or topic == SCHEDULE_TOPIC)


def lmq_units(topic: str, queue_id: int, get_property: Callable[[str], str | None]) -> list[tuple[str, int, int]]:
    """(queue topic, queue id, queue offset) of each multi-dispatch unit of a record of `topic`
    and `queue_id` whose properties `get_property` reads; [] for most records."""
    names = get_property(PROPERTY_INNER_MULTI_DISPATCH)
    if not names or not multi_dispatches(topic):
        return []
    offsets = get_property(PROPERTY_INNER_MULTI_QUEUE_OFFSET)
    if not offsets or not names.strip() or not offsets.strip():
        return []
    name_list, offset_list = names.split(MULTI_DISPATCH_SEPARATOR), offsets.split(MULTI_DISPATCH_SEPARATOR)
    if len(name_list) != len(offset_list):
        return []
    units = []
    for name, offset in zip(name_list, offset_list):
        if "/" in name or not name:
            continue
        try:
            queue_offset = int(offset)
        except ValueError:
            continue
        units.append((name, LMQ_QUEUE_ID if name.startswith(LMQ_PREFIX) else queue_id, queue_offset))
    return units
