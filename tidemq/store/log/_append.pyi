# Types of the compiled append loop (_append.c, which documents each function).
from typing import Any

def prepare_messages(
    messages: list[Any] | tuple[Any, ...],
    prepare: Any,
    valid_topics: set[str],
    max_queue_id: int,
    max_message_size: int,
    suffixes: dict[Any, Any],
    templates: dict[Any, Any],
    uniq_property: bytes,
    key_prefix: str,
    counter: Any,
    crc32: Any,
    segment_size: int,
    /,
) -> list[Any]: ...
def write_records(
    buf: Any,
    base: int,
    ready_end: int,
    messages: list[Any] | tuple[Any, ...],
    prepared: list[Any],
    start: int,
    queue_offsets: dict[Any, int],
    store_timestamp: int,
    store_host: Any,
    results: list[Any],
    result_type: type,
    commit_log: Any,
    /,
) -> int: ...
def put_common(state: tuple[Any, ...], message: Any, region: tuple[Any, int, int] | None, /) -> Any:
    """The message's PutResult, or None when it is not the common case (or `region` is None)."""
