"""Types and ranges of the fields of topic and group configs, as the admin takes them and as
they are read back from `config/*.json`.

An admin call with a bad field is refused with BAD_REQUEST naming the field; a bad persisted
entry is left out of the table (logged, naming the file and the entry) so that it never breaks
the other topics and groups."""

from __future__ import annotations

from .codes import BrokerError, Code

MAX_QUEUE_NUMS = 1024
MAX_DELIVERY_ATTEMPTS = 1000
TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "PRIORITY", "LITE")


def _refuse(message: str) -> BrokerError:
    return BrokerError(Code.BAD_REQUEST, message)


def integer(field: str, value, low: int, high: int) -> int:
    """`value` if it is an integer (not a bool, not a float) within [low, high]."""
    if type(value) is not int:
        raise _refuse(f"{field} must be an integer, not {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise _refuse(f"{field} {value} outside [{low}, {high}]")
    return value


def text(field: str, value) -> str:
    if type(value) is not str:
        raise _refuse(f"{field} must be a string, not {type(value).__name__} {value!r}")
    return value


def queue_nums(value) -> int:
    return integer("queue count", value, 1, MAX_QUEUE_NUMS)


def message_type(value) -> str:
    value = text("topic type", value).upper()
    if value not in TOPIC_TYPES:
        raise _refuse(f"topic type {value!r} is not one of {', '.join(TOPIC_TYPES)}")
    return value


def max_attempts(value) -> int:
    return integer("max attempts", value, 1, MAX_DELIVERY_ATTEMPTS)


def retry_backoff_ms(value, max_ms: int) -> list[int]:
    if type(value) is not list or not value:
        raise _refuse(f"retry backoff must be a non-empty list of durations in ms, not {value!r}")
    return [integer("retry backoff", ms, 0, max_ms) for ms in value]


def topic_entry_problem(name, entry) -> str | None:
    """Why a persisted topic entry cannot be used, or None."""
    try:
        if type(entry) is not dict:
            raise _refuse(f"an entry must be an object, not {type(entry).__name__}")
        if entry.get("name", name) != name:
            raise _refuse(f"its name {entry.get('name')!r} differs from its key")
        queue_nums(entry.get("queue_nums", 8))
        message_type(entry.get("message_type", "NORMAL"))
        integer("perm", entry.get("perm", 6), 0, 7)
    except BrokerError as exc:
        return exc.message
    return None


def group_entry_problem(name, entry) -> str | None:
    """Why a persisted group entry cannot be used, or None."""
    try:
        if type(entry) is not dict:
            raise _refuse(f"an entry must be an object, not {type(entry).__name__}")
        if entry.get("name", name) != name:
            raise _refuse(f"its name {entry.get('name')!r} differs from its key")
        integer("retry max times", entry.get("retry_max_times", 16), 0, MAX_DELIVERY_ATTEMPTS - 1)
        retry_backoff_ms(entry.get("retry_backoff_ms", [1000]), 2**53)
    except BrokerError as exc:
        return exc.message
    return None
