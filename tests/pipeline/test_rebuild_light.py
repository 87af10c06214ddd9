"""`rebuild` of light queues (multi-dispatch) against the store's own dispatch: RocketMQ's file
queues byte for byte, or the key-value tables with the same contents."""

from __future__ import annotations

import random

import pytest
from pipeline_logs import SEGMENT_SIZE, UNITS_PER_FILE, assert_same_files

from tidemq.pipeline.rebuild import rebuild
from tidemq.store import Message, MessageStore, StoreConfig, record

MULTI = "INNER_MULTI_DISPATCH"
NAMES = [f"%LMQ%room-{i}" for i in range(5)] + ["%LMQ%ünïcode", "%LMQ%lone"]


def light_config(backend: str) -> StoreConfig:
    return StoreConfig(
        segment_size=SEGMENT_SIZE, consume_queue_units=UNITS_PER_FILE, light_queue_store=backend, dispatch_workers=0
    )


def light_messages(count: int, seed: int) -> list[Message]:
    """Messages to a parent topic's queues, most multi-dispatched to a few light queues; some
    transactions (a prepared one gets no unit), a name left without an offset (no prefix), plain
    messages between."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        properties = {}
        if i % 7:
            names = rng.sample(NAMES[:-1], rng.randint(1, 4))
            if i % 11 == 0:
                names.append("plain-name")
            properties[MULTI] = ",".join(names)
        if i == count - 1:
            properties[MULTI] = NAMES[-1]
        sysflag = record.TRANSACTION_PREPARED if i % 17 == 5 else record.TRANSACTION_COMMIT if i % 17 == 6 else 0
        out.append(
            Message(
                topic="parent",
                queue_id=i % 3,
                body=bytes(rng.randrange(256) for _ in range(rng.randint(0, 400))),
                tags=f"tag-{i % 4}" if i % 5 else None,
                properties=properties,
                sysflag=sysflag,
            )
        )
    return out


def write_light_store(directory, backend: str, count: int = 400, seed: int = 1):
    with MessageStore(directory, light_config(backend)) as store:
        for message in light_messages(count, seed):
            store.put(message)
        assert store.wait_dispatched(timeout=300)
    return directory


@pytest.fixture(scope="module")
def file_store(tmp_path_factory):
    """The messages written with every light queue a RocketMQ file queue."""
    return write_light_store(tmp_path_factory.mktemp("light") / "file-store", "file")


@pytest.fixture(scope="module")
def kv_store(tmp_path_factory):
    """The same messages written with the light queues in the key-value tables."""
    return write_light_store(tmp_path_factory.mktemp("light") / "kv-store", "kv")


def tables(directory) -> dict:
    """The key-value tables by queue name (queue numbers are the order queues were made in):
    each queue's row, units and consumer offsets, and the dispatched mark."""
    from tidemq.store.light.kv import GROUP_ROW, NUMBER, QUEUE_ROW, UNIT_KEY, UNIT_ROW, KvLightQueues

    kv = KvLightQueues(directory)
    try:
        with kv.env.begin() as txn:
            by_number = {}
            for key, value in txn.cursor(db=kv.queues):
                by_number[NUMBER.unpack(key)[0]] = (bytes(value[QUEUE_ROW.size :]).decode(), QUEUE_ROW.unpack_from(value))
            units: dict[str, list] = {name: [] for name, _ in by_number.values()}
            for key, value in txn.cursor(db=kv.units):
                number, offset = UNIT_KEY.unpack(key)
                units[by_number[number][0]].append((offset, *UNIT_ROW.unpack(value)))
            groups = {
                (by_number[NUMBER.unpack(key[:8])[0]][0], bytes(key[8:]).decode()): GROUP_ROW.unpack(value)
                for key, value in txn.cursor(db=kv.groups)
            }
            names = {bytes(key).decode(): NUMBER.unpack(value)[0] for key, value in txn.cursor(db=kv.names)}
        assert {name: number for number, (name, _) in by_number.items()} == names
        return {
            "queues": {name: row for name, row in by_number.values()},
            "units": units,
            "groups": groups,
            "dispatched": kv.dispatched,
        }
    finally:
        kv.close()


def without_times(found: dict) -> dict:
    """The tables' contents but the store times (two stores written at different times)."""
    return {
        "queues": {name: row[:2] for name, row in found["queues"].items()},
        "units": {name: [unit[:4] for unit in units] for name, units in found["units"].items()},
        "dispatched": found["dispatched"],
    }


def test_light_queues_rebuild_as_rocketmqs_file_queues_byte_for_byte(spark, file_store, kv_store, tmp_path):
    store = file_store
    lights = [p.name for p in (store / "consumequeue").iterdir() if p.name.startswith("%LMQ%")]
    assert len(lights) == len(NAMES)  # the rooms and the last message's lone queue
    assert any(len(list((store / "consumequeue" / name / "0").iterdir())) > 1 for name in lights)  # several files
    assert not (store / "lightqueue").exists()

    report = rebuild(spark, store, tmp_path / "out", key_index=False, partition_size=96 * 1024)  # "file": as the store's

    assert report.light_queue_store == "file" and report.light_queue_tables is None
    assert_same_files(store / "consumequeue", tmp_path / "out" / "consumequeue")
    # and on request from a store that keeps them in the tables
    rebuild(spark, kv_store, tmp_path / "out-files", key_index=False, light_queue_store="file")
    assert_same_files(store / "consumequeue", tmp_path / "out-files" / "consumequeue")
    assert not (tmp_path / "out-files" / "lightqueue").exists()


def test_light_queues_rebuild_into_the_key_value_tables_as_the_store_writes_them(spark, file_store, kv_store, tmp_path):
    store = kv_store
    expected = tables(store / "lightqueue")
    assert len(expected["queues"]) == len(NAMES) and expected["dispatched"] > 0
    assert not [p for p in (store / "consumequeue").iterdir() if p.name.startswith("%LMQ%")]

    report = rebuild(spark, store, tmp_path / "out", key_index=False, partition_size=96 * 1024)  # "kv": as the store's

    assert report.light_queue_store == "kv" and report.light_queues == len(NAMES)
    assert report.light_units == sum(len(units) for units in expected["units"].values())
    assert tables(tmp_path / "out" / "lightqueue") == expected
    assert_same_files(store / "consumequeue", tmp_path / "out" / "consumequeue")  # no light queue there
    # and on request from a store that keeps them as files
    rebuild(spark, file_store, tmp_path / "out-kv", key_index=False, light_queue_store="kv")
    assert without_times(tables(tmp_path / "out-kv" / "lightqueue")) == without_times(expected)
    assert_same_files(store / "consumequeue", tmp_path / "out-kv" / "consumequeue")


def test_rebuild_in_place_restores_damaged_tables_and_keeps_consumer_offsets(spark, tmp_path):
    store = tmp_path / "kv-store"
    write_light_store(store, "kv", count=300, seed=4)
    with MessageStore(store, light_config("kv")) as opened:
        assert opened.light_queues.commit_consumer_offset("readers", "%LMQ%room-3", 2, 1_700_000_000_000)
    pristine = tables(store / "lightqueue")
    assert pristine["groups"] == {("%LMQ%room-3", "readers"): (2, 1_700_000_000_000)}
    from tidemq.store.light.kv import KvLightQueues

    kv = KvLightQueues(store / "lightqueue")
    kv.drop_units_from("%LMQ%room-4", 3)  # units lost
    kv.close()
    assert tables(store / "lightqueue") != pristine

    report = rebuild(spark, store, in_place=True, key_index=False)

    assert report.light_queue_tables == str(store / "lightqueue")
    assert tables(store / "lightqueue") == pristine
    with MessageStore(store, light_config("kv")) as reopened:
        got = reopened.get("%LMQ%room-4", 0, 0, 1000)
        assert [m.properties[MULTI].split(",").count("%LMQ%room-4") for m in got.messages] == [1] * len(got.messages)
        assert len(got.messages) == len(pristine["units"]["%LMQ%room-4"])


def test_the_tables_need_a_local_out(spark, kv_store, tmp_path):
    with pytest.raises(ValueError, match="local"):
        rebuild(spark, kv_store, "hdfs://nowhere:9000/out", light_queue_store="kv")
    with pytest.raises(ValueError, match="local"):
        rebuild(spark, kv_store, "hdfs://nowhere:9000/out")  # the store has the tables
    # a store without light queues rebuilds to a remote output as before (its default form: files)
    from tidemq.pipeline.light_queues import light_queue_store_of

    (tmp_path / "plain" / "commitlog").mkdir(parents=True)
    assert light_queue_store_of(str(tmp_path / "plain"), None, out_is_local=False) == "file"
    assert light_queue_store_of(str(tmp_path / "plain"), None) == "kv"


def test_the_command_line_chooses_the_form(spark, kv_store, tmp_path, capsys):
    from tidemq.cli import main

    common = ["pipeline", "rebuild", "--store", str(kv_store), "--no-key-index", "--no-progress", "--master", "local[2]"]
    assert main([*common, "--out", str(tmp_path / "kv")]) == 0
    assert f"rebuilt {len(NAMES)} light queue(s)" in capsys.readouterr().out
    assert (tmp_path / "kv" / "lightqueue" / "data.mdb").is_file()
    assert main([*common, "--out", str(tmp_path / "files"), "--light-queue-store", "file"]) == 0
    assert "light queue(s)" not in capsys.readouterr().out
    assert (tmp_path / "files" / "consumequeue" / NAMES[0] / "0").is_dir()
    assert not (tmp_path / "files" / "lightqueue").exists()
    with pytest.raises(SystemExit):
        main([*common, "--out", str(tmp_path / "x"), "--light-queue-store", "rocksdb"])
