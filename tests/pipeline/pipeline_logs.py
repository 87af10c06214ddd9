"""Commit logs for the pipeline tests, written through the real store."""

from __future__ import annotations

from pathlib import Path

from tidemq.store import Message, MessageStore, StoreConfig, record
from tidemq.store.format.special_queues import SCHEDULE_TOPIC

SEGMENT_SIZE = 64 * 1024
UNITS_PER_FILE = 100
LONG_TOPIC = "v2-" + "t" * 140  # over 127 characters: written as v2 records


def store_config() -> StoreConfig:
    return StoreConfig(segment_size=SEGMENT_SIZE, consume_queue_units=UNITS_PER_FILE)


def sample_messages(count: int, seed: int = 0) -> list[Message]:
    """Many topics and queues, v1 and v2 records, transactions, delay levels, IPv6 hosts, no-tag
    messages."""
    topics = ["orders", "payments", "audit", "ünïcode-topic", LONG_TOPIC, "%RETRY%group-a"]
    out = []
    for i in range(count):
        n = i + seed
        topic = topics[n % len(topics)]
        sysflag = 0
        if n % 17 == 0:
            sysflag = record.TRANSACTION_PREPARED
        elif n % 19 == 0:
            sysflag = record.TRANSACTION_ROLLBACK
        elif n % 23 == 0:
            sysflag = record.TRANSACTION_COMMIT
        queue_id = (n // len(topics)) % (3 if topic != "audit" else 1)
        properties = {"trace": f"t{n}"} if n % 4 == 0 else {}
        if n % 29 == 0 and not sysflag:  # a 4.x delay level: its unit's tags code is its due time
            topic, queue_id = SCHEDULE_TOPIC, n % 18
            properties.update(DELAY=str(queue_id + 1), REAL_TOPIC="orders", REAL_QID="0")
        out.append(
            Message(
                topic=topic,
                body=bytes((n * 7 + j) % 256 for j in range(n % 300)),
                queue_id=queue_id,
                tags=None if n % 5 == 0 else f"tag-{n % 7}",
                keys=[f"key-{n}", f"order-{n % 11}"] if n % 3 else None,
                properties=properties,
                sysflag=sysflag,
                born_host=("::1", 4000 + n % 10) if n % 13 == 0 else ("10.0.0.7", 5000),
                reconsume_times=n % 3,
            )
        )
    return out


def write_store(directory, messages: list[Message]):
    """Write `messages` through the real store (its dispatcher builds the consume queues)."""
    with MessageStore(directory, store_config()) as store:
        results = [store.put(m) for m in messages]
        assert store.wait_dispatched(timeout=300)  # a loaded machine dispatches slowly
    return results


def dispatch_key_index(store, directory, hash_slots: int, max_entries: int) -> None:
    """The key index the store's own dispatcher builds from the log, with a KeyIndex sink."""
    from tidemq.store.dispatch.sequential import Dispatcher
    from tidemq.store.index.key_index import KeyIndex
    from tidemq.store.log.commit_log import CommitLog
    from tidemq.store.recovery.recover import scan_log

    commit_log = CommitLog(store / "commitlog", SEGMENT_SIZE)
    index = KeyIndex(directory, hash_slots, max_entries)
    try:
        end = scan_log(commit_log, commit_log.min_offset).end
        Dispatcher(commit_log, [index], commit_log.min_offset).dispatch_until(end, notify=False)
        index.flush()
    finally:
        index.close()
        commit_log.close()


def queue_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_files(expected_root: Path, actual_root: Path) -> None:
    expected, actual = queue_files(expected_root), queue_files(actual_root)
    assert sorted(actual) == sorted(expected)
    for name in expected:
        assert actual[name] == expected[name], f"{name} differs"
