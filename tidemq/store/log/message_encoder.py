"""MessageEncoder: what a message becomes before it has a place in the log.

`prepare` validates a message against the store's limits and builds everything that does not
depend on where it lands: its RecordTemplate (topic and hosts), body and body CRC, properties
bytes with UNIQ_KEY (made here when the producer sent none), TAGS and KEYS.  The append then only
packs the positional fields (`RecordTemplate.write_into`).  It runs outside the append lock.

The caches (validated topics, templates, per-tag property suffixes) are bounded and only ever
hold what was computed from the same inputs, so losing or racing on them changes nothing.
"""

from __future__ import annotations

import itertools
import operator
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import InvalidMessageError
from ..format import record

if TYPE_CHECKING:
    from ..message_store import Message, StoreConfig

_prepare_messages: Callable[..., list[Any]] | None
try:  # the compiled common case of `prepare`; without it, `prepare` does every message
    from ._append import prepare_messages as _prepare_messages
except ImportError:
    _prepare_messages = None

UNIQ_KEY_PREFIX = f"{record.PROPERTY_UNIQ_KEY}\x01".encode("ascii")
# The record's numeric fields a message sets, with their widths: FLAG, SYSFLAG, RECONSUMETIMES
# (i32), PREPAREDTXOFFSET and BORNTIMESTAMP (i64).
_NUMERIC_FIELDS = (
    ("flag", 32),
    ("sysflag", 32),
    ("reconsume_times", 32),
    ("prepared_transaction_offset", 64),
    ("born_timestamp", 64),
)
_NUMERIC_STRUCT = struct.Struct(">iiiqq")


class _UniqueKeys:
    """UNIQ_KEY for messages that arrive without one: 32 uppercase hex characters, ip(4) +
    pid(2) + random(4) + a counter(6) seeded from the clock, like RocketMQ's client ids."""

    def __init__(self, host: str) -> None:
        try:
            ip = socket.inet_aton(host)
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        self.prefix = (ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)).hex().upper()
        # next() on a count is atomic under the GIL (the compiled encoder takes from it too)
        self.counter = itertools.count((time.time_ns() // 1_000_000 << 8) & 0xFFFFFFFFFFFF)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter) & 0xFFFFFFFFFFFF:012X}"


class CommonPutState(NamedTuple):
    """What the compiled single put (`_append.put_common`) reads besides the message and the
    region it writes in, in this order.  The objects are the encoder's and the store's own, which
    change in place, so one state serves every put."""

    message_type: type
    valid_topics: set[str]
    max_queue_id: int
    max_message_size: int
    property_suffixes: dict[str | None, bytes]
    templates: dict[tuple, record.RecordTemplate]
    uniq_property: bytes
    unique_keys: _UniqueKeys
    crc32: Callable[[Any], int]
    segment_size: int
    queue_offsets: dict[tuple[str, int], int]  # each queue's next offset, advanced by a put
    store_host: tuple[str, int]
    result_type: type
    commit_log: Any  # its `write_position` is read, and advanced past the record
    clock: Callable[[], int] | None  # None: the wall clock in milliseconds


class MessageEncoder:
    def __init__(self, config: StoreConfig, segment_size: int) -> None:
        self.config = config
        self.segment_size = segment_size
        self._unique_keys = _UniqueKeys(config.store_host[0])
        self._valid_topics: set[str] = set()  # topics already validated (a cache, not a registry)
        self._templates: dict[tuple, record.RecordTemplate] = {}  # (topic, born host) -> template
        self._property_suffixes: dict[str | None, bytes] = {}  # tag -> its encoded TAGS property
        # RocketMQ's enabledAppendPropCRC: every record's properties end with the whole-record CRC
        # property, reserved here and filled in once the record is written (record.seal_crc_property)
        self._crc_tail = record.CRC32_PROPERTY_RESERVED if config.append_crc_property else b""

    def common_put_state(
        self,
        message_type: type,
        queue_offsets: dict[tuple[str, int], int],
        result_type: type,
        commit_log: Any,
        clock: Callable[[], int] | None,
    ) -> CommonPutState:
        cfg = self.config
        return CommonPutState(
            message_type,
            self._valid_topics,
            cfg.max_queue_id,
            cfg.max_message_size,
            self._property_suffixes,
            self._templates,
            UNIQ_KEY_PREFIX,
            self._unique_keys,
            record.crc32,
            self.segment_size,
            queue_offsets,
            cfg.store_host,
            result_type,
            commit_log,
            clock,
        )

    def invalid(self, message: Message) -> str | None:
        """Why the store will not take `message`, or None."""
        cfg = self.config
        topic = message.topic
        if not isinstance(topic, str) or not topic:
            return "topic must be a non-empty string"
        if len(topic) > cfg.max_topic_bytes or len(topic.encode("utf-8")) > cfg.max_topic_bytes:
            return f"topic is {len(topic.encode('utf-8'))} bytes, at most {cfg.max_topic_bytes}"
        if "/" in topic or "\x00" in topic or topic in (".", ".."):
            return f"topic {topic!r} contains '/' or NUL, or is a dot name"
        if type(message.queue_id) is not int or not 0 <= message.queue_id <= cfg.max_queue_id:
            return f"queue id {message.queue_id!r} out of range [0, {cfg.max_queue_id}]"
        if not isinstance(message.body, (bytes, bytearray, memoryview)):
            return "body must be bytes"
        if len(message.body) > cfg.max_message_size:
            return f"body is {len(message.body)} bytes, over the maximum of {cfg.max_message_size}"
        for name, bits in _NUMERIC_FIELDS:
            value = getattr(message, name)
            if value is None and name == "born_timestamp":
                continue
            try:  # any integer-like value, as the record's packing takes it
                number = operator.index(value)
            except TypeError:
                number = None
            if number is None or not -(1 << (bits - 1)) <= number < 1 << (bits - 1):
                return f"{name} {value!r} is not a {bits}-bit signed integer"
        return None

    def prepare_all(self, messages) -> list[tuple]:
        """`prepare` for each of `messages` (a list or tuple), in order; raises as it does.  The
        compiled encoder (`_append.prepare_messages`) takes the common case (a known topic and
        tag, no properties or keys) and hands any other message to `prepare`."""
        if _prepare_messages is None:
            prepare = self.prepare
            return [prepare(m) for m in messages]
        cfg = self.config
        unique_keys = self._unique_keys
        return _prepare_messages(
            messages,
            self.prepare,
            self._valid_topics,
            cfg.max_queue_id,
            cfg.max_message_size,
            self._property_suffixes,
            self._templates,
            UNIQ_KEY_PREFIX,
            unique_keys.prefix,
            unique_keys.counter,
            record.crc32,
            self.segment_size,
        )

    def prepare(self, message: Message) -> tuple:
        """Validate `message` and build what does not depend on where it lands: (template, body,
        body CRC, properties bytes, UNIQ_KEY).  Raises InvalidMessageError."""
        cfg = self.config
        topic, body, queue_id = message.topic, message.body, message.queue_id
        if (
            topic not in self._valid_topics
            or type(queue_id) is not int
            or not 0 <= queue_id <= cfg.max_queue_id
            or type(body) is not bytes
            or len(body) > cfg.max_message_size
        ):
            problem = self.invalid(message)
            if problem:
                raise InvalidMessageError(problem)
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(topic)
            body = bytes(body)
        try:  # the numeric fields fit the record (checked here so that a batch stores all or none)
            _NUMERIC_STRUCT.pack(
                message.flag,
                message.sysflag,
                message.reconsume_times,
                message.prepared_transaction_offset,
                message.born_timestamp or 0,
            )
        except struct.error:
            raise InvalidMessageError(self.invalid(message) or "a numeric field does not fit the record") from None
        properties = message.properties
        if properties:
            unique_key = properties.get(record.PROPERTY_UNIQ_KEY) or self._unique_keys.next()
            items = dict(properties)
            items.pop(record.CRC32_PROPERTY, None)  # a copied record's CRC is stale: the store writes its own
            items[record.PROPERTY_UNIQ_KEY] = unique_key
            if message.tags is not None:
                items[record.PROPERTY_TAGS] = message.tags
            if message.keys:
                items[record.PROPERTY_KEYS] = record.KEY_SEPARATOR.join(message.keys)
            try:
                properties_bytes = record.encode_properties(items) + self._crc_tail
            except record.CodecError as exc:
                raise InvalidMessageError(str(exc)) from None
        else:
            # the common case: UNIQ_KEY, then TAGS and KEYS, whose encoding is cached per tag
            unique_key = self._unique_keys.next()
            keys = message.keys
            suffix = self._property_suffixes.get(message.tags) if not keys else None
            if suffix is None:
                suffix = self._property_suffix(message.tags, keys)
            properties_bytes = b"".join((UNIQ_KEY_PREFIX, unique_key.encode("ascii"), suffix))
        if len(properties_bytes) > record.MAX_PROPERTIES_BYTES:
            raise InvalidMessageError(
                f"properties are {len(properties_bytes)} bytes, at most {record.MAX_PROPERTIES_BYTES}"
            )
        template = self._templates.get((topic, message.born_host))
        if template is None:
            template = self._template(topic, message.born_host)
        if template.fixed_size + len(body) + len(properties_bytes) + record.BLANK_SIZE > self.segment_size:
            size = template.fixed_size + len(body) + len(properties_bytes)
            raise InvalidMessageError(f"a {size}-byte record does not fit a {self.segment_size}-byte segment")
        return template, body, record.crc32(body) & 0x7FFFFFFF, properties_bytes, unique_key

    def _property_suffix(self, tags: str | None, keys: list[str] | None) -> bytes:
        """TAGS and KEYS as property bytes (after UNIQ_KEY); cached per tag when there are no keys."""
        text = f"TAGS\x01{tags}\x02" if tags is not None else ""
        if keys:
            text = f"{text}KEYS\x01{record.KEY_SEPARATOR.join(keys)}\x02"
        if text.count("\x01") != (tags is not None) + bool(keys) or text.count("\x02") != text.count("\x01"):
            raise InvalidMessageError("tags or keys contain a \\x01 or \\x02 separator character")
        try:
            suffix = b"\x02" + text.encode("utf-8") + self._crc_tail
        except UnicodeEncodeError as exc:
            raise InvalidMessageError(f"tags or keys are not encodable as UTF-8: {exc.reason}") from None
        if not keys and len(self._property_suffixes) < 10_000:
            self._property_suffixes[tags] = suffix
        return suffix

    def _template(self, topic: str, born_host) -> record.RecordTemplate:
        try:
            template = record.RecordTemplate(topic, born_host, self.config.store_host)
        except record.CodecError as exc:
            raise InvalidMessageError(str(exc)) from None
        except (ValueError, TypeError) as exc:  # a malformed host address or port
            raise InvalidMessageError(f"cannot encode the message: {exc}") from None
        if len(self._templates) < 10_000:
            self._templates[(topic, born_host)] = template
        return template
