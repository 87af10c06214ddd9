"""A commit log laid out as Apache RocketMQ writes it — its own property set, no tidemq extras,
messages without UNIQ_KEY, blank fillers closing segments — read and rebuilt like tidemq's."""

from __future__ import annotations

from pipeline_logs import assert_same_files, dispatch_key_index

from tidemq.pipeline.rebuild import rebuild
from tidemq.store import MessageStore, StoreConfig, record

SEGMENT = 16 * 1024


def write_rocketmq_log(store, count: int) -> list[tuple[int, dict]]:
    """Segments of RocketMQ records built with the codec; returns (offset, properties) of each."""
    directory = store / "commitlog"
    directory.mkdir(parents=True)
    segments: dict[int, bytearray] = {}
    queue_offsets: dict[tuple[str, int], int] = {}
    written = []
    offset = 0
    for i in range(count):
        topic = ["TopicTest", "%RETRY%please_rename_unique_group_name", "BenchmarkTest"][i % 3]
        queue_id = i % 4
        properties = {"WAIT": "true", "TAGS": f"TagA{i % 3}", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        if i % 2:
            properties["KEYS"] = f"OrderID{i:04d}"
        if i % 5:
            properties[record.PROPERTY_UNIQ_KEY] = f"AC11000100002A9F0000{i:012X}"
        if topic.startswith("%RETRY%"):
            properties.update({"RETRY_TOPIC": "TopicTest", "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": "AC1100010000"})
        key = (topic, queue_id)
        fields = dict(
            topic=topic,
            body=b"Hello RocketMQ %d" % i,
            queue_id=queue_id,
            queue_offset=queue_offsets.get(key, 0),
            store_timestamp=1_700_000_000_000 + i * 10,
            born_timestamp=1_700_000_000_000 + i * 10 - 3,
            properties=properties,
            store_host=("172.17.0.1", 10911),
            born_host=("172.17.0.2", 53412),
        )
        size = len(record.encode(**fields))
        if offset % SEGMENT + size + record.BLANK_SIZE > SEGMENT:  # roll, as RocketMQ does
            segment = segments.setdefault(offset - offset % SEGMENT, bytearray(SEGMENT))
            segment[offset % SEGMENT : offset % SEGMENT + 8] = record.encode_blank(SEGMENT - offset % SEGMENT)
            offset += SEGMENT - offset % SEGMENT
        segment = segments.setdefault(offset - offset % SEGMENT, bytearray(SEGMENT))
        segment[offset % SEGMENT : offset % SEGMENT + size] = record.encode(**fields, commit_log_offset=offset)
        written.append((offset, properties))
        queue_offsets[key] = queue_offsets.get(key, 0) + 1
        offset += size
    for start, data in segments.items():
        (directory / f"{start:020d}").write_bytes(bytes(data))
    return written


def test_a_rocketmq_commit_log_reads_and_rebuilds(spark, tmp_path):
    store = tmp_path / "rocketmq-broker"
    written = write_rocketmq_log(store, 400)
    assert len(list((store / "commitlog").iterdir())) >= 4

    rows = sorted(
        spark.read.format("tidemq-commitlog").option("partitionSize", "6k").load(str(store)).collect(),
        key=lambda r: r.commit_log_offset,
    )
    assert [r.commit_log_offset for r in rows] == [offset for offset, _ in written]
    for row, (_, properties) in zip(rows, written):
        assert row.unique_key == properties.get(record.PROPERTY_UNIQ_KEY)
        assert row.keys == ([properties["KEYS"]] if "KEYS" in properties else [])
        assert row.properties == properties
        assert row.store_host == "172.17.0.1:10911"

    rebuild(spark, store, tmp_path / "out", units_per_file=50, hash_slots=53, max_entries=200, partition_size="6k")
    # the store's own dispatcher on the same log: open it (recovery dispatches every record)
    with MessageStore(store, StoreConfig(segment_size=SEGMENT, consume_queue_units=50)) as opened:
        assert opened.wait_dispatched()
    assert_same_files(store / "consumequeue", tmp_path / "out" / "consumequeue")
    dispatch_key_index(store, tmp_path / "expected-index", 53, 200)
    assert_same_files(tmp_path / "expected-index", tmp_path / "out" / "index")


def test_an_empty_log_reads_as_no_rows(spark, tmp_path):
    (tmp_path / "empty" / "commitlog").mkdir(parents=True)
    df = spark.read.format("tidemq-commitlog").load(str(tmp_path / "empty"))
    assert df.count() == 0
