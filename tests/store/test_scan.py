"""The columnar dispatch decoder (`scan`) against the reference codec (`record.decode`): the same
records, the same fields, the same stopping point, on random logs and on every truncation."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.store import record
from tidemq.store.dispatch.requests import DispatchRequest, builds_queue_entry
from tidemq.store.format import scan as scan_module
from tidemq.store.format.index_keys import key_hashes, record_index_keys
from tidemq.store.format.scan import scan

NAMES = ["TAGS", "KEYS", record.PROPERTY_UNIQ_KEY, record.LEGACY_PROPERTY_UNIQ_KEY, "DELAY", "a", "XTAGS", "TAG", "KEYSX"]
TEXT = st.text(alphabet=st.sampled_from(list("ab Z#09\x01é€\U0001d11e ")), max_size=8)

segments = st.one_of(
    st.tuples(st.sampled_from(NAMES), TEXT).map(lambda nv: f"{nv[0]}\x01{nv[1]}\x02".encode()),
    st.tuples(st.sampled_from(NAMES), st.binary(max_size=6)).map(lambda nv: nv[0].encode() + b"\x01" + nv[1]),
    st.binary(max_size=6),  # junk: stray separators, no separator, invalid UTF-8
    st.just(b"\x02"),
)
properties = st.lists(segments, max_size=6).map(b"".join)
topics = st.one_of(
    st.text(alphabet=st.sampled_from(list("abt_%é")), min_size=1, max_size=10),
    st.just("SCHEDULE_TOPIC_XXXX"),  # delay levels: units' tags codes are due times
    st.text(alphabet=st.sampled_from(list("xyz")), min_size=128, max_size=140),  # v2
)
hosts = st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 0), ("::1", 10911), ("2001:db8::7", 80)])
messages = st.fixed_dictionaries(
    {
        "topic": topics,
        "body": st.one_of(st.binary(max_size=40), st.just(b"\x02TAGS\x01b\x02KEYS\x01c d\x02")),
        "queue_id": st.integers(0, 5),
        "queue_offset": st.integers(0, 2**40),
        "properties": properties,
        "born_host": hosts,
        "store_host": hosts,
        "sysflag": st.sampled_from([0, record.TRANSACTION_PREPARED, record.TRANSACTION_COMMIT, record.TRANSACTION_ROLLBACK, record.FLAG_MULTI_TAGS]),
        "store_timestamp": st.integers(0, 2**42),
    }
)


def encode(m: dict, commit_log_offset: int) -> bytes:
    prepared = record.prepare(
        topic=m["topic"], body=m["body"], queue_id=m["queue_id"], properties_bytes=m["properties"],
        store_host=m["store_host"], born_host=m["born_host"], born_timestamp=1, sysflag=m["sysflag"],
    )
    out = bytearray(prepared.total_size)
    prepared.pack_into(out, 0, m["queue_offset"], commit_log_offset, m["store_timestamp"])
    return bytes(out)


def build_log(items: list[dict], base: int, tail: str, segment_room: int) -> tuple[bytearray, list[int]]:
    buf = bytearray()
    starts = []
    for m in items:
        starts.append(len(buf))
        buf += encode(m, base + len(buf))
    if tail == "blank":
        size = 8 + segment_room
        buf += record.encode_blank(size) + bytes(size - 8)
    elif tail == "zeros":
        buf += bytes(segment_room)
    elif tail == "torn" and items:
        torn = encode(items[0], base + len(buf))
        buf += torn[: max(1, len(torn) * segment_room // 200)]
    return buf, starts


def reference(buf, start: int, stop: int, base: int) -> tuple[list[DispatchRequest], int]:
    """What dispatch gets from `record.decode` walking from `start`, and where it stops."""
    requests = []
    pos = start
    while True:
        rec = record.decode(buf, pos, base_offset=base, check_crc=False, read_body=False)
        if type(rec) is not record.Record or pos + rec.total_size > stop:
            break
        requests.append(DispatchRequest.from_record(rec))
        pos += rec.total_size
    return requests, base + pos


def expected_index(requests: list[DispatchRequest]):
    texts, phys, times = [], [], []
    for r in requests:
        if r.sysflag & record.TRANSACTION_TYPE_MASK == record.TRANSACTION_ROLLBACK:
            continue
        for key in record_index_keys(r.unique_key, r.keys, r.tags):
            texts.append(f"{r.topic}#{key}")
            phys.append(r.commit_log_offset)
            times.append(r.store_timestamp)
    return key_hashes(texts), phys, times


def test_the_vectorized_queue_entry_rule_is_the_per_record_one():
    """Every SYSFLAG: NOT and COMMIT records get a ConsumeQueue entry, PREPARED and ROLLBACK
    not, whatever the other flags; for a whole batch as for one record."""
    sysflags = np.arange(256, dtype=np.int32)
    kinds = [flag & record.TRANSACTION_TYPE_MASK for flag in range(256)]
    assert builds_queue_entry(sysflags).tolist() == [kind in (record.TRANSACTION_NOT, record.TRANSACTION_COMMIT) for kind in kinds]


def test_the_compiled_dispatch_parts_are_built():
    # `optional` in pyproject.toml: an install without a C compiler walks and hashes with NumPy
    from tidemq.store.index import index_file

    assert scan_module.COMPILED, "tidemq/store/_dispatch.c was not compiled at install"
    assert index_file.COMPILED
    assert record.java_string_hash.__wrapped__ is not record.java_string_hash_python


def check_agrees(buf, start: int, stop: int, base: int) -> None:
    """Both ways `scan` works agree with the codec: the compiled walk (where it is built) and
    the reference, one record at a time."""
    compiled = scan_module.COMPILED
    try:
        if compiled:
            check_agrees_once(buf, start, stop, base)
        scan_module.COMPILED = False
        check_agrees_once(buf, start, stop, base)
    finally:
        scan_module.COMPILED = compiled


def check_agrees_once(buf, start: int, stop: int, base: int) -> None:
    for keys in (False, True):  # the compiled walk makes the key index's entries itself when asked for keys
        check_agrees_once_with(buf, start, stop, base, keys)


def check_agrees_once_with(buf, start: int, stop: int, base: int, keys: bool) -> None:
    requests, end = reference(bytes(buf), start, stop, base)
    columns = scan(buf, start, stop, base, keys=keys)
    assert columns.end == end
    assert len(columns) == len(requests)
    got = [DispatchRequest.from_columns(columns, i) for i in range(len(columns))]
    assert got == requests
    for i, r in enumerate(requests):
        assert columns.topic_names[columns.topic_ids[i]] == r.topic
        assert columns.unique_key(i) == r.unique_key and columns.keys(i) == r.keys
    hashes, phys, times = columns.index_keys()
    want_hashes, want_phys, want_times = expected_index(requests)
    assert hashes.tolist() == want_hashes.tolist()
    assert phys.tolist() == want_phys and times.tolist() == want_times


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(messages, max_size=8),
    base=st.sampled_from([0, 1 << 30, 12345]),
    tail=st.sampled_from(["none", "blank", "zeros", "torn"]),
    room=st.integers(0, 200),
    first=st.integers(0, 8),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    field_flips=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 140), st.integers(0, 255)), max_size=2),
    stop_cut=st.integers(0, 400),
    data=st.data(),
)
def test_scan_agrees_with_decode_on_random_logs(items, base, tail, room, first, flips, field_flips, stop_cut, data):
    buf, starts = build_log(items, base, tail, room)
    for at, value in flips:  # corruption anywhere: sizes, magic, lengths, topics, properties
        if buf:
            buf[at % len(buf)] = value
    for index, at, value in field_flips:  # corruption in a record's header fields
        if starts and starts[index % len(starts)] + at < len(buf):
            buf[starts[index % len(starts)] + at] = value
    start = starts[min(first, len(starts) - 1)] if starts else 0
    stop = max(start, len(buf) - stop_cut) if data.draw(st.booleans()) else len(buf)
    check_agrees(buf, start, stop, base)
    check_agrees(bytes(buf), start, stop, base)


def test_scan_agrees_on_every_truncation():
    items = [
        {"topic": "orders", "body": b"x" * 10, "queue_id": 1, "queue_offset": 7, "born_host": ("127.0.0.1", 1),
         "store_host": ("127.0.0.1", 10911), "sysflag": 0, "store_timestamp": 5,
         "properties": record.encode_properties({"TAGS": "TagA", "KEYS": "k1  k2", record.PROPERTY_UNIQ_KEY: "U1"})},
        {"topic": "t" * 130, "body": b"", "queue_id": 0, "queue_offset": 0, "born_host": ("::1", 1),
         "store_host": ("2001:db8::1", 10911), "sysflag": record.TRANSACTION_COMMIT, "store_timestamp": 6,
         "properties": "KEYS\x01é€\x02TAGS\x01\U0001d11e\x02".encode()},
        {"topic": "p", "body": b"zz", "queue_id": 2, "queue_offset": 1, "born_host": ("10.0.0.1", 2),
         "store_host": ("127.0.0.1", 10911), "sysflag": record.TRANSACTION_ROLLBACK, "store_timestamp": 7,
         "properties": b"TAGS\x01a\x02TAGS\x01b"},
    ]
    buf, starts = build_log(items, 4096, "blank", 16)
    for length in range(len(buf) + 1):
        check_agrees(bytes(buf[:length]), 0, length, 4096)
        check_agrees(bytes(buf[:length]), starts[1], max(length, starts[1]), 4096)


def test_compiled_key_hashes_of_every_length_and_a_non_ascii_byte_anywhere():
    """The compiled walk hashes a key eight bytes a step, then byte by byte: keys of 0 to 40
    bytes, all ASCII or with one non-ASCII character at each position (hashed from the decoded
    text instead), give the hashes of the definition."""
    keys = ["".join(chr(33 + (i * 7 + n) % 90) for i in range(n)) for n in range(1, 41)]
    keys += [k[:at] + "é" + k[at:] for k in keys[7:24] for at in range(len(k) + 1)]
    items = [{"topic": "orders", "body": b"", "queue_id": 0, "queue_offset": i, "born_host": ("127.0.0.1", 1),
              "store_host": ("127.0.0.1", 10911), "sysflag": 0, "store_timestamp": 5,
              "properties": record.encode_properties({record.PROPERTY_UNIQ_KEY: key, "KEYS": f"{key} x{key}"})}
             for i, key in enumerate(keys)]
    buf, _ = build_log(items, 0, "end", 0)
    expected = key_hashes([f"orders#{k}" for key in keys for k in (key, key, "x" + key)])
    for hashed_in_the_walk in (False, True):
        columns = scan(bytes(buf), 0, len(buf), 0, keys=hashed_in_the_walk)
        assert len(columns) == len(keys)
        assert columns.index_keys()[0].tolist() == expected.tolist()


def test_the_walks_key_entries_stop_with_the_rows_at_a_topic_that_is_not_utf8():
    """The compiled walk hashes keys before Python decodes the topics; rows cut at the first
    topic that is not UTF-8 take their entries with them."""
    items = [{"topic": topic, "body": b"b", "queue_id": 0, "queue_offset": i, "born_host": ("127.0.0.1", 1),
              "store_host": ("127.0.0.1", 10911), "sysflag": 0, "store_timestamp": 5,
              "properties": record.encode_properties({record.PROPERTY_UNIQ_KEY: f"u{i}", "KEYS": f"k{i} é{i}"})}
             for i, topic in enumerate(["good", "good", "BADTOPIC", "good"])]
    buf, starts = build_log(items, 0, "end", 0)
    at = buf.index(b"BADTOPIC", starts[2])
    buf[at : at + 2] = b"\xff\xfe"
    columns = scan(bytes(buf), 0, len(buf), 0, keys=True)
    assert len(columns) == 2
    hashes, phys, _ = columns.index_keys()
    assert hashes.tolist() == key_hashes([f"good#{k}" for i in range(2) for k in (f"u{i}", f"k{i}", f"é{i}")]).tolist()
    assert phys.tolist() == [starts[0]] * 3 + [starts[1]] * 3


def test_scan_of_a_mapping_keeps_no_export(tmp_path):
    """The columns hold the mapping itself, not a NumPy view of it: it can still be closed."""
    import mmap

    raw = encode({"topic": "t", "body": b"b", "queue_id": 0, "queue_offset": 0, "born_host": ("127.0.0.1", 1),
                  "store_host": ("127.0.0.1", 2), "sysflag": 0, "store_timestamp": 1,
                  "properties": b"TAGS\x01x\x02KEYS\x01k\x02"}, 0)
    path = tmp_path / "seg"
    path.write_bytes(raw + bytes(100))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
    columns = scan(mm, 0, len(mm), 0)
    assert len(columns) == 1 and columns.keys(0) == ["k"]
    assert columns.index_keys()[0].tolist() == key_hashes(["t#k", "t#T#x"]).tolist()  # the tag last
    assert np.array_equal(columns.tags_codes, [record.java_string_hash("x")])
    mm.close()


@settings(max_examples=100, deadline=None)
@given(
    segments=st.lists(
        st.tuples(st.sampled_from([b"TAGS", b"KEYS", record.PROPERTY_UNIQ_KEY.encode(), b"X", b"", b"TAGS\x01x"]),
                  st.sampled_from([b"\x01", b"", b"\x01\x01"]),
                  st.binary(max_size=12).map(lambda b: b.replace(b"\x02", b"")),
                  st.sampled_from([b"\x02", b"", b"\x02\x02"])),
        max_size=6),
    topic=st.sampled_from(["t", "t\x02", "t\x01", "TAGS"]),
)
def test_odd_property_bytes_are_read_alike_by_the_walk_and_the_reference(segments, topic):
    """The compiled walk finds the TAGS, UNIQ_KEY and KEYS values (tags codes, key-index
    entries) that `record.decode_properties` finds, on well-formed and odd property bytes
    (doubled separators, names without values, a separator just before the properties)."""
    raw = b"".join(name + sep + value + end for name, sep, value, end in segments)
    item = {"topic": topic, "body": b"", "queue_id": 0, "queue_offset": 0, "born_host": ("127.0.0.1", 1),
            "store_host": ("127.0.0.1", 2), "sysflag": 0, "store_timestamp": 1, "properties": raw}
    buf, _ = build_log([item, item | {"queue_offset": 1}], 100, "zeros", 8)
    check_agrees(bytes(buf), 0, len(buf), 100)
