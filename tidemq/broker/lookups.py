"""Message lookups and dead-letter resends for the admin service (`tidemq message ...`,
`tidemq dlq resend`).

A message is found by its offset message id (store host + commit-log offset, read directly), by
its client message id (UNIQ_KEY, through the key index in every topic), by a business key (the
key index of one topic) or by a tag (the tag hash codes of one topic's consume queues, newest
first, each candidate checked against its record).

A dead letter of `%DLQ%G` is resent to the topic named by its RETRY_TOPIC property as a new
record that keeps its body, tags, keys, user properties and client message id (UNIQ_KEY), and
carries DLQ_RESENT_FROM, the offset message id of the dead letter.  Resending is idempotent
through the store itself: before a dead letter is resent, the key index of its origin topic is
asked for records with its UNIQ_KEY stored after it, and one carrying DLQ_RESENT_FROM equal to
its id means it was resent already.  Resends of one broker run one at a time and first wait until
the index covers every record written before, so a second call sees the first call's copies,
also after a restart (recovery re-dispatches the index)."""

from __future__ import annotations

import asyncio
import weakref

from ..store import Message, record
from . import bodies
from .broker import PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_RETRY_TOPIC, Broker
from .codes import BrokerError, Code
from .metadata import dead_letter_topic

PROPERTY_DLQ_RESENT_FROM = "DLQ_RESENT_FROM"
MAX_RESULTS = 64  # maxMsgsNumBatch of a query
MAX_TAG_SCAN = 200_000  # consume-queue units one tag query reads at most
MAX_RESENDS = 1000  # dead letters one resend call sends at most
_SCAN_CHUNK = 1024
_FOREVER = 2**63 - 1

_resend_locks: weakref.WeakKeyDictionary[Broker, asyncio.Lock] = weakref.WeakKeyDictionary()


def describe(rec: record.Record) -> dict:
    """A record as the admin service answers it: its places, properties and body (the text when
    the body, inflated if compressed, is printable UTF-8)."""
    body = bytes(rec.body or b"")
    compressed = bool(rec.sysflag & record.FLAG_COMPRESSED)
    text = None
    try:
        plain = bodies.plain_body(body, rec.sysflag)
        decoded = plain.decode("utf-8") if plain is not None else None
        if decoded is not None and all(c.isprintable() or c in "\n\r\t" for c in decoded):
            text = decoded
    except (OSError, EOFError, UnicodeDecodeError):
        pass
    return {
        "offset_msg_id": rec.msg_id,
        "message_id": rec.unique_key,
        "topic": rec.topic,
        "queue_id": rec.queue_id,
        "queue_offset": rec.queue_offset,
        "commit_log_offset": rec.commit_log_offset,
        "tags": rec.tags,
        "keys": rec.keys,
        "properties": dict(rec.properties),
        "store_timestamp": rec.store_timestamp,
        "born_timestamp": rec.born_timestamp,
        "store_host": "{}:{}".format(*rec.store_host),
        "born_host": "{}:{}".format(*rec.born_host),
        "reconsume_times": rec.reconsume_times,
        "body_size": len(body),
        "compressed": compressed,
        "body_text": text,
    }


def _need_index(broker: Broker) -> None:
    if broker.store.key_index is None:
        raise BrokerError(Code.BAD_REQUEST, "the broker's message index is disabled (messageIndexEnable)")


def _by_offset_id(broker: Broker, msg_id: str) -> record.Record | None:
    try:
        _, offset = record.parse_message_id(msg_id)
    except record.CodecError:
        return None
    if not 0 <= offset < broker.store.confirmed_offset:
        return None
    rec = broker.store.read_record(offset)  # None at an offset inside a record (decode checks its position)
    return rec if rec is not None and rec.msg_id == msg_id.upper() else None


def find_messages(broker: Broker, msg_id: str, topic: str | None = None) -> list[dict]:
    """The messages with this id: the record an offset message id names, else every record whose
    UNIQ_KEY is `msg_id` (in `topic`, or in every topic: the original, its dead letter, its
    resends), newest first.  MESSAGE_NOT_FOUND when there is none."""
    msg_id = msg_id.strip()
    rec = _by_offset_id(broker, msg_id)
    if rec is not None and topic in (None, rec.topic):
        return [describe(rec)]
    _need_index(broker)
    topics = [topic] if topic else sorted({t for t, _ in broker.store.queues()})
    found = [r for t in topics for r in broker.store.query_message(t, msg_id) if r.unique_key == msg_id]
    if not found:
        raise BrokerError(
            Code.MESSAGE_NOT_FOUND, f"no message with id {msg_id}" + (f" in topic {topic}" if topic else "")
        )
    found.sort(key=lambda r: r.commit_log_offset, reverse=True)
    return [describe(r) for r in found]


def query_messages(
    broker: Broker,
    topic: str,
    key: str | None = None,
    tag: str | None = None,
    begin: int = 0,
    end: int = _FOREVER,
    max_num: int = MAX_RESULTS,
) -> dict:
    """Messages of `topic` stored within [begin, end] (ms) carrying `key` (UNIQ_KEY or a KEYS
    entry) and/or the tag `tag`, newest first, at most `max_num` (64 at most).  `complete` is
    false when more may match (the limit was reached, or a tag scan stopped at MAX_TAG_SCAN)."""
    if key is None and tag is None:
        raise BrokerError(Code.BAD_REQUEST, "a query needs a key or a tag")
    if not 1 <= max_num <= MAX_RESULTS:
        raise BrokerError(Code.BAD_REQUEST, f"max {max_num} outside [1, {MAX_RESULTS}]")
    if begin > end:
        raise BrokerError(Code.BAD_REQUEST, f"begin {begin} is after end {end}")
    if topic not in broker.metadata.topics and not any(t == topic for t, _ in broker.store.queues()):
        raise BrokerError(Code.TOPIC_NOT_FOUND, f"no topic {topic}")
    complete = True
    if key is not None:
        _need_index(broker)
        found = broker.store.query_message(topic, key, begin, end, MAX_RESULTS)
        if tag is not None:
            found = [r for r in found if r.tags == tag]
    else:
        assert tag is not None  # a query without a key or a tag is refused above
        found, complete = _by_tag(broker, topic, tag, begin, end, max_num)
    found.sort(key=lambda r: r.store_timestamp, reverse=True)
    complete = complete and len(found) <= max_num
    return {"messages": [describe(r) for r in found[:max_num]], "complete": complete}


def _by_tag(broker: Broker, topic: str, tag: str, begin: int, end: int, max_num: int) -> tuple[list, bool]:
    """Per queue, newest first, units whose tag hash code is the tag's, checked on their record."""
    store, code = broker.store, record.tags_code(tag)
    found: list[record.Record] = []
    scanned = 0
    for queue_id in sorted(q for t, q in store.queues() if t == topic):
        low = max(store.min_offset(topic, queue_id), store.offset_for_timestamp(topic, queue_id, begin) if begin else 0)
        high = store.max_offset(topic, queue_id)
        if end < _FOREVER:
            high = min(high, store.offset_for_timestamp(topic, queue_id, end, upper=True) + 1)
        in_queue = 0
        while high > low and in_queue < max_num:
            if scanned >= MAX_TAG_SCAN:
                return found, False
            start = max(low, high - _SCAN_CHUNK)
            units = store.read_units(topic, queue_id, start, high - start)
            scanned += len(units)
            for u in reversed(units):
                if u.tags_code != code:
                    continue
                rec = store.read_unit(u)
                if rec is not None and rec.tags == tag and begin <= rec.store_timestamp <= end:
                    found.append(rec)
                    in_queue += 1
                    if in_queue >= max_num:
                        break
            high = start
    return found, True


async def resend_dead_letters(broker: Broker, group: str, id: str | None = None, max_num: int = MAX_RESENDS) -> dict:
    """Resend the dead letters of `group` (or the one whose offset message id or client message
    id is `id`) to their origin topics, each at most once (see the module's docstring)."""
    if not 1 <= max_num <= MAX_RESENDS:
        raise BrokerError(Code.BAD_REQUEST, f"max {max_num} outside [1, {MAX_RESENDS}]")
    dlq = dead_letter_topic(group)
    if group not in broker.metadata.groups and dlq not in broker.metadata.topics:
        raise BrokerError(Code.CONSUMER_GROUP_NOT_FOUND, f"no consumer group {group}")
    _need_index(broker)
    lock = _resend_locks.setdefault(broker, asyncio.Lock())
    async with lock:
        if not await asyncio.to_thread(broker.store.wait_dispatched, 30.0):
            raise BrokerError(Code.INTERNAL_ERROR, "the message index is behind the log; try again")
        resent: list[dict] = []
        already: list[str] = []
        failed: list[dict] = []
        matched = 0
        for rec in _dead_letters(broker, dlq):
            if id is not None and id.upper() != rec.msg_id and id != rec.unique_key:
                continue
            matched += 1
            if _was_resent(broker, rec):
                already.append(rec.msg_id)
                continue
            if len(resent) >= max_num:
                break
            try:
                result = await _resend(broker, rec)
            except BrokerError as exc:
                failed.append({"offset_msg_id": rec.msg_id, "error": f"{exc.code.name}: {exc.message}"})
                continue
            resent.append(
                {
                    "offset_msg_id": rec.msg_id,
                    "message_id": rec.unique_key,
                    "topic": result[0],
                    "queue_id": result[1],
                    "new_offset_msg_id": result[2],
                }
            )
    if id is not None and matched == 0:
        raise BrokerError(Code.MESSAGE_NOT_FOUND, f"no dead letter with id {id} in {dlq}")
    return {"topic": dlq, "resent": resent, "already_resent": already, "failed": failed}


def _dead_letters(broker: Broker, dlq: str):
    store = broker.store
    for queue_id in sorted(q for t, q in store.queues() if t == dlq):
        offset, high = store.min_offset(dlq, queue_id), store.max_offset(dlq, queue_id)
        while offset < high:
            units = store.read_units(dlq, queue_id, offset, min(_SCAN_CHUNK, high - offset))
            if not units:
                break
            for u in units:
                rec = store.read_unit(u)
                if rec is not None:
                    yield rec
            offset = units[-1].queue_offset + 1


def _was_resent(broker: Broker, dead: record.Record) -> bool:
    origin = dead.properties.get(PROPERTY_RETRY_TOPIC)
    if not origin or not dead.unique_key:
        return False
    copies = broker.store.query_message(origin, dead.unique_key, dead.store_timestamp)
    return any(r.properties.get(PROPERTY_DLQ_RESENT_FROM) == dead.msg_id for r in copies)


async def _resend(broker: Broker, dead: record.Record) -> tuple[str, int, str]:
    origin = dead.properties.get(PROPERTY_RETRY_TOPIC)
    if not origin:
        raise BrokerError(Code.BAD_REQUEST, f"dead letter {dead.msg_id} names no origin topic (RETRY_TOPIC)")
    if not dead.unique_key:
        raise BrokerError(Code.BAD_REQUEST, f"dead letter {dead.msg_id} has no client message id (UNIQ_KEY)")
    topic = broker.topic(origin, create=False)
    properties = dict(dead.properties)
    for name in (PROPERTY_RETRY_TOPIC, PROPERTY_MAX_RECONSUME_TIMES):
        properties.pop(name, None)
    properties[PROPERTY_DLQ_RESENT_FROM] = dead.msg_id
    queue_id = dead.commit_log_offset % topic.queue_nums
    (result,) = await broker.publisher.put(
        [
            Message(
                topic=topic.name,
                body=dead.body_bytes,
                queue_id=queue_id,
                properties=properties,
                flag=dead.flag,
                sysflag=dead.sysflag & bodies.BODY_FLAGS,
                born_timestamp=dead.born_timestamp,
                born_host=dead.born_host,
            )
        ]
    )
    return topic.name, queue_id, result.msg_id


METHODS = {"FindMessages": find_messages, "QueryMessages": query_messages, "ResendDeadLetters": resend_dead_letters}
